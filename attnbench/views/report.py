"""``attnbench report``: one self-contained page of every suite's results, to send or to paste into a pull request.

The page renders what ``attnbench table`` prints and nothing else: for each registered suite, the tables its view
builds (:func:`attnbench.views.tables.source_tables` of every :func:`attnbench.views.sources.load_sources` source:
the user's store and the committed reference results), the view's extra tables (a paper's reported numbers, labelled
as such), the view's plots (:attr:`attnbench.views.tables.View.plot`, drawn afresh) and the figures records name
(``metrics["figure"]``, e.g. a check's figure beside its verdict), and under each measured table its provenance: the
machine with its measured fp32 matmul GFLOP/s, commits with their dirty flag, threads, package versions.

Two formats. ``html``: one file that opens with no network (figures inline as base64 PNG, CSS and a few lines of
sorting script inline, system fonts), readable printed and on a narrow screen. ``md``: the same as GitHub
markdown, figures as PNG files in ``<name>_files/`` beside it. Like the rest of the core, this module names no
suite: it reaches them through the registry and their views.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import html
import os
import re
import tempfile
from pathlib import Path
from typing import Iterable
from urllib.parse import quote

from attnbench.api import suites as suite_registry
from attnbench.core.errors import AttnbenchError
from attnbench.results.paths import project_root, resolve_db
from attnbench.results.provenance import git_info
from attnbench.results.records import Measurement
from attnbench.views import tables
from attnbench.views.export import environment_markdown
from attnbench.views.render import markdown_tables, TableData, TEXT_COLUMNS
from attnbench.views.rows import label_of, slug
from attnbench.views.sources import latest, load_sources, machine_of, results_dirs, Source

FORMATS = ("auto", "html", "md")


@dataclasses.dataclass
class Figure:
    """One PNG of the page: its bytes, a file name for the markdown form, a caption."""
    name: str
    png: bytes
    caption: str
    outcome: str = ""   # e.g. a check's verdict, shown after the caption


@dataclasses.dataclass
class Board:
    """One table of the page: the view's :data:`attnbench.views.render.TableData`, whether it is measured or a paper's
    reported numbers, and (measured) its provenance as ``(field, value)`` rows."""

    table: TableData
    reported: bool = False
    provenance: list[tuple[str, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class FigureGroup:
    """Figures that belong together (one check, one source's plots), with a heading and an optional line."""
    title: str
    note: str
    figures: list[Figure]
    wide: bool = False   # large plots: fewer per row


@dataclasses.dataclass
class Section:
    """One suite: its boards, its figure groups, and notes (no results, a figure a record names but that is
    missing)."""

    suite: str
    help: str
    boards: list[Board] = dataclasses.field(default_factory=list)
    groups: list[FigureGroup] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Report:
    sections: list[Section]
    sources: str
    generated: str

    @property
    def n_tables(self) -> int:
        return sum(len(s.boards) for s in self.sections)

    @property
    def n_reported(self) -> int:
        return sum(b.reported for s in self.sections for b in s.boards)

    @property
    def n_figures(self) -> int:
        return sum(len(g.figures) for s in self.sections for g in s.groups)


@dataclasses.dataclass
class Written:
    """What :func:`write_report` wrote: the page, its figure files (markdown), and how many tables and figures
    the page holds (what a test counts in the rendered page)."""

    path: Path
    fmt: str
    tables: int
    figures: int
    suites: list[str]
    reported: int = 0   # of the tables, the papers' reported ones
    files: list[Path] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        extra = f" (+ {len(self.files)} PNG files in {self.files[0].parent})" if self.files else ""
        return (f"wrote {self.path}{extra}: {len(self.suites)} suite(s), {self.tables} table(s), "
                f"{self.figures} figure(s)")


# --- collecting ----------------------------------------------------------------------------------------------------
def provenance_rows(records: list[Measurement]) -> list[tuple[str, str]]:
    """The provenance of ``records`` as rows: the machine (:func:`attnbench.views.sources.machine_of`, with the fp32 matmul
    GFLOP/s measured where the run recorded it) and the export's environment block
    (:func:`attnbench.views.export.environment_markdown`: threads, date, commits with their dirty flag, packages,
    points), read back from its two-column form so the fields are defined in one place."""
    if not records:
        return []
    by_machine: dict[tuple, list[Measurement]] = {}
    for r in records:
        by_machine.setdefault((r.device, r.device_name or ""), []).append(r)
    machines = []
    for (device, _), recs in sorted(by_machine.items()):
        m = machine_of(recs)   # each machine with the GFLOP/s measured on it
        machines.append(f"{device} · {m}" + ("" if "GFLOP/s" in m else " (matmul GFLOP/s not recorded)"))
    rows = [("machine", "; ".join(machines))]
    for line in environment_markdown(records).splitlines()[2:]:
        key, _, value = line.strip().strip("|").partition(" | ")
        key, value = key.strip(), value.strip()
        if key and key != "device":  # the machine row above names the devices
            rows.append((key, value))
    return rows


def _records_of(title: str, records: list[Measurement]) -> list[Measurement]:
    """The records a table shows: those of the one setting its title names, else all of the source's."""
    settings = {r.setting for r in records}
    named = [s for s in settings if s and s in title]
    named = [s for s in named if not any(s != o and s in o for o in named)]   # lra/tiny-long, not lra/tiny
    if len(named) == 1:
        return [r for r in records if r.setting == named[0]]
    return records


def _resolve(path: str) -> Path | None:
    p = Path(path)
    if p.is_absolute():
        return p if p.is_file() else None
    for base in (Path.cwd(), project_root(), *(d.parent for d in results_dirs())):
        if (base / p).is_file():
            return base / p
    return None


def _record_figures(src: Source, section: Section) -> None:
    """The figures ``src``'s records name (``metrics["figure"]``), one group per task, the latest record of each
    figure; a named figure that is not on disk becomes a note."""
    by_path: dict[str, Measurement] = {}
    for r in latest(src.records, preferred=("ok", "skipped")):
        fig = r.metrics.get("figure")
        if isinstance(fig, str) and fig:
            by_path[fig] = r
    groups: dict[str, list[tuple[str, Measurement]]] = {}
    for fig, r in by_path.items():
        groups.setdefault(r.task, []).append((fig, r))
    order = {r.config_hash: i for i, r in enumerate(src.records)}   # the order the run measured them
    for task, items in sorted(groups.items(), key=lambda kv: min(order.get(r.config_hash, 0) for _, r in kv[1])):
        items.sort(key=lambda fr: order.get(fr[1].config_hash, 0))
        figures, missing = [], []
        for fig, r in items:
            p = _resolve(fig)
            if p is None:
                missing.append(fig)
                continue
            what = " · ".join(str(x) for x in (label_of(r), r.params.get("input")) if x)
            outcome = r.metrics.get("verdict") or r.status
            figures.append(Figure(p.name, p.read_bytes(), what, str(outcome)))
        claims = {str(r.metrics.get("claim")) for _, r in items if r.metrics.get("claim")}
        if figures:
            section.groups.append(FigureGroup(f"{task} · {tag_of(src)}", claims.pop() if len(claims) == 1 else "",
                                              figures))
        if missing:
            section.notes.append(f"{task}: {len(missing)} figure(s) named by the records are not on disk "
                                 f"(e.g. {missing[0]}); rerun the suite to draw them.")


def tag_of(src: Source) -> str:
    return "committed results" if src.committed else "your runs"


def _view_plots(view: tables.View, suite: str, src: Source, section: Section) -> None:
    """The view's plots of ``src``, drawn now into a temporary directory and kept as bytes."""
    with tempfile.TemporaryDirectory(prefix="attnbench-report-") as d:
        prefix = src.path.stem if src.committed and src.path else suite
        paths = view.plot(src, Path(d), prefix)
        figures = [Figure(p.name, p.read_bytes(), p.stem.replace("_", " ")) for p in paths if p.is_file()]
    if figures:
        section.groups.append(FigureGroup(f"plots · {tag_of(src)}", src.label, figures, wide=True))


def collect(suites: Iterable[str] | None = None, *, db: str | None = None, include_store: bool = True,
            include_committed: bool = True) -> Report:
    """Every suite's tables, figures and provenance (``suites``: all registered ones by default)."""
    names = list(suites) if suites else suite_registry.suite_names()
    sections = []
    for name in names:
        suite = suite_registry.get_suite(name)
        view = tables.view_of(name)
        section = Section(name, suite.help)
        sources = load_sources(name, db=db, include_committed=include_committed, include_store=include_store)
        for src in sources:
            if view.data is None:  # a view that renders only itself: its markdown, as a note
                section.notes.append(view.markdown(src))
                continue
            for t in tables.source_tables(view, src):
                section.boards.append(Board(t, provenance=provenance_rows(_records_of(t[0], src.records))))
        if not sources:
            section.notes.append(f"No {name} results in these sources: run `attnbench run {name}` first.")
        if view.extra_data is not None:
            section.boards += [Board(t, reported=True) for t in view.extra_data()]
        for src in sources:
            if view.plot is not None:
                _view_plots(view, name, src, section)
            _record_figures(src, section)
        sections.append(section)
    where = []
    if include_store:
        path = resolve_db(db)
        where.append(f"your store ({path})" if path.exists() else f"your store (none yet at {path})")
    if include_committed:
        where.append("the committed reference results (results/<suite>/*.jsonl)")

    g = git_info()
    commit = (g["commit"] or "unknown commit")[:10] + (" (dirty tree)" if g["dirty"] else "")
    generated = f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC by attnbench at {commit}"
    return Report(sections, " and ".join(where) or "no sources", generated)


# --- HTML ------------------------------------------------------------------------------------------------------
def _e(s: object) -> str:
    return html.escape(str(s), quote=True)


#: Cells that are an outcome get a colour (presentation only: the words are the views').
_OUTCOMES = {"holds": "good", "ok": "good", "fails": "bad", "failed": "bad", "incorrect": "bad", "oom": "bad",
             "timeout": "bad", "interrupted": "warn", "inconclusive": "warn", "skipped": "muted"}

_NUMBER = re.compile(r"^[-+−]?(\d|\.\d|inf|nan)", re.IGNORECASE)


def _numeric_columns(header: list[str], rows: list[list[object]]) -> list[bool]:
    """Which columns hold numbers (right-aligned): most of their cells that are not a dash start with one."""
    out = []
    for i in range(len(header)):
        cells = [str(r[i]).strip() for r in rows if i < len(r) and str(r[i]).strip() not in ("", "-", "·")]
        prose = header[i].startswith(TEXT_COLUMNS)
        out.append(i > 0 and not prose and bool(cells) and sum(bool(_NUMBER.match(c)) for c in cells) * 2 >= len(cells))
    return out


def _line(line: str) -> str:
    """One line of a cell, escaped; a parenthesised part (``69.61 (seeds ± 32.01, n=3)``) is its own unbreakable
    piece, so a printed page may put it under the number without ever splitting a number."""
    head, sep, rest = line.partition(" (")
    if not sep:
        return _e(line)
    return f'<span class="nw">{_e(head)}</span> <span class="nw">{_e("(" + rest)}</span>'


def _cell(text_col: bool, numeric: bool, cell: object) -> str:
    text = str(cell)
    classes = ["num" if numeric else "name"]
    if text_col:  # the views' prose columns may wrap
        classes.append("text")
    word = text.strip().lower()
    if word in _OUTCOMES:
        classes.append(_OUTCOMES[word])
    elif text.rstrip().endswith("^"):   # the views' mark of a column's best
        classes.append("best")
    lines = [_e(line) if text_col else _line(line) for line in text.splitlines()]
    if not numeric and not text_col:  # a spec (gated_deltanet+nala:qk_norm=k) may break after + and :
        lines = [ln.replace("+", "+<wbr>").replace(":", ":<wbr>") for ln in lines]
    return f'<td class="{" ".join(classes)}">{"<br>".join(lines) or "&nbsp;"}</td>'


def _board(b: Board, anchor: str) -> dict:
    """What the template needs of one board: its header cells and its rows as cells of escaped HTML."""
    title, header, rows, caption = b.table
    texts = [h.startswith(TEXT_COLUMNS) for h in header]
    nums = _numeric_columns(header, rows)
    return {"anchor": anchor, "reported": b.reported, "title": title, "caption": caption, "provenance": b.provenance,
            "badge": "reported by the paper, not measured" if b.reported else "measured",
            "header": [(h, ("num" if n else "name") + (" text" if t else "")) for h, t, n in zip(header, texts, nums)],
            "rows": [[_cell(t, n, c) for t, n, c in zip(texts, nums, row)] for row in rows]}


def _figure(f: Figure) -> dict:
    return {"data": base64.b64encode(f.png).decode("ascii"), "caption": f.caption, "outcome": f.outcome,
            "outcome_class": _OUTCOMES.get(f.outcome.lower(), "") if f.outcome else "",
            "alt": f"{f.caption}: {f.outcome}" if f.outcome else f.caption}


def render_html(report: Report) -> str:
    """The page as one HTML document (no external resource of any kind): ``templates/report.html`` with its CSS
    and sorting script inline."""
    sections = []
    for s in report.sections:
        sid = f"suite-{slug(s.suite)}"
        measured = sum(not b.reported for b in s.boards)
        reported = len(s.boards) - measured
        figs = sum(len(g.figures) for g in s.groups)
        counts = ", ".join(p for p in (f"{measured} measured table(s)", reported and f"{reported} reported",
                                       figs and f"{figs} figure(s)") if p)
        sections.append({
            "id": sid, "suite": s.suite, "help": s.help, "notes": s.notes, "counts": counts,
            "mine": [_board(b, f"{sid}-t{i}") for i, b in enumerate(x for x in s.boards if not x.reported)],
            "theirs": [_board(b, f"{sid}-r{i}") for i, b in enumerate(x for x in s.boards if x.reported)],
            "groups": [{"title": g.title, "note": g.note, "wide": g.wide, "figures": [_figure(f) for f in g.figures]}
                       for g in s.groups]})
    return _templates().get_template("report.html").render(report=report, sections=sections)


def _templates():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
                              autoescape=True, keep_trailing_newline=True)


# --- markdown ----------------------------------------------------------------------------------------------------
def render_markdown(report: Report, fig_dir: str) -> tuple[str, list[tuple[str, bytes]]]:
    """The page as GitHub markdown and the PNG files it links (``fig_dir``/name, relative to the page)."""
    intro = (f"Generated {report.generated}. Sources: {report.sources}. {report.n_tables} table(s), "
             f"{report.n_figures} figure(s). Tables marked *reported* are numbers printed in the papers, not measured "
             f"here.")
    lines = ["# attnbench report", "", intro, ""]
    files: list[tuple[str, bytes]] = []
    used: set[str] = set()
    for s in report.sections:
        lines += [f"## {s.suite}", "", s.help, ""]
        lines += [f"> {n}" if "\n" not in n else n for n in s.notes]
        for b in s.boards:
            title, header, rows, caption = b.table
            if b.reported:
                title = title if title.startswith("reported") else f"reported (not measured by attnbench): {title}"
            lines.append(markdown_tables([(title, header, rows, caption)]))
            if b.provenance:
                lines += ["Provenance:", ""] + [f"- **{k}**: {v}" for k, v in b.provenance] + [""]
        for g in s.groups:
            lines += [f"#### Figures: {g.title}", ""] + ([g.note, ""] if g.note else [])
            for f in g.figures:
                name = f"{slug(s.suite)}-{f.name}"
                while name in used:
                    name = "x" + name
                used.add(name)
                files.append((name, f.png))
                cap = f"{f.caption}: {f.outcome}" if f.outcome else f.caption
                lines += [f"![{cap}]({quote(fig_dir)}/{quote(name)})", f"*{cap}*", ""]
    return "\n".join(lines) + "\n", files


# --- writing -----------------------------------------------------------------------------------------------------
def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _check_out(out: Path) -> None:
    """Fail before any work if ``out`` cannot be written."""
    if out.is_dir():
        raise AttnbenchError(f"--out {out}: is a directory; give a file name, e.g. {out / 'report.html'}")
    blocker = next((d for d in out.parents if d.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise AttnbenchError(f"--out {out}: {blocker} is a file, not a directory; choose another path")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = out.with_name(out.name + ".probe")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise AttnbenchError(f"--out {out}: cannot write there ({e.strerror or e}); choose a writable path") from None


def write_report(out: str | os.PathLike, *, fmt: str = "auto", suites: Iterable[str] | None = None,
                 db: str | None = None, include_store: bool = True, include_committed: bool = True) -> Written:
    """``attnbench report``: check the arguments, collect, render (``fmt``: html, md, or auto: md for a ``.md``
    file, else html) and write atomically. Bad input raises a one-line :class:`AttnbenchError` before any work."""
    out = Path(out).expanduser()
    f = (fmt or "auto").lower()
    if f not in FORMATS:
        raise AttnbenchError(f"--format must be html or md (or auto: by the --out suffix), got {fmt!r}")
    if f == "auto":
        f = "md" if out.suffix.lower() in (".md", ".markdown") else "html"
    names = [n.strip() for s in (suites or []) for n in str(s).split(",") if n.strip()]
    for n in names:
        suite_registry.get_suite(n)  # unknown name: the registry's did-you-mean error
    if db is not None and include_store and not resolve_db(db).exists():
        raise AttnbenchError(f"--db {db}: no such results store (nothing was run with it yet; check the path)")
    if not include_store and not include_committed:
        raise AttnbenchError("--no-store and --no-committed leave nothing to report; drop one of them")
    _check_out(out)
    report = collect(names or None, db=db, include_store=include_store, include_committed=include_committed)
    written = Written(out, f, report.n_tables, report.n_figures, [s.suite for s in report.sections],
                      report.n_reported)
    if f == "html":
        _atomic_write(out, render_html(report).encode("utf-8"))
        return written
    fig_dir = out.with_name(out.stem + "_files")
    text, files = render_markdown(report, fig_dir.name)
    if files:
        fig_dir.mkdir(exist_ok=True)
        for name, png in files:
            _atomic_write(fig_dir / name, png)
            written.files.append(fig_dir / name)
    _atomic_write(out, text.encode("utf-8"))
    return written
