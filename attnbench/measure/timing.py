"""What is timed and how: the run's precisions and modes, the timed call (:func:`make_step`), and repeated
timing (:func:`time_fn`): Triton's ``do_bench`` on a GPU (CUDA events, the L2 cache flushed before each call); on
the CPU the same scheme by hand (warm-up, then as many calls as fit ``rep_ms``, between ``min_reps`` and
``max_reps``), because ``torch.utils.benchmark`` times blocks of calls and gives neither per-call samples within
those bounds nor their CPU time. Then median, 20/80 and 25/75 percentiles, IQR."""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Optional

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
MODES = ("fwd", "fwd+bwd")


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


def make_step(module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None):
    """The timed call: a forward under no_grad, or (``g`` given) forward and backward with output gradient g."""
    if g is not None:
        def step():
            q.grad = k.grad = v.grad = None
            module(q, k, v).backward(g)
    else:
        def step():
            with torch.no_grad():
                module(q, k, v)
    return step


@dataclasses.dataclass
class TimingStats:
    """Seconds. ``iqr`` = q75 - q25; ``q20``/``q80`` are do_bench's spread quantiles."""

    median: float
    q20: float
    q80: float
    q25: float
    q75: float
    min: float
    mean: float
    reps: int
    cpu_median: float | None = None   # process CPU seconds per call (all threads): robust to a busy machine

    @property
    def iqr(self) -> float:
        return self.q75 - self.q25

    @classmethod
    def of(cls, times: list[float], cpu_times: list[float] | None = None) -> "TimingStats":
        ts = sorted(times)
        # cut points at 5% steps, linear interpolation between order statistics (numpy's default quantile)
        cuts = statistics.quantiles(ts, n=20, method="inclusive") if len(ts) > 1 else [ts[0]] * 19
        return cls(median=statistics.median(ts), q20=cuts[3], q80=cuts[15], q25=cuts[4], q75=cuts[14], min=ts[0],
                   mean=statistics.fmean(ts), reps=len(ts),
                   cpu_median=statistics.median(cpu_times) if cpu_times else None)

    def as_metrics(self) -> dict[str, float | None]:
        return {"time_median_s": self.median, "time_q20_s": self.q20, "time_q80_s": self.q80,
                "time_q25_s": self.q25, "time_q75_s": self.q75, "time_iqr_s": self.iqr, "time_min_s": self.min,
                "time_mean_s": self.mean, "reps": self.reps, "cpu_time_median_s": self.cpu_median}


def round_robin(fns: dict, repeats: int, warmup: int = 1, clock: Callable[[], float] = time.perf_counter,
                sync: Optional[Callable[[], None]] = None) -> dict:
    """Median wall time of each callable, the callables interleaved round by round (standalone benchmark
    scripts comparing two forms in one run): interleaving is what makes their ratio fair on a machine whose load
    drifts, and the library timers time one callable at a time. ``clock=time.process_time``: this process's CPU
    seconds instead (single-threaded forms on an oversubscribed machine: the time spent waiting for a core is
    left out). ``sync`` (e.g. ``torch.cuda.synchronize``): called after each call inside the timed span, so that
    work a call queued on a device is timed with it."""
    sync = sync or (lambda: None)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            sync()
            times[name].append(clock() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_fn(fn: Callable[[], Any], *, warmup_ms: float = 100.0, rep_ms: float = 1000.0, min_reps: int = 3,
            max_reps: int = 100, estimate_s: float | None = None, cuda: bool = False) -> TimingStats:
    """Time ``fn``: warm up for about ``warmup_ms``, then repeat for about ``rep_ms``.

    On CUDA (``cuda``) this is ``triton.testing.do_bench`` (its own estimate and repetition count; no CPU time).
    On the CPU, ``estimate_s`` is the duration of one call if already known (else one untimed call measures it),
    and the repetitions are bounded by ``min_reps`` and ``max_reps``.
    """
    if cuda:
        from triton.testing import do_bench

        times_ms = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
        return TimingStats.of([ms / 1e3 for ms in times_ms])
    if estimate_s is None:
        t0 = time.perf_counter()
        fn()
        estimate_s = time.perf_counter() - t0
    est_ms = max(estimate_s * 1e3, 1e-3)
    for _ in range(min(int(warmup_ms / est_ms), 1000)):
        fn()
    n = max(min_reps, min(max_reps, int(rep_ms / est_ms)))
    times, cpu = [], []
    for _ in range(n):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return TimingStats.of(times, cpu)
