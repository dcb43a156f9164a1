"""Leaderboards and plots of a suite: ``attnbench table`` and ``attnbench plot``.

``table <suite>`` renders the suite's view: the :class:`View` its :class:`attnbench.api.suites.Suite` carries
(:func:`view_of`). This module names no suite: suites without a view of their own get the generic one, per
attention and task, the best ``metrics["score"]`` with its spread over seeds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from attnbench.api import suites as suite_registry
from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.results.paths import project_root, resolve_db
from attnbench.results.records import Measurement
from attnbench.views.compare import metric, separation
from attnbench.views.render import TableData, default_console, markdown_tables, render_tables, rich_tables, table_format
from attnbench.views.rows import aggregate, fmt_seeds, label_of, seed_note, seed_rows, CONTENDED
from attnbench.views.sources import Source, load_sources, machine_of, machines, reference_files


def _generic_tables(source: Source) -> list[tuple[str, list[str], list[list[str]], str]]:
    groups: dict[tuple, list[Measurement]] = {}
    for r in source.records:
        groups.setdefault((r.setting, r.dtype, r.device), []).append(r)
    out = []
    for (setting, dtype, device), recs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        rows_over_seeds = seed_rows(recs)
        tasks = sorted({r.task for r in recs})
        labels = sorted({label_of(r) for r in recs})
        rows, stats, seps = [], [], []
        for t in tasks:  # every pair of rows tested, as every leaderboard does (a score with a test-set size)
            by_row = {lab: [m for k, ms in rows_over_seeds.items() if k[3] == t and k[4] == lab for m in ms]
                      for lab in labels}
            if any(isinstance(m.metrics.get("score"), (int, float)) for ms in by_row.values() for m in ms):
                seps.append(separation(by_row, metric("score")).line(f"Separation ({t})"))
        for lab in labels:
            row = [lab]
            for t in tasks:
                rs = [m for k, ms in rows_over_seeds.items() if k[3] == t and k[4] == lab for m in ms]
                score_key = next((k for k in ("score", "accuracy", "acc") if any(
                    isinstance(m.metrics.get(k), (int, float)) for m in rs)), None)
                st = aggregate(rs, score_key, proportion=False) if score_key else None
                stats.append(st)
                if st is not None:
                    row.append(fmt_seeds(st, digits=4) if st.n > 1 else f"{st.mean:.4g}")
                else:
                    row.append("/".join(sorted({r.status for r in rs})) or "·")
            rows.append(row)
        title = f"{setting} · {dtype} · {device} ({machine_of(recs)})"
        out.append((title, ["attention", *tasks], rows,
                    f"{source.label}. Score per attention and task (mean over seeds).{seed_note(stats, False)}"
                    + "".join(f" {line}" for line in seps)))
    return out


@dataclasses.dataclass
class View:
    """How ``attnbench table/plot/export --format markdown`` render a suite's records: a suite's
    :class:`attnbench.api.suites.Suite` carries one (``view=``); suites without one get :data:`GENERIC`.

    ``data(source)``: the leaderboard tables of one source as :data:`TableData` (what :func:`render_tables` prints
    in any format and at any width); ``extra_data()``: tables shown once by ``table`` after the sources' (e.g. a
    suite's published numbers, labelled as such); ``plot(source, out_dir, prefix)``: the PNGs written (None: the
    suite has no plots). ``rich`` / ``markdown`` / ``extra`` / ``extra_markdown`` are the same tables rendered
    (rich tables at their natural width, markdown text), derived from ``data`` when not given."""

    rich: Callable[[Source], list[Any]] | None = None
    markdown: Callable[[Source], str] | None = None
    plot: Callable[[Source, Path, str], list[Path]] | None = None
    extra: Callable[[], list[Any]] | None = None
    extra_markdown: Callable[[], str] | None = None
    data: Callable[[Source], list[TableData]] | None = None
    extra_data: Callable[[], list[TableData]] | None = None

    def __post_init__(self) -> None:
        if self.data is not None:
            data, extra = self.data, self.extra_data
            self.rich = self.rich or (lambda src: rich_tables(data(src), "cyan" if src.committed else "green"))
            self.markdown = self.markdown or (lambda src: markdown_tables(data(src)))
            if extra is not None:
                self.extra = self.extra or (lambda: rich_tables(extra(), "yellow"))
                self.extra_markdown = self.extra_markdown or (lambda: markdown_tables(extra()))


GENERIC = View(data=lambda src: _generic_tables(src))


def table_view(tables: Callable[[list[Measurement], str], list[TableData]], *,
               extra: Callable[[], list[TableData]] | None = None,
               plot: Callable[[Source, Path, str], list[Path]] | None = None) -> View:
    """A suite's :class:`View` from ``tables(records, label)``, the function that builds its leaderboard tables
    from one source, and ``extra()`` (e.g. a paper's reported numbers)."""
    return View(data=lambda src: tables(src.records, src.label), extra_data=extra, plot=plot)


def source_tables(view: View, src: Source) -> list[TableData]:
    """The view's tables of ``src``, each title naming the machines that measured it (unless the view's title
    already names those of its own records, :func:`board_title`) and whether the numbers are the committed
    reference results or the user's own runs."""
    machine, names = machine_of(src.records), list(machines(src.records))
    tag = "committed results" if src.committed else "your runs"
    out = []
    for title, header, rows, cap in view.data(src):
        if not any(n in title for n in names) and machine not in title:  # board_title named its table's machines
            title += f" ({machine})"
        if any(CONTENDED in str(c) for row in rows for c in row):
            cap += (f" {CONTENDED} timed while other attnbench processes ran on the same machine (listed in the "
                    f"record's metrics.concurrent_attnbench): a slower figure, not comparable.")
        out.append((f"{title} · {tag}", header, rows, cap))
    return out


def _registered(suite: str):
    try:
        return suite_registry.get_suite(suite)
    except UnknownNameError:
        return None


def view_of(suite: str) -> View:
    """The view of the registered suite ``suite`` (``suite_registry.get_suite(suite).view``); the generic view when it
    has none, or for records of a suite that is not registered (e.g. ingested ``pytest-benchmark`` records)."""
    registered = _registered(suite)
    view = registered.view if registered is not None else None
    return view or GENERIC


def print_tables(suite: str, sources: list[Source], console=None, fmt: str = "auto") -> int:
    """Render every source's leaderboard tables for ``suite`` (:func:`render_tables`); returns how many tables
    were printed."""
    view = view_of(suite)
    n = 0
    for src in sources:
        if view.data is None:  # a view that renders itself (no TableData): natural width
            for t in view.rich(src):
                (console or default_console()).print(t)
                n += 1
            continue
        n += len(render_tables(source_tables(view, src), console=console, fmt=fmt,
                               style="cyan" if src.committed else "green"))
    return n


def table(suite: str, *, db: str | None = None, setting: str | None = None, committed: bool = True,
          console=None, fmt: str = "auto", reported: bool = False) -> int:
    """``attnbench table <suite>``: the user's store, then the committed reference results (labelled), then the
    suite's extra tables (the papers' reported numbers): one line each, or whole with ``reported``; ``fmt`` as
    :func:`render_tables` (auto: rich tables fitted to a terminal, markdown when piped). A ``db`` given
    explicitly (``--db``) that does not exist is an error."""
    console = console or default_console()
    fmt = table_format(fmt, console)
    if db is not None and not resolve_db(db).exists():
        raise AttnbenchError(f"--db {db}: no such results store (nothing was run with it yet; check the path)")
    sources = load_sources(suite, db=db, include_committed=committed, setting=setting)
    if not sources and _registered(suite) is None:
        suite_registry.get_suite(suite)  # nothing of that name anywhere: the did-you-mean error of the registry
    if not sources:
        have = reference_files(suite)
        where = (f"committed results/{suite}/ has none" + (f" of setting {setting}" if setting else "")
                 if have else f"no committed results/{suite}/*.jsonl")
        console.print(f"no {suite} results: nothing in {resolve_db(db)} and {where}; run `attnbench run {suite}` "
                      f"first")
    n = print_tables(suite, sources, console=console, fmt=fmt)
    view = view_of(suite)
    if view.extra_data is not None and not reported:
        extra = view.extra_data() if fmt in ("table", "md") else []  # json / tsv stay machine-readable
        if extra:
            console.print(f"{len(extra)} reported table(s), published numbers not measured here "
                          f"(`attnbench table {suite} --reported` prints them whole):", highlight=False)
            for title, _, rows, _ in extra:
                console.print(f"  {title.split(' — ')[0]}: {len(rows)} rows", highlight=False)
    elif view.extra_data is not None:
        n += len(render_tables(view.extra_data(), console=console, fmt=fmt, style="yellow"))
    elif view.extra is not None:
        for t in view.extra():
            console.print(t)
            n += 1
    return n


def plot(suite: str, *, out: str | Path | None = None, db: str | None = None, source: str = "auto") -> list[Path]:
    """``attnbench plot <suite>``: PNGs of the store's records (``source='store'``), of the committed ones
    (``'committed'``), or of the store if it has any, else the committed ones (``'auto'``)."""
    view = view_of(suite)
    if view.plot is None:
        if _registered(suite) is None:
            suite_registry.get_suite(suite)  # an unknown name: did-you-mean
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
