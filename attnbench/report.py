"""Leaderboards, plots and exports: views over the results store (and the committed reference results).

Sources. A view reads :class:`Source` objects: the user's store (``--db`` / ``ATTNBENCH_DB`` /
``results/attnbench.db``) and the committed reference results, text exports under ``results/<suite>/*.jsonl``
found at the project root (see :func:`attnbench.store.project_root`) and beside the attnbench sources. The
committed ones are labelled as such, with their device and date; records of a run that is part of a committed
file are shown once, as committed.

Views. ``table <suite>`` renders the suite's view: the :class:`View` its :class:`attnbench.registry.Suite`
carries (:func:`view_of`). This module names no suite: it holds the machinery (sources, latest record per point,
:func:`fit_exponent`, formatting, markdown tables, exports) and the generic view that suites without their own
get: per attention and task, the best ``metrics["score"]`` with its spread over seeds.
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

from .errors import AttnbenchError
from .store import FINISHED, Measurement, open_existing, project_root, read_jsonl, resolve_db, write_jsonl

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
BASELINE = "softmax"   # the row every view compares against (a mechanism, not a suite)


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


def describe_records(records: list[Measurement]) -> str:
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
                sources.append(Source(f"committed reference results ({rel}; {describe_records(recs)})", recs,
                                      committed=True, path=f))
    if include_store:
        store = open_existing(db)
        if store is not None:
            with store:
                recs = [r for r in store.measurements(suite=suite, setting=setting) if r.run_id not in committed_runs]
            if recs:
                sources.append(Source(f"your runs ({_relative(store.path)})", recs, path=store.path))
    return sorted(sources, key=lambda src: src.committed)  # the user's own runs first, committed ones below


def _relative(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def latest(records: Iterable[Measurement], preferred: Iterable[str] = FINISHED) -> list[Measurement]:
    """One record per point (config hash): the latest with a ``preferred`` status (default: any finished one),
    else the latest of any status."""
    preferred = tuple(preferred)
    best: dict[str, Measurement] = {}
    for r in records:
        cur = best.get(r.config_hash)
        if cur is None:
            best[r.config_hash] = r
            continue
        rank = lambda m: (m.status in preferred, m.ended_at or "", m.id or 0)  # noqa: E731
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


def label_of(r: Measurement) -> str:
    """``name`` or ``name:key=value:...`` (the ``--attn`` spelling of the spec): one table row per attention and
    options."""
    return ":".join([r.attention, *(f"{k}={v}" for k, v in sorted(r.options.items()))])


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table (``|`` escaped; columns after the names right-aligned)."""
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "|" + "|".join("---" if i == 0 or h in ("attention", "impl") else "---:"
                            for i, h in enumerate(header)) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def slug(s: str) -> str:
    """``s`` as a file-name part."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", s).strip("_")


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
        labels = sorted({label_of(r) for r in recs})
        rows = []
        for lab in labels:
            row = [lab]
            for t in tasks:
                ok = [s for r in recs if label_of(r) == lab and r.task == t and r.status == "ok"
                      for s in [_score(r)] if s is not None]
                if ok:
                    spread = f" ±{statistics.stdev(ok):.3g}" if len(ok) > 1 else ""
                    row.append(f"{max(ok):.4g}{spread} (n={len(ok)})")
                else:
                    st = sorted({r.status for r in recs if label_of(r) == lab and r.task == t})
                    row.append("/".join(st) or "·")
            rows.append(row)
        names = sorted({r.device_name for r in recs if r.device_name})
        title = f"{setting} · {dtype} · {device}" + (f" ({'; '.join(names)})" if names else "")
        out.append((title, ["attention", *tasks], rows,
                    f"{source.label}. Best score per attention and task, ± std over ok runs (n)."))
    return out


#: A rendered leaderboard table: (title, header, rows, caption). Views build these; the two functions below render
#: them, so every suite prints and exports the same way.
TableData = tuple[str, list[str], list[list[str]], str]


def rich_tables(tables: Iterable[TableData], style: str | None = None) -> list[Any]:
    """rich ``Table`` s of ``tables`` (names left-aligned and never folded, numbers right-aligned)."""
    from rich.markup import escape
    from rich.table import Table

    out = []
    for title, header, rows, caption in tables:
        t = Table(title=f"[bold]{escape(title)}[/]", caption=escape(caption), caption_justify="left",
                  title_style=style)
        for h in header:
            name = h.startswith(("attention", "method", "impl"))
            t.add_column(escape(h), justify="left" if name else "right", overflow="fold", no_wrap=name)
        for row in rows:
            t.add_row(*[escape(str(c)) for c in row])
        out.append(t)
    return out


def markdown_tables(tables: Iterable[TableData]) -> str:
    return "\n".join(f"#### {title}\n\n{md_table(h, rows)}\n\n{cap}\n" for title, h, rows, cap in tables)


def generic_rich(source: Source) -> list[Any]:
    return rich_tables(_generic_tables(source))


def generic_markdown(source: Source) -> str:
    return markdown_tables(_generic_tables(source))


@dataclasses.dataclass
class View:
    """How ``attnbench table/plot/export --format markdown`` render a suite's records: a suite's
    :class:`attnbench.registry.Suite` carries one (``view=``); suites without one get :data:`GENERIC`.

    ``rich(source)``: the rich tables of one source; ``markdown(source)``: the same as markdown text;
    ``plot(source, out_dir, prefix)``: the PNGs written (None: the suite has no plots); ``extra()``: tables shown
    once by ``table`` after the sources' (e.g. a suite's published numbers, labelled as such), and
    ``extra_markdown()`` the same as markdown."""

    rich: Callable[[Source], list[Any]]
    markdown: Callable[[Source], str]
    plot: Callable[[Source, Path, str], list[Path]] | None = None
    extra: Callable[[], list[Any]] | None = None
    extra_markdown: Callable[[], str] | None = None  # ``extra`` as markdown (``table --format markdown``)


GENERIC = View(generic_rich, generic_markdown)


def table_view(tables: Callable[[list[Measurement], str], list[TableData]], *,
               extra: Callable[[], list[TableData]] | None = None,
               plot: Callable[[Source, Path, str], list[Path]] | None = None) -> View:
    """A suite's :class:`View` from ``tables(records, label)``, the function that builds its leaderboard tables
    from one source: committed sources in cyan, the user's in green, ``extra`` tables (e.g. a paper's reported
    numbers) in yellow after them; markdown the same."""
    return View(rich=lambda src: rich_tables(tables(src.records, src.label), "cyan" if src.committed else "green"),
                markdown=lambda src: markdown_tables(tables(src.records, src.label)), plot=plot,
                extra=(lambda: rich_tables(extra(), "yellow")) if extra else None,
                extra_markdown=(lambda: markdown_tables(extra())) if extra else None)


def _registered(suite: str):
    from . import registry
    from .errors import UnknownNameError

    try:
        return registry.get_suite(suite)
    except UnknownNameError:
        return None


def view_of(suite: str) -> View:
    """The view of the registered suite ``suite`` (``registry.get_suite(suite).view``); the generic view when it
    has none, or for records of a suite that is not registered (e.g. ingested ``pytest-benchmark`` records)."""
    registered = _registered(suite)
    view = registered.view if registered is not None else None
    return view or GENERIC


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
          console=None, fmt: str = "rich") -> int:
    """``attnbench table <suite>``: the user's store, then the committed reference results (labelled). ``fmt``
    ``rich`` (terminal tables) or ``markdown`` (plain text, for pipes and files: cells never fold)."""
    from rich.console import Console

    if fmt not in ("rich", "markdown"):
        raise ValueError(f"--format must be rich or markdown, got {fmt!r}")
    console = console or Console()
    sources = load_sources(suite, db=db, include_committed=committed, setting=setting)
    n = 0
    if not sources and _registered(suite) is None:
        from . import registry

        registry.get_suite(suite)  # nothing of that name anywhere: the did-you-mean error of the registry
    if not sources:
        console.print(f"no {suite} results: nothing in {resolve_db(db)} and no committed results/{suite}/*.jsonl; "
                      f"run `attnbench run {suite}` first")
    view = view_of(suite)
    if fmt == "markdown":
        texts = [view.markdown(src) for src in sources] + ([view.extra_markdown()] if view.extra_markdown else [])
        for text in texts:
            console.out(text, highlight=False)  # plain text: no markup, no folding
        return len(texts)
    if sources:
        n = print_tables(suite, sources, console=console)
    for t in view.extra() if view.extra else []:
        console.print(t)
        console.print()
        n += 1
    return n


# --- plots -------------------------------------------------------------------------------------------------------
def plot(suite: str, *, out: str | Path | None = None, db: str | None = None, source: str = "auto") -> list[Path]:
    """``attnbench plot <suite>``: PNGs of the store's records (``source='store'``), of the committed ones
    (``'committed'``), or of the store if it has any, else the committed ones (``'auto'``)."""
    view = view_of(suite)
    if view.plot is None:
        if _registered(suite) is None:
            from . import registry

            registry.get_suite(suite)  # an unknown name: did-you-mean
        raise AttnbenchError(f"suite {suite!r} has no plot")
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
    lines.append(f"| date | {describe_records(records).rsplit(', ', 1)[-1]} |")
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
