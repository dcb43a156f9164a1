"""What every leaderboard is built from: one row per mechanism over its seeds, one board per setting and
device, and the cells' formatting (times, sizes, seeds with their intervals, the marks and their captions)."""

from __future__ import annotations

import math
import re
import statistics
from typing import Any, Callable, Iterable

from attnbench.results.records import Measurement
from attnbench.results.stats import seed_stats
from attnbench.views.sources import latest, machine_of


BASELINE = "softmax"   # the row every view compares against (a mechanism, not a suite)


def fit_exponent(ns: Iterable[float], costs: Iterable[float]) -> float | None:
    """Least-squares slope of log(cost) against log(N); None with fewer than two usable (positive) points."""
    pts = [(math.log(n), math.log(c)) for n, c in zip(ns, costs) if n and c and n > 0 and c > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def fmt_time(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= f:
            return f"{s / f:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_bytes(b: float | None) -> str:
    if b is None or not math.isfinite(b):
        return "-"
    sign = "-" if b < 0 else ""
    b = abs(b)
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= f:
            return f"{sign}{b / f:.3g} {unit}"
    return f"{sign}{b:.0f} B"


def fmt_n(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def label_of(r: Measurement) -> str:
    """``name`` or ``name:key=value:...`` (the ``--attn`` spelling of the spec): one table row per attention and
    options."""
    return ":".join([r.attention, *(f"{k}={v}" for k, v in sorted(r.options.items()))])


def slug(s: str) -> str:
    """``s`` as a file-name part."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", s).strip("_")


#: The mark of a row whose seeds disagree more than the test set's noise explains (:attr:`attnbench.results.stats.SeedStats.
#: disagree`).
SEED_MARK = "!"


SEED_CAPTION = ("Several seeds: mean over seeds ± the test-set interval of the mean, then (seeds ± h, n=k): the "
                "half-width h of the 95% Student t interval of the mean over the k seeds (k − 1 degrees of freedom). "
                f"{SEED_MARK} the seeds disagree more than the test set's noise explains: χ² test of homogeneity of "
                "the k seeds' accuracies, each a proportion of the same n test items, X² = Σ n (p_i − p̄)² / "
                "(p̄ (1 − p̄)) on k − 1 degrees of freedom, p < 0.05 (training variance beyond binomial sampling).")


def seed_rows(records: Iterable[Measurement], key: Callable[[Measurement], Any] | None = None,
              vary: Iterable[str] = ("seed",)) -> dict[tuple, list[Measurement]]:
    """Leaderboard rows over seeds: the latest record of each point (config hash; ``ok`` preferred), grouped by
    ``(setting, device, dtype, task, key(record))`` (``key``: the row's label, default :func:`label_of`). A group
    keeps the seeds of its latest configuration only (records whose params, ``vary`` left out, equal the newest
    record's: a preset edited since is not mixed in) and one record per seed (the latest), ordered by seed."""
    key = key or label_of
    vary = set(vary)
    groups: dict[tuple, list[Measurement]] = {}
    for r in latest(records, preferred=("ok",)):
        groups.setdefault((r.setting, r.device, r.dtype, r.task, key(r)), []).append(r)
    rank = lambda m: (m.status == "ok", m.ended_at or "", m.id or 0)  # noqa: E731
    for k, rs in groups.items():
        last = max(rs, key=rank)
        same = {a: b for a, b in last.params.items() if a not in vary}
        per_seed: dict[Any, Measurement] = {}
        for m in sorted(rs, key=rank):
            if {a: b for a, b in m.params.items() if a not in vary} == same:
                per_seed[m.seed] = m
        groups[k] = sorted(per_seed.values(), key=lambda m: (m.seed is None, m.seed or 0))
    return groups


def aggregate(records: Iterable[Measurement], metric: str = "score", *, scale: float = 100.0,
              proportion: bool = True):
    """:class:`attnbench.results.stats.SeedStats` of ``metric`` over the ``ok`` records of one row (one per seed, as
    :func:`seed_rows` gives them), or None when none has it. ``proportion``: the metric is a proportion (× ``scale``)
    of ``metrics["n_test"]`` test items (the smallest when they differ), which gives the test-set interval and the
    disagreement test."""

    ok = [r for r in records if r.status == "ok" and isinstance(r.metrics.get(metric), (int, float))]
    if not ok:
        return None
    ns = [int(r.metrics["n_test"]) for r in ok if isinstance(r.metrics.get("n_test"), (int, float))]
    n_test = min(ns) if proportion and len(ns) == len(ok) else None
    return seed_stats([r.metrics[metric] for r in ok], seeds=[r.seed for r in ok], n_test=n_test, scale=scale)


def fmt_seeds(st, digits: int = 2, test_digits: int = 1) -> str:
    """A row's figure over seeds: ``mean ± test-set half-width`` (one seed: as before seeds existed), then
    ``(seeds ± h, n=k)`` and :data:`SEED_MARK` for several seeds (see :data:`SEED_CAPTION`)."""
    if st is None:
        return "-"
    cell = f"{st.mean:.{digits}f}"
    if st.test_half is not None:
        cell += f" ± {st.test_half:.{test_digits}f}"
    if st.n > 1:
        cell += f" (seeds ± {st.half:.{digits}f}, n={st.n})" + (f" {SEED_MARK}" if st.disagree else "")
    return cell


SEED_CAPTION_VALUE = ("Several seeds: mean over seeds (seeds ± h, n=k): the half-width h of the 95% Student t "
                      "interval of the mean over the k seeds (k − 1 degrees of freedom). No test-set interval (the "
                      "figure is not a proportion of test items), so no disagreement mark.")


def seed_note(stats: Iterable[Any], proportion: bool = True) -> str:
    """The caption's seed sentence (:data:`SEED_CAPTION`; :data:`SEED_CAPTION_VALUE` for a figure that is not a
    proportion) when any of ``stats`` has several seeds, else ``""``."""
    if not any(s is not None and s.n > 1 for s in stats):
        return ""
    return f" {SEED_CAPTION if proportion else SEED_CAPTION_VALUE}"


def boards(records: Iterable[Measurement],
           preferred: Iterable[str] = ("ok",)) -> list[tuple[tuple[str, str], list[Measurement]]]:
    """The latest record of each point (:func:`latest`), grouped into one leaderboard per (setting, device), in
    order: results of different settings never share a table."""
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for r in latest(records, preferred=preferred):
        groups.setdefault((r.setting, r.device), []).append(r)
    return sorted(groups.items())


def board_title(what: str, setting: str, device: str, records: Iterable[Measurement]) -> str:
    """A leaderboard's title: what it shows, its setting and device, and the machines that measured it, each with
    its fp32 matmul GFLOP/s (:func:`machine_of`)."""
    return f"{what} — {setting} · {device} ({machine_of(records)})"


#: The mark of a timing taken while other attnbench processes ran on the same host (see attnbench.engine.sweep).
CONTENDED = "‡"


def timing_mark(r: Measurement) -> str:
    """`` ‡`` when ``r``'s timing overlapped another attnbench process on its host, else ``""``."""
    return f" {CONTENDED}" if r.metrics.get("concurrent_attnbench") else ""


def unfinished_caption(source_label: str, records: Iterable[Measurement]) -> str:
    """The caption of a table none of whose cells finished ok (an interrupted or failed run): what happened and
    what to do, instead of a caption of unknowns."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    what = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return (f"{source_label}. No cell of this table has finished ok yet ({what}): rerun the same command to resume "
            f"(finished cells are kept; the trainer resumes from its last checkpoint).")
