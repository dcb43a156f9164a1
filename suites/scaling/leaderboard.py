"""The scaling leaderboard (``attnbench table/plot scaling``, ``export --format markdown``): leaderboards and
log-log plots over the store's records (and the committed reference results).

Per (setting, task, dtype, device) — a *board* — it gives: time at each N (median ± IQR, ratio to softmax at the
same N), GFLOP/s at the largest N, peak memory at each N (ratio to softmax) and the empirical exponents (the
least-squares slope of log cost against log N over the ``ok`` points, :func:`attnbench.views.rows.fit_exponent`).

Memory. The primary figure is ``peak_tensor_bytes``: the peak bytes of tensors alive at once during one call,
above the inputs, counted at the tensor level (:class:`attnbench.measure.memory.TensorMemory`), so the same on any CPU
and allocator. The secondary figure is the process-level RSS peak (``peak_rss_bytes``); where the RSS rose by less
than its resolution it is recorded as None with the reason (``rss_note``) and shown as ``< res.``, never as 0.
Records written before the tensor-level figure existed carry only ``peak_mem_bytes`` (RSS on the CPU, the CUDA
allocator's peak on a GPU): they are shown in the secondary table, labelled by their ``mem_method``.

Torch-free: the CLI imports this for ``table`` and ``plot`` without loading torch.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Iterable

from attnbench.results.records import Measurement
from attnbench.views.compare import metric, separation
from attnbench.views.render import md_table
from attnbench.views.rows import BASELINE, fit_exponent, fmt_bytes, fmt_n, fmt_time, label_of, slug
from attnbench.views.sources import commits_of, describe_records, latest, machine_of, Source
from attnbench.views.tables import View

TENSOR_KEY = "peak_tensor_bytes"    # primary: tensor-level peak (allocator-independent)
RSS_KEY = "peak_rss_bytes"          # secondary: process RSS peak (None + rss_note below its resolution)
LEGACY_KEY = "peak_mem_bytes"       # records from before the tensor-level figure (RSS, or the CUDA allocator)
BELOW_RES = "< res."
FAILED = ("oom", "timeout", "failed", "incorrect", "interrupted")


def tensor_bytes(m: Measurement) -> float | None:
    """The primary memory figure of an ok record (None where the record predates it)."""
    return m.metrics.get(TENSOR_KEY)


def rss_bytes(m: Measurement) -> float | None:
    """The secondary memory figure: the RSS peak (or, for an old record, its ``peak_mem_bytes``)."""
    if RSS_KEY in m.metrics or "rss_note" in m.metrics:
        return m.metrics.get(RSS_KEY)
    return m.metrics.get(LEGACY_KEY)


def _has_rss(m: Measurement) -> bool:
    return any(k in m.metrics for k in (RSS_KEY, "rss_note", LEGACY_KEY))


@dataclasses.dataclass
class ScalingRow:
    label: str
    attention: str
    impl: str | None
    points: dict[int, Measurement]
    time_exp: float | None = None
    mem_exp: float | None = None      # exponent of the primary memory figure (tensor bytes)
    rss_exp: float | None = None      # exponent of the RSS figure

    def ok(self, n: int) -> Measurement | None:
        m = self.points.get(n)
        return m if m is not None and m.status == "ok" else None


@dataclasses.dataclass
class ScalingBoard:
    suite: str
    setting: str
    task: str
    dtype: str | None
    device: str
    device_name: str | None
    ns: list[int]
    rows: list[ScalingRow]
    commits: list[str]
    dates: str

    @property
    def title(self) -> str:
        dev = self.device + (f" ({self.device_name})" if self.device_name else "")
        return f"{self.setting} · {self.task} · {self.dtype} · {dev}"

    def baseline(self) -> ScalingRow | None:
        return next((r for r in self.rows if r.label == BASELINE), None)

    def ratio(self, row: ScalingRow, n: int, key: str) -> float | None:
        """``row``'s metric over softmax's at the same N (``key``: a metric name, or a function of a record)."""
        base = self.baseline()
        if base is None or row is base:
            return None
        a, b = row.ok(n), base.ok(n)
        if a is None or b is None:
            return None
        get = key if callable(key) else (lambda m: m.metrics.get(key))
        x, y = get(a), get(b)
        return x / y if x is not None and y else None

    def exponent_range(self) -> str:
        return f"{fmt_n(self.ns[0])}-{fmt_n(self.ns[-1])}" if self.ns else "-"

    def oks(self) -> list[Measurement]:
        return [m for r in self.rows for m in r.points.values() if m.status == "ok"]


def _fit(row: ScalingRow, value) -> float | None:
    ok = sorted((n, m) for n, m in row.points.items() if m.status == "ok")
    return fit_exponent([n for n, _ in ok], [value(m) for _, m in ok])


def scaling_boards(records: Iterable[Measurement]) -> list[ScalingBoard]:
    """Group the latest record of each point by (setting, task, dtype, device) into boards."""
    groups: dict[tuple, list[Measurement]] = {}
    for r in latest(records):
        groups.setdefault((r.setting, r.task, r.dtype, r.device), []).append(r)
    boards = []
    # fwd before fwd+bwd, bidir before causal
    for (setting, task, dtype, device), recs in sorted(
            groups.items(), key=lambda kv: tuple(str(x).replace("+", "~") for x in kv[0])):
        rows: dict[str, ScalingRow] = {}
        for r in recs:
            n = int(r.params.get("seq_len", 0))
            row = rows.setdefault(label_of(r), ScalingRow(label=label_of(r), attention=r.attention, impl=None,
                                                         points={}))
            row.points[n] = r
            if r.impl:
                row.impl = r.impl
        for row in rows.values():
            row.time_exp = _fit(row, lambda m: m.metrics.get("time_median_s"))
            row.mem_exp = _fit(row, tensor_bytes)
            row.rss_exp = _fit(row, rss_bytes)
        ns = sorted({n for row in rows.values() for n in row.points})
        nmax = ns[-1] if ns else 0

        def order(row: ScalingRow):
            # softmax first, then by time at the largest N each row reached (ok rows before failed ones)
            last = max((n for n in row.points if row.ok(n)), default=0)
            t = row.ok(last).metrics.get("time_median_s") if last else math.inf
            return (row.label != BASELINE, -last if last < nmax else -nmax, t or math.inf, row.label)

        commits = commits_of(recs)
        boards.append(ScalingBoard(suite=recs[0].suite, setting=setting, task=task, dtype=dtype, device=device,
                                   device_name=machine_of(recs), ns=ns,
                                   rows=sorted(rows.values(), key=order), commits=commits,
                                   dates=describe_records(recs).rsplit(", ", 1)[-1]))
    return boards


# --- tables ------------------------------------------------------------------------------------------------------
def _status_text(m: Measurement | None) -> str:
    return "·" if m is None else m.status


def _time_cell(board: ScalingBoard, row: ScalingRow, n: int, sep: str) -> str:
    m = row.points.get(n)
    if m is None or m.status != "ok":
        return _status_text(m)
    med = m.metrics.get("time_median_s")
    iqr = m.metrics.get("time_iqr_s") or 0.0
    spread = f" ±{100 * iqr / med:.0f}%" if med else ""
    ratio = board.ratio(row, n, "time_median_s")
    return fmt_time(med) + spread + (f"{sep}{ratio:.2g}×" if ratio is not None else "")


def _mem_cell(board: ScalingBoard, row: ScalingRow, n: int, sep: str, value) -> str:
    m = row.points.get(n)
    if m is None or m.status != "ok":
        return _status_text(m)
    b = value(m)
    if b is None:
        return BELOW_RES if m.metrics.get("rss_note") else "-"
    ratio = board.ratio(row, n, value)
    return fmt_bytes(b) + (f"{sep}{ratio:.2g}×" if ratio is not None else "")


def _gflops(row: ScalingRow) -> str:
    last = max((n for n in row.points if row.ok(n)), default=None)
    if last is None:
        return "-"
    gf = row.ok(last).metrics.get("gflops")
    return f"{gf:.3g} @{fmt_n(last)}" if gf else "-"


def _exp(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "-"


def _methods(board: ScalingBoard, key: str, default: str) -> str:
    methods = sorted({m.metrics.get(key) for m in board.oks()} - {None, ""})
    return "; ".join(methods) or default


def _separation_line(board: ScalingBoard) -> str:
    """The separation line of a time table: compare's timing test between every pair of rows at the largest N
    every row finished (the repeat noise of each side's median)."""
    common = [n for n in board.ns if all(n in r.points and r.points[n].status == "ok" for r in board.rows)]
    if not common or len(board.rows) < 2:
        return "Separation: no N at which every row finished." if len(board.rows) > 1 else ""
    n = max(common)
    return separation({r.label: [r.points[n]] for r in board.rows}, metric("time_median_s")).line(
        f"Separation (time at N={fmt_n(n)})")


def _exact_line(board: ScalingBoard) -> str:
    """The separation line of the tensor-memory table: exact counts, the same on any machine, so every unequal
    pair differs; counted at the largest N every row finished."""
    common = [n for n in board.ns if all(n in r.points and r.points[n].status == "ok" for r in board.rows)]
    vals = [tensor_bytes(r.points[max(common)]) for r in board.rows] if common else []
    if len(vals) < 2 or any(v is None for v in vals):
        return "Separation: no N at which every row has a tensor count."
    pairs = [(a, b) for i, a in enumerate(vals) for b in vals[i + 1:]]
    return (f"Separation (bytes at N={fmt_n(max(common))}): exact counts, no noise; {sum(a != b for a, b in pairs)} of "
            f"{len(pairs)} pairs differ.")


def _board_tables(board: ScalingBoard, source: Source, sep: str) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, caption) for the time table and the memory tables of a board."""
    provenance_note = (f"{'committed reference results' if source.committed else source.label.split(' (')[0]} · "
                       f"{board.dates} · commit {', '.join(board.commits)}")
    ncols = [f"N={fmt_n(n)}" for n in board.ns]
    rng = board.exponent_range()
    exp_col = f"exponent ({rng})"
    time_rows = [[r.label, r.impl or "-", *[_time_cell(board, r, n, sep) for n in board.ns], _gflops(r),
                  _exp(r.time_exp)] for r in board.rows]
    out = [(f"time — {board.title}", ["attention", "impl", *ncols, "GFLOP/s", exp_col], time_rows,
            f"{provenance_note}. Median ± IQR of repeated calls; × = time / softmax time at the same N (one run). "
            f"Exponent: slope of log time vs log N over the ok points. {_separation_line(board)}")]
    oks = board.oks()
    if any(tensor_bytes(m) is not None for m in oks):
        rows = [[r.label, *[_mem_cell(board, r, n, sep, tensor_bytes) for n in board.ns], _exp(r.mem_exp)]
                for r in board.rows]
        out.append((f"peak memory (tensor bytes above the inputs) — {board.title}", ["attention", *ncols, exp_col],
                    rows, f"{provenance_note}. Counted at the tensor level, the same on any CPU and allocator: "
                          f"{_methods(board, 'tensor_mem_method', 'peak bytes of tensors alive at once')}. "
                          f"× = / softmax's. Exponent: slope of log bytes vs log N. {_exact_line(board)}"))
    if any(_has_rss(m) for m in oks):
        rows = [[r.label, *[_mem_cell(board, r, n, sep, rss_bytes) for n in board.ns], _exp(r.rss_exp)]
                for r in board.rows]
        below = any(rss_bytes(m) is None and m.metrics.get("rss_note") for m in oks)
        note = (f" {BELOW_RES}: the process's resident memory rose by less than its resolution (one page): the "
                f"allocator served the call from memory it already held; not a zero." if below else "")
        out.append((f"peak memory (process RSS above the inputs) — {board.title}", ["attention", *ncols, exp_col],
                    rows, f"{provenance_note}. {_methods(board, 'mem_method', 'peak RSS')}; depends on the "
                          f"allocator and its cache. × = / softmax's.{note} Separation: not tested (one reading per "
                          f"point, allocator-dependent: no noise to test a difference against)."))
    return out


def _style_status(cell: str) -> str:
    if cell in FAILED:
        return f"[red]{cell}[/]"
    if cell in ("unsupported", "skipped", "·", BELOW_RES):
        return f"[dim]{cell}[/]"
    return cell


def scaling_rich(source: Source) -> list[Any]:
    from rich.markup import escape
    from rich.table import Table

    tables = []
    for board in scaling_boards(source.records):
        for title, header, rows, caption in _board_tables(board, source, "\n"):
            style = "cyan" if source.committed else "green"
            t = Table(title=f"[bold]{escape(title)}[/]\n[{style}]{escape(source.label)}[/]", caption=escape(caption),
                      caption_justify="left")
            for h in header:
                t.add_column(h, justify="left" if h in ("attention", "impl") else "right", overflow="fold")
            for row in rows:
                t.add_row(*[_style_status(escape(c)) for c in row])
            tables.append(t)
    return tables


def scaling_markdown(source: Source) -> str:
    parts = []
    for board in scaling_boards(source.records):
        for title, header, rows, caption in _board_tables(board, source, " · "):
            parts.append(f"#### {title}\n\n{md_table(header, rows)}\n\n{caption}\n")
    return "\n".join(parts)


# --- plots -------------------------------------------------------------------------------------------------------
def _memory_series(board: ScalingBoard) -> tuple[Any, str, str]:
    """The memory figure a board's plot shows: tensor bytes, else (old records) the RSS figure."""
    if any(tensor_bytes(m) is not None for m in board.oks()):
        return tensor_bytes, "mem_exp", "peak tensor memory above inputs [bytes]"
    return rss_bytes, "rss_exp", "peak RSS above inputs [bytes]"


def scaling_figure(board: ScalingBoard, what: str, footer: str = ""):
    """The matplotlib figure of one board: ``what`` is ``"time"`` or ``"memory"``; None when nothing to draw.
    One line per attention (softmax black), N¹ and N² guides, the legend below the axes (never over a point)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if what == "time":
        value, exp_attr, ylabel = (lambda m: m.metrics.get("time_median_s")), "time_exp", "median time per call [s]"
    else:
        value, exp_attr, ylabel = _memory_series(board)
    series = []
    for row in board.rows:
        pts = [(n, value(row.ok(n))) for n in board.ns if row.ok(n)]
        pts = [(n, y) for n, y in pts if y is not None and y > 0]
        fails = [(n, m.status) for n, m in sorted(row.points.items()) if m.status in ("oom", "timeout")]
        if pts:
            series.append((row, pts, fails))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5.6), dpi=110)
    for row, pts, fails in series:
        base = row.label == BASELINE
        style = dict(color="black", linewidth=2.6, zorder=5) if base else dict(linewidth=1.5)
        line, = ax.plot([n for n, _ in pts], [y for _, y in pts], marker="o", markersize=4,
                        label=f"{row.label} ({_exp(getattr(row, exp_attr))})", **style)
        for n, st in fails:
            ax.annotate(f"{st} at {fmt_n(n)}", xy=pts[-1], xytext=(4, 4), textcoords="offset points", fontsize=8,
                        color=line.get_color())
    firsts = sorted(pts[0][1] for _, pts, _ in series)
    n0 = min(pts[0][0] for _, pts, _ in series)
    y0 = firsts[len(firsts) // 2]   # guides start at the median first point
    for k, ls in ((1, ":"), (2, "--")):
        ax.plot(board.ns, [y0 * (n / n0) ** k for n in board.ns], color="grey", linestyle=ls, linewidth=0.8,
                label=f"∝ N^{k}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(board.ns, [fmt_n(n) for n in board.ns])
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{what}: {board.title}", fontsize=9)
    ax.grid(True, which="both", alpha=0.25)
    # below the axes, outside them: a legend inside covers the first points (they all start in one corner)
    ncol = min(4, len(series) + 2)
    ax.legend(fontsize=7, title="attention (exponent)", title_fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.13), ncol=ncol, frameon=False)
    if footer:
        fig.text(0.01, 0.005, footer, fontsize=6, color="grey")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    return fig


def plot_scaling(source: Source, out_dir: Path, prefix: str = "scaling") -> list[Path]:
    """Log-log time and memory against N, one line per attention, per board; returns the PNG paths."""
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for board in scaling_boards(source.records):
        for what in ("time", "memory"):
            fig = scaling_figure(board, what, footer=f"{source.label} · commit {', '.join(board.commits)}")
            if fig is None:
                continue
            path = out_dir / (f"{prefix}-{slug(board.setting.split('/', 1)[-1])}-{slug(board.task)}-"
                              f"{board.dtype}-{slug(board.device)}-{what}.png")
            fig.savefig(path, bbox_inches="tight")   # "tight": the legend below the axes is part of the image
            plt.close(fig)
            written.append(path)
    return written


def scaling_data(source: Source) -> list:
    """The boards of ``source`` as (title, header, rows, caption) tables (printed by attnbench.views.tables)."""
    return [t for board in scaling_boards(source.records) for t in _board_tables(board, source, "\n")]


VIEW = View(rich=scaling_rich, markdown=scaling_markdown, plot=plot_scaling, data=scaling_data)
