"""Experiment harness: digits with hook kwargs in the method name: spec[/algo]|k=v|k=v."""
import json, sys, argparse, os
import gradzip.experiments.digits as D

_orig_setup = D._setup

def _kw(opts):
    kw = {}
    for o in opts:
        k, _, v = o.partition("=")
        try:
            v = json.loads(v)
        except Exception:
            pass
        kw[k] = v
    return kw

def _mc_wrap(m, beta, mask):
    import torch
    from gradzip.torch import compression_hook
    st = {}
    def hook(state, bucket):
        buf = bucket.buffer(); k = bucket.index()
        u, prev = st.get(k, (None, None))
        if u is None or u.numel() != buf.numel():
            u = torch.zeros_like(buf); prev = torch.zeros_like(buf)
        u.mul_(beta).add_(buf)
        buf.copy_(u)
        fut = compression_hook(state, bucket)
        def after(f):
            t = f.value()
            new = t - beta * prev
            prev.copy_(t)
            t.copy_(new)
            return t
        st[k] = (u, prev)
        return fut.then(after)
    return hook

def _setup(method, model, seed, settings):
    global _MASK
    _MASK = 0
    base, *opts = method.split("|")
    if not opts:
        return _orig_setup(method, model, seed, settings)
    import gradzip.torch as GT
    kw = _kw(opts)
    mc = kw.pop("mc", None)
    if mc is not None:
        orig_reg = None
        import torch.nn.parallel as P
        origDDP = P.DistributedDataParallel.register_comm_hook
        def reg(self, state, hook):
            return origDDP(self, state, _mc_wrap(None, settings.momentum, mc))
        P.DistributedDataParallel.register_comm_hook = reg
        try:
            m = _setup("|".join([base] + [f"{k}={json.dumps(v)}" for k, v in kw.items()] + ["_=0"]), model, seed, settings)
        finally:
            P.DistributedDataParallel.register_comm_hook = origDDP
        return m
    kw.pop("_", None)
    _MASK = kw.pop("mask", 0)
    orig = GT.CompressionState
    GT.CompressionState = lambda **a: orig(**{**a, **kw})
    try:
        return _orig_setup(base, model, seed, settings)
    finally:
        GT.CompressionState = orig

D._setup = _setup
_MASK = 0
import gradzip.torch._momentum as _M
_orig_after = _M.MomentumCorrection.after
def _after(self, flat, averaged):
    out = _orig_after(self, flat, averaged)
    if _MASK:
        u, s = flat
        u.masked_fill_(s != 0, 0.0)   # s now holds S_t: coordinates some rank sent
    return out
_M.MomentumCorrection.after = _after

def worker(*a):
    return D._worker(*a)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--methods", required=True)
    ap.add_argument("--json")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=0)
    args = ap.parse_args()
    methods = args.methods.split(";")
    seeds = [int(s) for s in args.seeds.split(",")]
    settings = D.Settings(batch_per_rank=args.batch, eval_every=args.eval_every)
    results = D._run_ranks(worker, "digits", args.ranks, (methods, seeds, settings), 7200)
    rows = D.summarize(results)
    print(D.markdown(rows, args.ranks, settings))
    if args.json:
        json.dump({"ranks": args.ranks, "results": results, "summary": rows}, open(args.json, "w"), indent=1)

if __name__ == "__main__":
    main()
