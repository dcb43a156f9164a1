"""Leaderboards, plots and exports: views over the results store (and the committed reference results).

Sources. A view reads :class:`Source` objects: the user's store (``--db`` / ``ATTNBENCH_DB`` /
``results/attnbench.db``) and the committed reference results, text exports under ``results/<suite>/*.jsonl``
found at the project root (see :func:`attnbench.store.project_root`) and beside the attnbench sources. The
committed ones are labelled as such, with their device and date; records of a run that is part of a committed
file are shown once, as committed.

Views. ``table <suite>`` renders the suite's registered view (:func:`register_view`); the scaling view gives, per
(setting, task, dtype, device): time at each N (median ± IQR, ratio to softmax at the same N), GFLOP/s, peak
memory at each N (ratio to softmax), and the empirical exponents — the least-squares slope of log cost against
log N over the ``ok`` points (:func:`fit_exponent`). Suites without a view of their own get the generic one:
per attention and task, the best ``metrics["score"]`` with its spread over seeds.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
import statistics
from pathlib import Path
from typing import Any, Callable, Iterable

from .store import FINISHED, Measurement, open_existing, project_root, read_jsonl, resolve_db, write_jsonl

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
BASELINE = "softmax"


@dataclasses.dataclass
class Source:
    label: str
    records: list[Measurement]
    committed: bool = False
    path: Path | None = None


# --- finding records -------------------------------------------------------------------------------------------
def results_dirs() -> list[Path]:
    """``results/`` at the project root and beside the attnbench sources (editable install), if they exist."""
    out: list[Path] = []
    for d in (project_root() / "results", PACKAGE_ROOT / "results"):
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def reference_files(suite: str) -> list[Path]:
    """Committed reference exports of ``suite``: ``results/<suite>/*.jsonl``."""
    files = []
    for d in results_dirs():
        files.extend(sorted((d / suite).glob("*.jsonl")))
    return files


def _describe_records(records: list[Measurement]) -> str:
    devices = sorted({r.device_name or r.device for r in records if r})
    dates = sorted({(r.ended_at or r.started_at or "")[:10] for r in records} - {""})
    date = dates[0] if len(dates) == 1 else (f"{dates[0]}..{dates[-1]}" if dates else "undated")
    return f"{'; '.join(devices) or 'unknown device'}, {date}"


def load_sources(suite: str, *, db: str | None = None, include_committed: bool = True,
                 include_store: bool = True, setting: str | None = None) -> list[Source]:
    """The committed reference results of ``suite`` (if any) and the user's store (if it exists)."""
    sources: list[Source] = []
    committed_runs: set[str] = set()
    if include_committed:
        for f in reference_files(suite):
            recs = [r for r in read_jsonl(f) if r.suite == suite and (setting is None or r.setting == setting)]
            if recs:
                committed_runs |= {r.run_id for r in recs if r.run_id}
                rel = _relative(f)
                sources.append(Source(f"committed reference results ({rel}; {_describe_records(recs)})", recs,
                                      committed=True, path=f))
    if include_store:
        store = open_existing(db)
        if store is not None:
            with store:
                recs = [r for r in store.measurements(suite=suite, setting=setting) if r.run_id not in committed_runs]
            if recs:
                sources.append(Source(f"your runs ({_relative(store.path)})", recs, path=store.path))
    return sources


def _relative(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def latest(records: Iterable[Measurement]) -> list[Measurement]:
    """One record per point (config hash): the latest finished one, else the latest of any status."""
    best: dict[str, Measurement] = {}
    for r in records:
        cur = best.get(r.config_hash)
        if cur is None:
            best[r.config_hash] = r
            continue
        rank = lambda m: (m.status in FINISHED, m.ended_at or "", m.id or 0)  # noqa: E731
        if rank(r) >= rank(cur):
            best[r.config_hash] = r
    return list(best.values())


# --- numbers -----------------------------------------------------------------------------------------------------
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


def _label(r: Measurement) -> str:
    if not r.options:
        return r.attention
    return r.attention + "(" + ",".join(f"{k}={v}" for k, v in sorted(r.options.items())) + ")"


# --- the scaling view ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ScalingRow:
    label: str
    attention: str
    impl: str | None
    points: dict[int, Measurement]
    time_exp: float | None = None
    mem_exp: float | None = None

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
        base = self.baseline()
        if base is None or row is base:
            return None
        a, b = row.ok(n), base.ok(n)
        if a is None or b is None:
            return None
        x, y = a.metrics.get(key), b.metrics.get(key)
        return x / y if x is not None and y else None

    def exponent_range(self) -> str:
        return f"{fmt_n(self.ns[0])}-{fmt_n(self.ns[-1])}" if self.ns else "-"


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
            row = rows.setdefault(_label(r), ScalingRow(label=_label(r), attention=r.attention, impl=None, points={}))
            row.points[n] = r
            if r.impl:
                row.impl = r.impl
        for row in rows.values():
            ok = sorted((n, m) for n, m in row.points.items() if m.status == "ok")
            row.time_exp = fit_exponent([n for n, _ in ok], [m.metrics.get("time_median_s") for _, m in ok])
            row.mem_exp = fit_exponent([n for n, _ in ok], [m.metrics.get("peak_mem_bytes") for _, m in ok])
        ns = sorted({n for row in rows.values() for n in row.points})
        nmax = ns[-1] if ns else 0

        def order(row: ScalingRow):
            # softmax first, then by time at the largest N each row reached (ok rows before failed ones)
            last = max((n for n in row.points if row.ok(n)), default=0)
            t = row.ok(last).metrics.get("time_median_s") if last else math.inf
            return (row.label != BASELINE, -last if last < nmax else -nmax, t or math.inf, row.label)

        commits = sorted({(r.git_commit or "?")[:10] + ("-dirty" if r.git_dirty else "") for r in recs})
        names = sorted({r.device_name for r in recs if r.device_name})
        boards.append(ScalingBoard(suite=recs[0].suite, setting=setting, task=task, dtype=dtype, device=device,
                                   device_name="; ".join(names) or None, ns=ns,
                                   rows=sorted(rows.values(), key=order), commits=commits,
                                   dates=_describe_records(recs).rsplit(", ", 1)[-1]))
    return boards


def _status_text(m: Measurement | None) -> str:
    if m is None:
        return "·"
    return m.status


def _time_cell(board: ScalingBoard, row: ScalingRow, n: int, sep: str) -> str:
    m = row.points.get(n)
    if m is None or m.status != "ok":
        return _status_text(m)
    med = m.metrics.get("time_median_s")
    iqr = m.metrics.get("time_iqr_s") or 0.0
    spread = f" ±{100 * iqr / med:.0f}%" if med else ""
    ratio = board.ratio(row, n, "time_median_s")
    return fmt_time(med) + spread + (f"{sep}{ratio:.2g}×" if ratio is not None else "")


def _mem_cell(board: ScalingBoard, row: ScalingRow, n: int, sep: str) -> str:
    m = row.points.get(n)
    if m is None or m.status != "ok":
        return _status_text(m)
    b = m.metrics.get("peak_mem_bytes")
    ratio = board.ratio(row, n, "peak_mem_bytes")
    return fmt_bytes(b) + (f"{sep}{ratio:.2g}×" if ratio is not None else "")


def _gflops(row: ScalingRow) -> str:
    last = max((n for n in row.points if row.ok(n)), default=None)
    if last is None:
        return "-"
    gf = row.ok(last).metrics.get("gflops")
    return f"{gf:.3g} @{fmt_n(last)}" if gf else "-"


def _exp(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "-"


def _mem_method(board: ScalingBoard) -> str:
    methods = {m.metrics.get("mem_method") for r in board.rows for m in r.points.values() if m.status == "ok"}
    methods.discard(None)
    return "; ".join(sorted(methods)) or "-"


def _board_tables(board: ScalingBoard, source: Source, sep: str) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, caption) for the time and the memory table of a board."""
    provenance_note = (f"{'committed reference results' if source.committed else source.label.split(' (')[0]} · "
                       f"{board.dates} · commit {', '.join(board.commits)}")
    ncols = [f"N={fmt_n(n)}" for n in board.ns]
    time_rows = [[r.label, r.impl or "-", *[_time_cell(board, r, n, sep) for n in board.ns], _gflops(r),
                  _exp(r.time_exp)] for r in board.rows]
    mem_rows = [[r.label, *[_mem_cell(board, r, n, sep) for n in board.ns], _exp(r.mem_exp)] for r in board.rows]
    has_mem = any(m.metrics.get("peak_mem_bytes") is not None for r in board.rows for m in r.points.values())
    rng = board.exponent_range()
    out = [(f"time — {board.title}", ["attention", "impl", *ncols, "GFLOP/s", f"exponent ({rng})"], time_rows,
            f"{provenance_note}. Median ± IQR of repeated calls; × = time / softmax time at the same N (one run). "
            f"Exponent: slope of log time vs log N over the ok points.")]
    if has_mem:
        out.append((f"peak memory — {board.title}", ["attention", *ncols, f"exponent ({rng})"], mem_rows,
                    f"{provenance_note}. Peak memory above the inputs ({_mem_method(board)}); × = / softmax's."))
    return out


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


def _style_status(cell: str) -> str:
    if cell in ("oom", "timeout", "failed", "incorrect", "interrupted"):
        return f"[red]{cell}[/]"
    if cell in ("unsupported", "skipped", "·"):
        return f"[dim]{cell}[/]"
    return cell


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "|" + "|".join("---" if i == 0 or h in ("attention", "impl") else "---:"
                            for i, h in enumerate(header)) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def scaling_markdown(source: Source) -> str:
    parts = []
    for board in scaling_boards(source.records):
        for title, header, rows, caption in _board_tables(board, source, " · "):
            parts.append(f"#### {title}\n\n{_md_table(header, rows)}\n\n{caption}\n")
    return "\n".join(parts)


# --- the generic view (suites without their own) -----------------------------------------------------------------
def _score(m: Measurement) -> float | None:
    for key in ("score", "accuracy", "acc"):
        v = m.metrics.get(key)
        if isinstance(v, (int, float)):
            return float(v)
    return None


def _generic_tables(source: Source) -> list[tuple[str, list[str], list[list[str]], str]]:
    groups: dict[tuple, list[Measurement]] = {}
    for r in source.records:
        groups.setdefault((r.setting, r.dtype, r.device), []).append(r)
    out = []
    for (setting, dtype, device), recs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        tasks = sorted({r.task for r in recs})
        labels = sorted({_label(r) for r in recs})
        rows = []
        for lab in labels:
            row = [lab]
            for t in tasks:
                ok = [s for r in recs if _label(r) == lab and r.task == t and r.status == "ok"
                      for s in [_score(r)] if s is not None]
                if ok:
                    spread = f" ±{statistics.stdev(ok):.3g}" if len(ok) > 1 else ""
                    row.append(f"{max(ok):.4g}{spread} (n={len(ok)})")
                else:
                    st = sorted({r.status for r in recs if _label(r) == lab and r.task == t})
                    row.append("/".join(st) or "·")
            rows.append(row)
        names = sorted({r.device_name for r in recs if r.device_name})
        title = f"{setting} · {dtype} · {device}" + (f" ({'; '.join(names)})" if names else "")
        out.append((title, ["attention", *tasks], rows,
                    f"{source.label}. Best score per attention and task, ± std over ok runs (n)."))
    return out


def generic_rich(source: Source) -> list[Any]:
    from rich.markup import escape
    from rich.table import Table

    tables = []
    for title, header, rows, caption in _generic_tables(source):
        t = Table(title=escape(title), caption=escape(caption), caption_justify="left")
        for h in header:
            t.add_column(escape(h), overflow="fold")
        for row in rows:
            t.add_row(*[escape(c) for c in row])
        tables.append(t)
    return tables


def generic_markdown(source: Source) -> str:
    return "\n".join(f"#### {title}\n\n{_md_table(h, rows)}\n\n{cap}\n" for title, h, rows, cap in _generic_tables(source))


@dataclasses.dataclass
class View:
    rich: Callable[[Source], list[Any]]
    markdown: Callable[[Source], str]
    plot: Callable[[Source, Path, str], list[Path]] | None = None
    # tables shown once by ``table`` after the sources' (e.g. a suite's published numbers, labelled as such)
    extra: Callable[[], list[Any]] | None = None


VIEWS: dict[str, View] = {}
GENERIC = View(generic_rich, generic_markdown)


def register_view(suite: str, view: View) -> None:
    """How ``attnbench table/plot/export --format markdown <suite>`` render ``suite`` (e.g. the LRA suite)."""
    VIEWS[suite] = view


def view_of(suite: str) -> View:
    if suite not in VIEWS:  # a suite package may register its view when imported (e.g. attnbench.suites.lra)
        import importlib

        try:
            importlib.import_module(f"attnbench.suites.{suite}")
        except ImportError:
            pass
    return VIEWS.get(suite, GENERIC)


def print_tables(suite: str, sources: list[Source], console=None) -> int:
    """Render every source's leaderboard tables for ``suite``; returns how many tables were printed."""
    from rich.console import Console

    console = console or Console()
    n = 0
    for src in sources:
        for t in view_of(suite).rich(src):
            console.print(t)
            console.print()
            n += 1
    return n


def table(suite: str, *, db: str | None = None, setting: str | None = None, committed: bool = True,
          console=None) -> int:
    """``attnbench table <suite>``: committed reference results beside the user's store."""
    from rich.console import Console

    console = console or Console()
    sources = load_sources(suite, db=db, include_committed=committed, setting=setting)
    n = 0
    if not sources:
        console.print(f"no {suite} results: nothing in {resolve_db(db)} and no committed results/{suite}/*.jsonl; "
                      f"run `attnbench run {suite}` first")
    else:
        n = print_tables(suite, sources, console=console)
    extra = view_of(suite).extra
    for t in extra() if extra else []:
        console.print(t)
        console.print()
        n += 1
    return n


# --- plots -------------------------------------------------------------------------------------------------------
def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", s).strip("_")


def plot_scaling(source: Source, out_dir: Path, prefix: str = "scaling") -> list[Path]:
    """Log-log time and memory against N, one line per attention, per board; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for board in scaling_boards(source.records):
        for key, what, fmt in (("time_median_s", "time", "median time per call [s]"),
                               ("peak_mem_bytes", "memory", "peak memory above inputs [bytes]")):
            series = []
            for row in board.rows:
                pts = [(n, row.ok(n).metrics.get(key)) for n in board.ns if row.ok(n)]
                pts = [(n, y) for n, y in pts if y is not None and y > 0]
                fails = [(n, m.status) for n, m in sorted(row.points.items()) if m.status in ("oom", "timeout")]
                if pts or fails:
                    series.append((row, pts, fails))
            if not any(pts for _, pts, _ in series):
                continue
            fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=110)
            for row, pts, fails in series:
                base = row.label == BASELINE
                style = dict(color="black", linewidth=2.6, zorder=5) if base else dict(linewidth=1.5)
                if pts:
                    line, = ax.plot([n for n, _ in pts], [y for _, y in pts], marker="o", markersize=4,
                                    label=f"{row.label} ({_exp(row.time_exp if what == 'time' else row.mem_exp)})",
                                    **style)
                    for n, st in fails:
                        ax.annotate(st, xy=(pts[-1][0], pts[-1][1]), xytext=(4, 4), textcoords="offset points",
                                    fontsize=8, color=line.get_color())
            firsts = sorted(pts[0][1] for _, pts, _ in series if pts)
            n0 = min(pts[0][0] for _, pts, _ in series if pts)
            y0 = firsts[len(firsts) // 2]   # guides start at the median first point
            for k, ls in ((1, ":"), (2, "--")):
                ax.plot(board.ns, [y0 * (n / n0) ** k for n in board.ns], color="grey", linestyle=ls, linewidth=0.8,
                        label=f"∝ N^{k}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(board.ns, [fmt_n(n) for n in board.ns])
            ax.set_xlabel("sequence length N")
            ax.set_ylabel(fmt)
            ax.set_title(f"{what}: {board.title}", fontsize=9)
            ax.grid(True, which="both", alpha=0.25)
            ax.legend(fontsize=7, title="attention (exponent)", title_fontsize=7, loc="upper left")
            fig.text(0.01, 0.005, f"{source.label} · commit {', '.join(board.commits)}", fontsize=6, color="grey")
            fig.tight_layout(rect=(0, 0.02, 1, 1))
            path = out_dir / (f"{prefix}-{_slug(board.setting.split('/', 1)[-1])}-{_slug(board.task)}-"
                              f"{board.dtype}-{_slug(board.device)}-{what}.png")
            fig.savefig(path)
            plt.close(fig)
            written.append(path)
    return written


register_view("scaling", View(scaling_rich, scaling_markdown, plot_scaling))


def plot(suite: str, *, out: str | Path | None = None, db: str | None = None, source: str = "auto") -> list[Path]:
    """``attnbench plot <suite>``: PNGs of the store's records (``source='store'``), of the committed ones
    (``'committed'``), or of the store if it has any, else the committed ones (``'auto'``)."""
    view = view_of(suite)
    if view.plot is None:
        raise ValueError(f"suite {suite!r} has no plot")
    if source not in ("auto", "store", "committed", "all"):
        raise ValueError(f"source must be auto, store, committed or all, got {source!r}")
    sources = load_sources(suite, db=db, include_committed=source in ("auto", "committed", "all"),
                           include_store=source in ("auto", "store", "all"))
    if source == "auto" and any(not s.committed for s in sources):
        sources = [s for s in sources if not s.committed]
    out_dir = Path(out) if out else project_root() / "results" / "plots"
    written = []
    for s in sources:
        prefix = s.path.stem if s.committed and s.path else suite
        written += view.plot(s, out_dir, prefix)
    return written


# --- exports -----------------------------------------------------------------------------------------------------
FORMATS = ("csv", "jsonl", "markdown")


def environment_markdown(records: list[Measurement]) -> str:
    """The environment block of an export: devices, commits, packages, dates."""
    if not records:
        return ""
    lines = ["| | |", "|---|---|"]
    devices = sorted({f"{r.device} ({r.device_name})" if r.device_name else r.device for r in records})
    commits = sorted({(r.git_commit or "?") + (" (dirty tree)" if r.git_dirty else "") for r in records})
    pk: dict[str, set] = {}
    for r in records:
        for k, v in (r.packages or {}).items():
            pk.setdefault(k, set()).add(v)
    threads = sorted({str(r.params.get("threads")) for r in records if r.params.get("threads") is not None})
    lines.append(f"| device | {'; '.join(devices)} |")
    if threads:
        lines.append(f"| threads | {', '.join(threads)} |")
    lines.append(f"| date | {_describe_records(records).rsplit(', ', 1)[-1]} |")
    lines.append(f"| commit | {'; '.join(commits)} |")
    lines.append("| packages | " + ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in sorted(pk.items())) + " |")
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append("| points | " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + " |")
    return "\n".join(lines) + "\n"


def export(records: list[Measurement], fmt: str, out: str | Path | None = None, *, suite: str | None = None,
           label: str = "exported results") -> str:
    """Render ``records`` as csv (flat rows), jsonl (full records) or markdown (the suite's leaderboard and the
    environment). Writes ``out`` if given (atomically), returns the text."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "jsonl":
        if out:
            write_jsonl(records, out)
            return Path(out).read_text()
        import json

        return "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in records)
    if fmt == "csv":
        rows = [r.flat() for r in records]
        cols: list[str] = []
        for row in rows:
            cols += [c for c in row if c not in cols]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        text = buf.getvalue()
    else:
        parts = []
        by_suite: dict[str, list[Measurement]] = {}
        for r in records:
            by_suite.setdefault(r.suite, []).append(r)
        for s, recs in sorted(by_suite.items()):
            src = Source(label, recs)
            parts.append(f"### {s}: {label}\n\n{environment_markdown(recs)}\n{view_of(s).markdown(src)}")
        text = "\n".join(parts)
    if out:
        p = Path(out)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(p)
    return text


def select(*, db: str | None = None, suite: str | None = None, setting: str | None = None,
           run: str | None = None) -> list[Measurement]:
    """Records of the store for an export: every filter optional; ``run`` is a run id (or a unique prefix of
    one) or ``latest`` (the most recent run of ``suite``)."""
    store = open_existing(db)
    if store is None:
        raise FileNotFoundError(f"no results store at {resolve_db(db)}")
    with store:
        run_id = None
        if run:
            runs = store.runs(suite)
            if run == "latest":
                if not runs:
                    raise ValueError(f"no runs{' of ' + suite if suite else ''} in {store.path}")
                run_id = runs[-1]["run_id"]
            else:
                match = [r["run_id"] for r in runs if r["run_id"].startswith(run)]
                if len(match) != 1:
                    raise ValueError(f"run {run!r} matches {len(match)} runs in {store.path}")
                run_id = match[0]
        return store.measurements(suite=suite, setting=setting, run_id=run_id)
