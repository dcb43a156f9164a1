"""``attnbench compare A B``: two sets of results side by side, cell by cell, each difference with its significance.

The two sides: two results stores (or ``.jsonl`` exports), or the records of two commits in one store
(``--commits X,Y``), or of two machines in one store (``--machines M1,M2``, the recorded device names). A *cell* is
a point's identity minus its provenance and its seed: suite, setting, task, attention and options, dtype, device
and the params other than ``seed`` (so a cell's seeds are pooled, and the commit, machine and packages that
measured it are not part of it). Each side keeps the latest record of each point (``ok`` preferred).

Per cell and metric (those both sides recorded):

- accuracy (``score`` with ``n_test``: a proportion of the test set): with at least two seeds on each side, Welch's
  t-test on the seeds' values (the seed interval); otherwise the two-proportion z-test on the test-set counts of
  the two means (:func:`attnbench.results.stats.two_proportion_p`);
- test perplexity: Welch's test over seeds when both sides have two or more, else no test (no test-set interval);
- time (``time_median_s``, timed with repeats: :mod:`attnbench.measure.timing`): the ratio B / A against the repeat
  noise of each side: the standard error of a median, 1.2533 σ / sqrt(reps) with σ = IQR / 1.349, relative to
  the median, combined in quadrature on the log scale (z test); with several seeds per side, the spread of the
  seeds' log medians instead;
- throughput of a training run (samples, images or tokens per second: one figure per run, no repeats): Welch's test
  on the log values when both sides have two or more seeds, else no test.

A difference is *significant* at p < 0.05. ``--threshold PCT`` makes the command fail (exit 1) when any cell is
significantly worse on B by more than PCT percent of A's value (slower, lower accuracy, higher perplexity), and
names those cells; without it the command reports and exits 0.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any, Iterable, Optional

from attnbench.core.errors import AttnbenchError
from attnbench.results import provenance
from attnbench.results.records import Measurement, read_jsonl
from attnbench.results.stats import (PairSpread, Z95, one_seed_line, seed_projection, two_proportion_p,
                                     welch_p)
from attnbench.results.store import Store
from attnbench.views.rows import fmt_time, label_of
from attnbench.views.sources import latest

ALPHA = 0.05


@dataclasses.dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool
    kind: str  # "proportion" | "value" | "timing" | "rate"


METRICS = (
    Metric("score", "accuracy %", True, "proportion"),
    Metric("test_ppl", "test ppl", False, "value"),
    Metric("time_median_s", "time", False, "timing"),
    Metric("train_samples_per_s", "train samples/s", True, "rate"),
    Metric("train_images_per_s", "train images/s", True, "rate"),
    Metric("train_tokens_per_s", "train tokens/s", True, "rate"),
    Metric("infer_images_per_s", "infer images/s", True, "rate"),
)


@dataclasses.dataclass
class Side:
    label: str
    records: list[Measurement]


@dataclasses.dataclass
class Difference:
    """One cell's metric on both sides. ``change``: (B − A) / A; ``worse``: how much worse B is, as a fraction of
    A (negative: better); ``p``: the test's p-value (None: no noise to test against); ``noise``: the 95% half-width
    of the difference, relative to A (None when not tested)."""

    cell: str
    metric: Metric
    a: float
    b: float
    n_a: int
    n_b: int
    p: Optional[float]
    noise: Optional[float]
    test: str
    note: str = ""
    spread: Optional[PairSpread] = None   # A − B as the seeds show it, when the test is Welch's over seeds

    @property
    def change(self) -> float:
        return (self.b - self.a) / self.a if self.a else math.inf

    @property
    def worse(self) -> float:
        return -self.change if self.metric.higher_is_better else self.change

    @property
    def significant(self) -> bool:
        return self.p is not None and self.p < ALPHA

    def regression(self, threshold_pct: float) -> bool:
        return self.significant and 100 * self.worse > threshold_pct

    @property
    def verdict(self) -> str:
        if self.p is None:
            return "not tested"
        if not self.significant:
            return "within noise"
        if self.metric.kind in ("timing", "rate"):
            return "slower" if self.worse > 0 else "faster"
        return "worse" if self.worse > 0 else "better"


# --- the two sides ------------------------------------------------------------------------------------------------
def load_records(path: str | Path) -> list[Measurement]:
    """The records of a results store (``.db``, any SQLite file) or of a ``.jsonl`` export."""
    p = Path(path).expanduser()
    if not p.exists():
        raise AttnbenchError(f"{path}: no such file (give a results store .db or a .jsonl export)")
    if p.is_dir():
        raise AttnbenchError(f"{path}: is a directory (give a results store .db or a .jsonl export)")
    if p.suffix.lower() == ".jsonl":
        try:
            return read_jsonl(p)
        except (ValueError, OSError) as e:
            raise AttnbenchError(str(e)) from None
    with Store(p, readonly=True) as store:
        return store.measurements()


def by_commits(records: list[Measurement], commits: list[str]) -> tuple[Side, Side]:
    """Two sides of one store: the records of commit ``X`` and of commit ``Y`` (full hashes or unique prefixes)."""
    if len(commits) != 2:
        raise AttnbenchError(f"--commits takes two commits X,Y, got {','.join(commits) or 'none'}")
    have = sorted({r.git_commit for r in records if r.git_commit})
    sides = []
    for c in commits:
        match = [h for h in have if h.startswith(c.strip())]
        if len(match) != 1:
            listed = ", ".join(h[:10] for h in have) or "none"
            raise AttnbenchError(f"--commits: {c!r} matches {len(match)} commits of the store (it has {listed})")
        sides.append(Side(f"commit {match[0][:10]}", [r for r in records if r.git_commit == match[0]]))
    return sides[0], sides[1]


def by_machines(records: list[Measurement], machines: list[str]) -> tuple[Side, Side]:
    """Two sides of one store: the records of two machines, by recorded device name (exact, else a unique
    case-insensitive part of one)."""
    if len(machines) != 2:
        raise AttnbenchError(f"--machines takes two machine names M1,M2, got {','.join(machines) or 'none'}")
    have = sorted({r.device_name for r in records if r.device_name})
    sides = []
    for m in machines:
        m = m.strip()
        match = [h for h in have if h == m] or [h for h in have if m.lower() in h.lower()]
        if len(match) != 1:
            listed = "; ".join(have) or "none recorded"
            raise AttnbenchError(f"--machines: {m!r} matches {len(match)} machines of the store ({listed})")
        sides.append(Side(match[0], [r for r in records if r.device_name == match[0]]))
    if sides[0].label == sides[1].label:
        raise AttnbenchError(f"--machines: both names mean {sides[0].label}")
    return sides[0], sides[1]


# --- cells ----------------------------------------------------------------------------------------------------
def cell_key(r: Measurement) -> str:
    """A cell's identity: the point's identity without its seed (and, like the point's, without provenance)."""
    params = {k: v for k, v in r.params.items() if k != "seed"}
    return provenance.config_hash({"suite": r.suite, "setting": r.setting, "task": r.task, "attention": r.attention,
                                   "options": r.options, "params": params, "dtype": r.dtype, "device": r.device})


def cells(records: Iterable[Measurement], suite: Optional[str] = None) -> dict[str, list[Measurement]]:
    """The ``ok`` records of each cell (one per seed: the latest record of each point)."""
    out: dict[str, dict[Any, Measurement]] = {}
    for r in sorted(latest(records, preferred=("ok",)), key=lambda m: (m.ended_at or "", m.id or 0)):
        if r.status == "ok" and (suite is None or r.suite == suite):
            out.setdefault(cell_key(r), {})[r.seed] = r
    return {k: list(v.values()) for k, v in out.items()}


def cell_names(groups: dict[str, list[Measurement]]) -> dict[str, str]:
    """``suite · setting · task · spec`` per cell, with the params that tell apart cells that would otherwise
    share a name (e.g. ``seq_len=4096`` of a scaling point)."""

    base = {k: f"{rs[0].suite} · {rs[0].setting} · {rs[0].task} · {label_of(rs[0])}"
            + (f" · {rs[0].dtype}" if rs[0].dtype and rs[0].dtype != "float32" else "") for k, rs in groups.items()}
    names = {}
    for k, rs in groups.items():
        twins = [groups[j][0] for j in groups if base[j] == base[k]]
        params = {p: v for p, v in rs[0].params.items() if p != "seed"}
        differ = [p for p in sorted(params) if len({provenance.canonical_json(t.params.get(p)) for t in twins}) > 1]
        names[k] = base[k] + "".join(f" · {p}={params[p]}" for p in differ)
    return names


# --- the tests ----------------------------------------------------------------------------------------------------
def _values(rs: list[Measurement], key: str) -> list[float]:
    return [float(r.metrics[key]) for r in rs if isinstance(r.metrics.get(key), (int, float))
            and not isinstance(r.metrics.get(key), bool)]


def _timing_rel_se(rs: list[Measurement]) -> Optional[float]:
    """The relative standard error of one side's time: over seeds (two or more) the spread of the log medians,
    else the repeat noise of its one median (IQR and repeats)."""
    meds = _values(rs, "time_median_s")
    if len(meds) >= 2 and all(m > 0 for m in meds):
        return statistics.stdev(math.log(m) for m in meds) / math.sqrt(len(meds))
    m = rs[0].metrics
    iqr, reps, med = m.get("time_iqr_s"), m.get("reps"), m.get("time_median_s")
    if iqr is None and m.get("time_q75_s") is not None and m.get("time_q25_s") is not None:
        iqr = m["time_q75_s"] - m["time_q25_s"]
    if not (isinstance(iqr, (int, float)) and isinstance(reps, (int, float)) and reps >= 2 and med):
        return None
    return 1.2533 * (iqr / 1.349) / math.sqrt(reps) / med


def _spread(a: list[float], b: list[float]) -> PairSpread:
    return PairSpread(statistics.fmean(a) - statistics.fmean(b), statistics.stdev(a), statistics.stdev(b), len(a),
                      len(b))


def difference(name: str, metric: Metric, ra: list[Measurement], rb: list[Measurement]) -> Optional[Difference]:
    """The difference of ``metric`` between the two sides of one cell, or None when a side lacks it."""
    a, b = _values(ra, metric.key), _values(rb, metric.key)
    if not a or not b:
        return None
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    p = noise = spread = None
    test = "no noise recorded"
    if metric.kind == "proportion":
        na = [int(r.metrics["n_test"]) for r in ra if isinstance(r.metrics.get("n_test"), (int, float))]
        nb = [int(r.metrics["n_test"]) for r in rb if isinstance(r.metrics.get("n_test"), (int, float))]
        if not na or not nb:
            return None  # a score that is not a proportion of a test set (e.g. a perplexity): see test_ppl
        # seeds that all agree (e.g. one model evaluated at every seed) say nothing of the noise: the test set does
        if len(a) >= 2 and len(b) >= 2 and statistics.variance(a) + statistics.variance(b) > 0:
            p, test, spread = welch_p(a, b), f"Welch t over seeds ({len(a)} vs {len(b)})", _spread(a, b)
            se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
        else:
            n1, n2 = min(na), min(nb)
            p, test = two_proportion_p(ma / 100, n1, mb / 100, n2), f"two-proportion z (n = {n1} vs {n2})"
            se = 100 * math.sqrt((ma / 100) * (1 - ma / 100) / n1 + (mb / 100) * (1 - mb / 100) / n2)
        noise = Z95 * se / ma if ma else None
    elif metric.kind == "value":
        if len(a) >= 2 and len(b) >= 2:
            p, test, spread = welch_p(a, b), f"Welch t over seeds ({len(a)} vs {len(b)})", _spread(a, b)
            se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
            noise = Z95 * se / ma if ma else None
        else:
            test = "one seed a side: no test-set interval"
    elif metric.kind == "timing":
        sa, sb = _timing_rel_se(ra), _timing_rel_se(rb)
        if sa is not None and sb is not None and ma > 0 and mb > 0:
            se = math.sqrt(sa * sa + sb * sb)
            z = math.log(mb / ma) / se if se > 0 else (math.inf if mb != ma else 0.0)
            p = math.erfc(abs(z) / math.sqrt(2)) if math.isfinite(z) else 0.0
            noise, test = math.expm1(Z95 * se), "log ratio vs repeat noise" + (" (over seeds)" if min(len(a), len(b)) >= 2
                                                                               else " (IQR, reps)")
    elif metric.kind == "rate":
        if len(a) >= 2 and len(b) >= 2 and min(a + b) > 0:
            la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
            p, test = welch_p(la, lb), f"Welch t on log rates over seeds ({len(a)} vs {len(b)})"
            spread = _spread(la, lb)
            se = math.sqrt(statistics.variance(la) / len(la) + statistics.variance(lb) / len(lb))
            noise = math.expm1(Z95 * se)
        else:
            test = "one run a side: no repeat noise"
    loaded = any(r.metrics.get("concurrent_attnbench") for r in ra + rb) and metric.kind in ("timing", "rate")
    return Difference(name, metric, ma, mb, len(a), len(b), p, noise, test,
                      note="‡ timed under load" if loaded else "", spread=spread)


# --- does a leaderboard tell its rows apart? ----------------------------------------------------------------------
def holm(pvalues: list[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down procedure: which of the hypotheses are rejected with a family-wise error rate of ``alpha``.
    Written here because scipy.stats has none (its ``false_discovery_control`` controls a different rate)."""
    m = len(pvalues)
    reject = [False] * m
    for rank, i in enumerate(sorted(range(m), key=pvalues.__getitem__)):
        if pvalues[i] > alpha / (m - rank):
            break
        reject[i] = True
    return reject


@dataclasses.dataclass(frozen=True)
class Separation:
    """How many pairs of a leaderboard's rows differ significantly (compare's test of each pair, Holm-corrected),
    and what more seeds would tell apart: ``spreads``, the pairs tested by Welch's t over seeds (their labels in
    ``labels``), projected by :func:`attnbench.results.stats.seed_projection`; ``one_seed``: the pairs with a row of
    one seed of a figure that seeds move (its interval is the test set's alone)."""

    separated: int
    pairs: int                  # pairs that could be tested
    untested: int               # pairs without noise to test against (one seed and no test-set size)
    tests: tuple[str, ...]
    spreads: tuple[PairSpread, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    one_seed: int = 0           # pairs of a figure seeds move with one seed on a side
    rows: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    metric: Optional[Metric] = None
    apart: frozenset = frozenset()  # the pairs (a, b) separated

    def line(self, what: str = "") -> str:
        where = f"{what}: " if what else ""
        if self.pairs == 0:
            return f"{where}no pair of rows can be tested (one seed a row and no test-set size)."
        text = (f"{self.separated} of {self.pairs} pairs separated ({'; '.join(self.tests)}; Holm-corrected, "
                f"{ALPHA})" + (f", {self.untested} untestable" if self.untested else ""))
        text = f"{where}{text}" + (": this table does not tell its rows apart." if self.separated == 0 else ".")
        return f"{text} {self.seeds_line()}".rstrip()

    def seeds_line(self) -> str:
        """What more seeds would tell apart (several seeds a row), or what one seed a row cannot say; "" for a
        figure that seeds do not move (a timing's repeats)."""
        projection = seed_projection(list(self.spreads))
        if projection is None:
            return one_seed_line() if self.one_seed else ""
        return projection.line() + (f" Pairs with a row of one seed ({self.one_seed} of them) are not projected: "
                                    f"that row's spread is unmeasured." if self.one_seed else "")


#: The separations computed while it is set (``attnbench plan`` reads the leaderboards' own through it).
_RECORDED: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("separations", default=None)


@contextlib.contextmanager
def recorded_separations():
    """Within it, every :func:`separation` a view computes is appended to the list it yields (one place computes the
    pairs a table tests; the planner sizes a run on those, not on rows of its own)."""
    out: list[Separation] = []
    token = _RECORDED.set(out)
    try:
        yield out
    finally:
        _RECORDED.reset(token)


def separation(rows: dict[str, list[Measurement]], metric: Metric) -> Separation:
    """Every pair of ``rows`` (a row's records: one per seed) tested as ``compare`` tests a cell's two sides."""
    labels = sorted(rows)
    ps, tests, untested, spreads, pairs, one_seed, tested = [], set(), 0, [], [], 0, []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            d = difference(f"{a} vs {b}", metric, rows[a], rows[b])
            if d is not None and d.metric.kind in ("proportion", "value") and min(d.n_a, d.n_b) < 2:
                one_seed += 1
            if d is not None and d.spread is not None:
                spreads.append(d.spread)
                pairs.append((a, b))
            if d is None or d.p is None:
                untested += 1
                continue
            ps.append(d.p)
            tested.append((a, b))
            tests.add(d.test.split(" (")[0])
    reject = holm(ps)
    sep = Separation(sum(reject), len(ps), untested, tuple(sorted(tests)), tuple(spreads), tuple(pairs), one_seed,
                     rows, metric, frozenset(ab for ab, r in zip(tested, reject) if r))
    recorded = _RECORDED.get()
    if recorded is not None:
        recorded.append(sep)
    return sep


def metric(key: str) -> Metric:
    return next(m for m in METRICS if m.key == key)


def score_p(a: list[Measurement], b: list[Measurement]) -> Optional[float]:
    """The p-value of two rows' test accuracy (a row's records: one per seed) differing, tested as ``compare`` tests
    a cell: Welch's t over seeds when both rows have two or more, else the two-proportion z on the means' test-set
    counts (:func:`difference`); None when a row has no score. What the tables' ≈ marks read, so that a mark and
    the separation line never use two tests."""
    d = difference("", metric("score"), a, b)
    return None if d is None else d.p


SCORE_TEST = ("Welch's t over seeds where both rows have two or more, else the two-proportion test of the means on "
              "the test set")


@dataclasses.dataclass
class Comparison:
    a: Side
    b: Side
    differences: list[Difference]
    only_a: int
    only_b: int

    def regressions(self, threshold_pct: float) -> list[Difference]:
        return [d for d in self.differences if d.regression(threshold_pct)]


def compare(a: Side, b: Side, suite: Optional[str] = None) -> Comparison:
    """Every cell both sides measured, every metric both recorded: :class:`Difference` s, largest change first."""
    ca, cb = cells(a.records, suite), cells(b.records, suite)
    common = {k: ca[k] for k in ca if k in cb}
    names = cell_names({**cb, **ca})
    diffs = []
    for k in common:
        for metric in METRICS:
            d = difference(names[k], metric, ca[k], cb[k])
            if d is not None:
                diffs.append(d)
    diffs.sort(key=lambda d: (-abs(d.change) if math.isfinite(d.change) else -math.inf, d.cell, d.metric.key))
    return Comparison(a, b, diffs, only_a=len(set(ca) - set(cb)), only_b=len(set(cb) - set(ca)))


# --- rendering ----------------------------------------------------------------------------------------------------
def _fmt(v: float, metric: Metric) -> str:
    if metric.kind == "timing":
        return fmt_time(v)
    if metric.kind == "rate":
        return f"{v:.4g}"
    return f"{v:.2f}"


def tables(cmp: Comparison, threshold_pct: Optional[float] = None) -> list:
    """The comparison as :data:`attnbench.views.render.TableData`: accuracy-like metrics, then speed."""
    out = []
    groups = (("accuracy", ("proportion", "value")), ("speed", ("timing", "rate")))
    for what, kinds in groups:
        ds = [d for d in cmp.differences if d.metric.kind in kinds]
        if not ds:
            continue
        rows = []
        for d in ds:
            flag = " ✗" if threshold_pct is not None and d.regression(threshold_pct) else ""
            rows.append([d.cell, d.metric.label, f"{_fmt(d.a, d.metric)} (n={d.n_a})",
                         f"{_fmt(d.b, d.metric)} (n={d.n_b})", f"{100 * d.change:+.1f}%",
                         "-" if d.noise is None else f"±{100 * d.noise:.1f}%",
                         "-" if d.p is None else f"{d.p:.2g}", d.verdict + flag, d.test + (f"; {d.note}" if d.note
                                                                                        else "")])
        cap = (f"A = {cmp.a.label}; B = {cmp.b.label}. Change: (B − A) / A, largest first; n: seeds. Noise: the 95% "
               f"half-width of the difference relative to A; p: the test named in the last column (p < {ALPHA} "
               f"is a significant difference; 'not tested': no noise recorded to test against). "
               + ("Accuracy: Welch's t over seeds when both sides have two or more, else the two-proportion z-test "
                  "on the test-set counts; perplexity: Welch's t over seeds. " if what == "accuracy" else
                  "Time: the log ratio against the repeat noise of each side's median (σ = IQR/1.349, SE = "
                  "1.2533 σ/√reps), or the seeds' spread: the noise within each run, not the drift of the machine "
                  "between runs (two runs of the same code may differ by several percent with p far below 0.05: "
                  "set --threshold above that drift); training throughput: Welch's t on log rates over seeds. "
                  "‡: timed while other attnbench processes ran (not comparable). ")
               + (f"✗: significantly worse by more than {threshold_pct:g}% (--threshold). "
                  if threshold_pct is not None else "")
               + f"Cells only in A: {cmp.only_a}; only in B: {cmp.only_b}.")
        out.append((f"compare · {what}", ["cell", "metric", "A", "B", "change", "noise", "p", "verdict", "test"],
                    rows, cap))
    return out


def sides(a: str, b: Optional[str], *, commits: Optional[str] = None,
          machines: Optional[str] = None) -> tuple[Side, Side]:
    """The two sides of ``attnbench compare`` from its arguments (see the module docstring)."""
    if sum(x is not None for x in (b, commits, machines)) != 1:
        raise AttnbenchError("compare takes two stores A B, or one store with --commits X,Y, or one store with "
                             "--machines M1,M2 (exactly one of these)")
    records = load_records(a)
    if b is not None:
        return Side(a, records), Side(b, load_records(b))
    if commits is not None:
        sa, sb = by_commits(records, [c for c in commits.split(",") if c.strip()])
    else:
        sa, sb = by_machines(records, [m for m in machines.split(",") if m.strip()])
    return Side(f"{a}: {sa.label}", sa.records), Side(f"{a}: {sb.label}", sb.records)
