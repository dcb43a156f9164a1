"""What is timed and how: the run's precisions and modes, the timed call (:func:`make_step`), and
do_bench-style repeated timing (:func:`time_fn`: warm-up, then as many repetitions as fit ``rep_ms``, between
``min_reps`` and ``max_reps``; median, 20/80 and 25/75 percentiles, IQR)."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable

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
        return cls(median=statistics.median(ts), q20=_quantile(ts, 0.2), q80=_quantile(ts, 0.8),
                   q25=_quantile(ts, 0.25), q75=_quantile(ts, 0.75), min=ts[0], mean=statistics.fmean(ts),
                   reps=len(ts), cpu_median=statistics.median(cpu_times) if cpu_times else None)

    def as_metrics(self) -> dict[str, float | None]:
        return {"time_median_s": self.median, "time_q20_s": self.q20, "time_q80_s": self.q80,
                "time_q25_s": self.q25, "time_q75_s": self.q75, "time_iqr_s": self.iqr, "time_min_s": self.min,
                "time_mean_s": self.mean, "reps": self.reps, "cpu_time_median_s": self.cpu_median}


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolation quantile of an already sorted list."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def round_robin(fns: dict, repeats: int, warmup: int = 1) -> dict:
    """Median wall time of each callable, the callables interleaved round by round (standalone benchmark
    scripts comparing two forms in one run)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_fn(fn: Callable[[], Any], *, warmup_ms: float = 100.0, rep_ms: float = 1000.0, min_reps: int = 3,
            max_reps: int = 100, estimate_s: float | None = None, sync: Callable[[], None] | None = None
            ) -> TimingStats:
    """Time ``fn`` like ``triton.testing.do_bench``: warm up for ~``warmup_ms``, then repeat for ~``rep_ms``.

    ``estimate_s`` is the duration of one call if already known (else one untimed call measures it); ``sync``
    is called before reading the clock (``torch.cuda.synchronize`` on a GPU).
    """
    sync = sync or (lambda: None)
    if estimate_s is None:
        t0 = time.perf_counter()
        fn()
        sync()
        estimate_s = time.perf_counter() - t0
    est_ms = max(estimate_s * 1e3, 1e-3)
    for _ in range(min(int(warmup_ms / est_ms), 1000)):
        fn()
    sync()
    n = max(min_reps, min(max_reps, int(rep_ms / est_ms)))
    times, cpu = [], []
    for _ in range(n):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return TimingStats.of(times, cpu)
