"""Training quality at high compression on a transformer: a small GPT-style
character-level language model, trained with AdamW on real text, on several
CPU ranks over gloo. Every method starts from the same weights and sees the
same batches; what differs is how the ranks exchange what they learned. The
measure is the validation loss (nats per character) of the model every rank
holds, at equal steps, against plain fp32 DDP, and the bytes each rank put on
the wire over the whole run (warm-up steps included).

The text: the license texts of Debian's ``base-files`` package
(/usr/share/common-licenses: GPL, LGPL, GFDL, Apache, Artistic, MPL, BSD,
CC0; about 240 kB, on every Debian and Ubuntu machine, unchanged for years),
each file split 90/10 into training and validation text. Where that folder
is missing, the text of Python's own reference (``pydoc_data.topics``, in
every CPython) stands in, and the run says so (``text`` in the JSON).

Methods (compared with fp32):

    fp32                     DDP without a hook (ring allreduce of fp32)
    torch-bf16               torch's bf16_compress_hook
    torch-fp16               torch's fp16_compress_hook
    <gradzip spec>           gradzip's DDP hook with its defaults, e.g. onebit, topk:density=0.01
    <spec>@hook:k=v,...      the hook with options: warmup=N (fixed warm-up steps),
                             algorithm=..., server=<spec>, exact=N|off|auto (layer filter),
                             adaptive=auto|on|off (the hook's defaults for Adam; auto: seen),
                             pre=auto|on|off (compress in the optimizer's units: precondition),
                             until=TOL,patience=K,wmax=N (a warm-up that ends on a measured
                             criterion: CompressionState's warmup_until; warmup=N is then its minimum)
    <spec>@cm[:k=v,...]      compressed momentum (gradzip.torch.CompressedAdamW: the 1-bit
                             Adam / 0/1 Adam family): options warmup=N (max full-precision
                             steps), min=N, tol=X (the variance criterion), server=<spec>,
                             wcodec=<spec> (the warm-up's gradient codec; none: fp32;
                             '+' for ',' inside it: fp8:block=32+ef=off),
                             refresh=R (variance refreshes R, 3R, 7R, ... steps after),
                             mode=innovation (send the change of each rank's own momentum,
                             EF21 / LoCo style), mode=update (send each rank's Adam step with
                             error feedback: DGC's momentum correction; mask=1 adds factor
                             masking, lvar=1 each rank's own variance, never frozen);
                             default mode=momentum,
                             sw=N,sws=X,stages=K (DGC's sparsity warm-up: top-k's density from
                             X, default 0.25, down to the codec's over the first N compressed
                             steps in K stages, default 4), clip=X (DGC's local gradient clipping)
    backend                  DDP without a hook over the gradzip process-group backend with its
                             default policy (gradzip.torch.backend.Policy()): a group made by
                             dist.new_group(backend="gradzip"); the wire bytes are the group's
                             compression_stats(), plus fp32 ring bytes for every gradient element
                             it kept exact (below the policy's min_elements)
    <spec>@backend[:min=N]   the same with Policy(<spec>, min_elements=N)
    <spec>@bmuf:h=H[,...]    no DDP: block momentum (gradzip.torch.BlockMomentum) around
                             AdamW, options as in the digits experiment (mu, lr, sync,
                             nesterov, ...) and: eval=ahead (evaluate the look-ahead
                             W + mu * Delta, DiLoCo's outer parameters, instead of W),
                             lrto=X (block_lr moves linearly from lr to X over the run),
                             hlate=S:H (blocks of H steps from step S on), exact=N|off (the
                             layer filter: BlockMomentum's exact_below, as @hook:exact=)
    <spec>@diloco[:h=H,...]  no DDP: torchft's DiLoCo (a replica per rank, a Manager each, rank 0
                             runs the lighthouse), inner AdamW, every H steps (default 50) the
                             model's delta averaged through gradzip's torchft group with <spec>
                             (fp32@diloco: torchft's own gloo group, uncompressed), outer SGD with
                             Nesterov (outer=0.7, mom=0.9); min=N: the policy's min_elements (_diloco.py)

    python -m gradzip.experiments.lm --ranks 4 --methods fp32,onebit,onebit@cm --plot lm.png

Time to accuracy over emulated links (_tta.py; root): --link RATE[,DELAY]
(repeatable) runs every method and seed as one job of ``gradzip-run -n RANKS
--link RATE -- python -m gradzip.experiments.lm --launched ...`` per link
(--link local: gradzip-run without emulated links). Each job first times
--exchange-steps steps of fp32 DDP with and without its gradient exchange
(DDP's no_sync): the share of fp32's step the link takes. Rank 0 records its
training seconds at every --eval-every evaluation (the clock paused while
evaluating); the report gives, per link and method, the seconds to fp32
DDP's final validation loss (same seed; the first evaluation at or below it,
else "not reached"), the speedup against fp32's own, the final loss and the
wire bytes, warm-ups included. --json holds every curve as (step, seconds,
loss), --plot draws the loss against the seconds (a panel per link), and
--exchange-only measures only the exchange share. Without --methods:
fp32, torch-fp16, backend, onebit (the hook's defaults), onebit@cm.
--device cuda and --width/--layers/--heads/--context size the run for a GPU.

    python -m gradzip.experiments.lm --exchange-only --link 100mbit --link 50mbit --link 25mbit
    python -m gradzip.experiments.lm --link 100mbit --link 25mbit --eval-every 10 \
        --json tta.json --markdown tta.md --plot tta.png

Runs are deterministic given the seed (the same losses on a loaded machine);
wall times are not.
"""

from ._cli import main, parser, settings_of
from ._core import (DEFAULT_METHODS, Corpus, Method, Result, Settings, clock, describe, draw_curves, lr_at, markdown,
                    model, plot, run, settings_args, setup, split_methods, summarize, text, train_one)
from ._tta import run_launched

__all__ = ["DEFAULT_METHODS", "Corpus", "Method", "Result", "Settings", "clock", "describe", "draw_curves", "lr_at",
           "main", "markdown", "model", "parser", "plot", "run", "run_launched", "settings_args", "settings_of",
           "setup", "split_methods", "summarize", "text", "train_one"]
