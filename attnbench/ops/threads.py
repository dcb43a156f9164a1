"""How many torch threads a many-op CPU path should use right now."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch


def _others_running() -> int | None:
    """Runnable tasks on the machine now that are not this process's threads (``/proc/loadavg`` minus our own
    threads in state R, e.g. OpenMP workers still spinning); None where /proc cannot tell."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        if running <= 1:                                                      # only this thread
            return 0
        ours = 0
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            ours += stat[stat.rindex(")") + 2] == "R"
        return max(0, running - ours)
    except (OSError, ValueError, IndexError):
        return None


_FIXED = 0  # > 0 inside fixed_threads(): never adapt


@contextlib.contextmanager
def fixed_threads() -> Iterator[None]:
    """Within the block :func:`threads_for_load` keeps the thread count as it is. The trainer runs under it: a
    different thread count can change a reduction's order and so the last bits of a result, and a resumed run
    must end bit-identical to an uninterrupted one whatever else the machine was doing."""
    global _FIXED
    _FIXED += 1
    try:
        yield
    finally:
        _FIXED -= 1


@contextlib.contextmanager
def threads_for_load() -> Iterator[int]:
    """Run the block with no more torch threads than there are idle CPUs (at least 1) when some CPUs are busy
    and some idle; yields the count.

    The blocked forms issue many cache-sized ops, each a parallel region whose barrier waits for every thread:
    when another process holds a core, each region waits for a descheduled thread to get a time slice, and the
    blocked path slowed ~20x where one large op per step slowed far less (benchmarks/bench_contention.py). On
    the CPUs left idle, no region ever waits for a thread that cannot run. Used by the blocked linear attention
    and the chunked delta rule (their loops of small ops)."""
    want = torch.get_num_threads()
    if _FIXED:
        yield want
        return
    others = _others_running() if want > 1 else None
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or want
    # Some CPUs idle: a thread on a shared CPU holds up every region's barrier while the others wait on idle CPUs,
    # so use only the idle ones (measured: one busy process on two cores, 1 thread degraded 1.7x and 2 threads
    # 8x). Every CPU shared: one thread. More threads would get a larger share of the CPUs, but each region's
    # barrier then waits for whichever thread the scheduler has not run, and how much that costs depends on the
    # machine: with two busy processes on two cores, 2 threads degraded 2.2x against 1 thread's 3.2x on an Intel
    # Xeon, but 3.7-5.5x (single runs up to 16x) against 2.1-3.1x on an AMD EPYC. One thread bounds the loss by
    # the share of the CPUs given up; a probe of a few parallel ops did not predict the stalls (measured).
    use = want if others is None else max(1, min(want, cpus - others))
    with _threads(use):
        yield use


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """Run the block on ``n`` torch threads, the count restored afterwards (nothing done when it is already n)."""
    want = torch.get_num_threads()
    if n == want:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(want)


@contextlib.contextmanager
def one_thread(active: bool = True) -> Iterator[None]:
    """Run the block on one torch thread (where ``active``). For LAPACK's batched small triangular solves: ATen
    solves them matrix by matrix, each call a parallel region too small to split. Measured on a 2-core AMD EPYC
    (AVX2): 64 unit-triangular 64 x 64 solves with 128 right-hand sides took 1.4-3.5x longer on two threads than
    on one. The count does not depend on the machine's load, so results stay reproducible."""
    with _threads(1 if active else torch.get_num_threads()):
        yield
