"""Outside baselines gradzip is measured against, as programs run under a
launcher (gradzip-run, torchrun); each needs torch, not gradzip's extension.

- :mod:`gradzip.baselines.gloo_allreduce`: torch.distributed's gloo
  allreduce, timed as gradzip-bench times its rows (gradzip-sweep's gloo rows).
"""
