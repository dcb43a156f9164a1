"""Measuring one attention at one shape: the pieces, each usable on its own.

- :mod:`.flops` — FLOPs of one call (``FlopCounterMode``, with the CPU SDPA kernels counted).
- :mod:`.timing` — the run's precisions and modes, the timed call (``make_step``) and do_bench-style timing.
- :mod:`.memory` — the two memory meters: tensor storages alive at once (the primary figure, the same on any
  machine) and the process's peak RSS (or CUDA's peak allocation) of a first call.
- :mod:`.isolation` — a measurement in a fresh child process, with a time limit, a memory budget and
  out-of-memory detection.

The correctness gate before any timing is :func:`attnbench.checks.verify.verify_resolved` (the one verification); a
point that fails it is recorded ``incorrect`` and never timed.
"""
