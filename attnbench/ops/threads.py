"""Thread counts inside ops: none chosen by the machine's load.

How many torch threads a run uses is a run parameter, set once by the runner
(:func:`attnbench.engine.sweep.run_sweep`'s ``threads``) and recorded with every result (:meth:`attnbench.results.store.Run.record`);
no op reads the machine's load or keeps a count it changed. How the forms behave when other processes share the
CPUs is a study for ``benchmarks/bench_contention.py``, not a policy of the ops. What stays here is a change that
does not depend on the machine and is undone on exit: :func:`one_thread`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def one_thread(active: bool = True) -> Iterator[None]:
    """Run the block on one torch thread (where ``active``), the caller's count restored on exit, also on an
    error. For LAPACK's batched small triangular solves (the delta rule's chunk inverse, ops/delta.py): ATen
    solves them matrix by matrix, each call a parallel region too small to split, so further threads add only
    their synchronisation (``benchmarks/bench_delta_rule.py`` times the op). The count is fixed, not read from
    the machine, so the result does not depend on what else runs."""
    want = torch.get_num_threads()
    if not active or want == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(want)
