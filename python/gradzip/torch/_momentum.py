"""Momentum correction of the DDP hook (DGC's, Lin et al. 2018) for a
non-adaptive optimizer with momentum (torch's SGD): what onebit and top-k
with error feedback compress is the rank's local momentum, not its gradient.

Plain error feedback under momentum SGD delays part of every step's
gradient; the optimizer's momentum then keeps pushing the delayed parts, and
the repayments arrive out of phase with it: on digits at 16 ranks onebit's
accuracy swung 10-20 points from step to step near the end of the run
(BENCHMARKS.md section 11, "digits under auto at 8 and 16 ranks").

Per rank and per gradient element, with the optimizer's momentum beta:

    u_t = beta u_{t-1} + g_t          the local momentum (what goes into the codec,
                                      whose error feedback keeps the residual)
    S_t = average over ranks of the decoded payloads of u_t
    out_t = S_t - beta S_{t-1}        what the hook returns as the gradient

The optimizer's momentum m_t = beta m_{t-1} + out_t is then S_t (up to a
term beta^t m_0 that decays), so the model moves by lr x the averaged
compressed momentum, as in DGC. S_t is bit-identical on every rank, so is
out_t. u and S_{t-1} start at zero at the first compressed step (after any
warm-up). They are kept per parameter (by the tracker's keys), so they
follow DDP's bucket rebuilds, and are saved in the hook's state_dict.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

# A bucket's parameter keys -> (u, S_prev), flat float32, in the bucket's order.
Flat = Tuple[torch.Tensor, torch.Tensor]


def optimizer_momentum(optimizer: Any, params: set) -> Optional[float]:
    """The momentum of `optimizer`'s groups that hold any of the parameter ids
    in `params`, when the correction applies: torch's SGD-style groups
    (``momentum`` in the group), one momentum in (0, 1) for all of them, no
    Nesterov. None otherwise (no momentum, Nesterov, different momenta)."""
    found = set()
    for g in optimizer.param_groups:
        if not any(id(p) in params for p in g["params"]):
            continue
        if "momentum" not in g or g.get("nesterov", False) or "betas" in g:
            return None
        found.add(float(g["momentum"]))
    if len(found) != 1:
        return None
    beta = found.pop()
    return beta if 0.0 < beta < 1.0 else None


class MomentumCorrection:
    """The correction's state: beta, and u and S_prev per bucket layout."""

    def __init__(self, beta: float) -> None:
        self.beta = float(beta)
        self.flats: Dict[Tuple[int, ...], Flat] = {}
        self.loose: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (u, S_prev): restored or re-laid
        self._numels: Dict[Tuple[int, ...], List[int]] = {}

    def _flat(self, keys: Tuple[int, ...], numels: List[int], like: torch.Tensor) -> Flat:
        got = self.flats.get(keys)
        if got is not None and got[0].device == like.device:
            return got
        # A new layout (DDP rebuilt its buckets, or a restored state): the parameters' u and S_prev follow them.
        mine = set(keys)
        for ks in [ks for ks in self.flats if mine & set(ks)]:
            u, s = self.flats.pop(ks)
            off = 0
            for k, m in zip(ks, self._numels.pop(ks)):
                self.loose[k] = (u[off:off + m].clone(), s[off:off + m].clone())
                off += m
        n = sum(numels)
        u = torch.zeros(n, dtype=torch.float32, device=like.device)
        s = torch.zeros(n, dtype=torch.float32, device=like.device)
        off = 0
        for k, m in zip(keys, numels):
            old = self.loose.pop(k, None)
            if old is not None and old[0].numel() == m:
                u[off:off + m].copy_(old[0])
                s[off:off + m].copy_(old[1])
            off += m
        self.flats[keys] = (u, s)
        self._numels[keys] = list(numels)
        return u, s

    def before(self, keys: Tuple[int, ...], numels: List[int], buffer: torch.Tensor) -> Flat:
        """u = beta u + g; the bucket then holds u (what the codec compresses)."""
        u, s = self._flat(keys, numels, buffer)
        u.mul_(self.beta).add_(buffer)
        buffer.copy_(u)
        return u, s

    def after(self, flat: Flat, averaged: torch.Tensor) -> torch.Tensor:
        """averaged = S_t (every rank's the same): returns S_t - beta S_{t-1} in it; keeps S_t."""
        _, s = flat
        now = averaged.to(torch.float32)
        out = now - self.beta * s
        s.copy_(now)
        averaged.copy_(out)
        return averaged

    def state_dict(self) -> Dict[str, Any]:
        keys: List[int] = []
        u_list: List[torch.Tensor] = []
        s_list: List[torch.Tensor] = []
        for ks, (u, s) in self.flats.items():
            off = 0
            for k, m in zip(ks, self._numels[ks]):
                keys.append(k)
                u_list.append(u[off:off + m].clone())
                s_list.append(s[off:off + m].clone())
                off += m
        for k, (u, s) in self.loose.items():
            keys.append(k)
            u_list.append(u.clone())
            s_list.append(s.clone())
        order = sorted(range(len(keys)), key=lambda i: keys[i])
        return {"beta": self.beta, "keys": [keys[i] for i in order], "u": [u_list[i] for i in order],
                "s": [s_list[i] for i in order]}

    @classmethod
    def from_state(cls, d: Any) -> "MomentumCorrection":
        try:
            mc = cls(float(d["beta"]))
            keys, us, ss = list(d["keys"]), list(d["u"]), list(d["s"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"the state_dict's momentum_correction is malformed: {d!r:.120}") from None
        if not 0.0 < mc.beta < 1.0 or not (len(keys) == len(us) == len(ss)):
            raise ValueError("the state_dict's momentum_correction is malformed (beta or lengths)")
        for k, u, s in zip(keys, us, ss):
            if (not isinstance(k, int) or isinstance(k, bool) or not isinstance(u, torch.Tensor)
                    or not isinstance(s, torch.Tensor) or u.shape != s.shape or u.dim() != 1
                    or not bool(torch.isfinite(u).all()) or not bool(torch.isfinite(s).all())):
                raise ValueError("the state_dict's momentum_correction holds a bad entry")
            mc.loose[k] = (u.to(torch.float32).clone(), s.to(torch.float32).clone())
        return mc
