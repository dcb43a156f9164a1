"""``attnbench report``: one self-contained page of every suite's results, to send or to paste into a pull request.

The page renders what ``attnbench table`` prints and nothing else: for each registered suite, the tables its view
builds (:func:`attnbench.tables.source_tables` of every :func:`attnbench.tables.load_sources` source: the user's
store and the committed reference results), the view's extra tables (a paper's reported numbers, labelled as
such), the view's plots (:attr:`attnbench.tables.View.plot`, drawn afresh) and the figures records name
(``metrics["figure"]``, e.g. a check's figure beside its verdict), and under each measured table its provenance:
the machine with its measured fp32 matmul GFLOP/s, commits with their dirty flag, threads, package versions.

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

from . import registry, tables
from .errors import AttnbenchError
from .store import Measurement, project_root, resolve_db

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
    """One table of the page: the view's :data:`attnbench.tables.TableData`, whether it is measured or a paper's
    reported numbers, and (measured) its provenance as ``(field, value)`` rows."""

    table: tables.TableData
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
    """The provenance of ``records`` as rows: the machine (:func:`attnbench.tables.machine_of`, with the fp32 matmul
    GFLOP/s measured where the run recorded it) and the export's environment block
    (:func:`attnbench.tables.environment_markdown`: threads, date, commits with their dirty flag, packages,
    points), read back from its two-column form so the fields are defined in one place."""
    if not records:
        return []
    by_machine: dict[tuple, list[Measurement]] = {}
    for r in records:
        by_machine.setdefault((r.device, r.device_name or ""), []).append(r)
    machines = []
    for (device, _), recs in sorted(by_machine.items()):
        m = tables.machine_of(recs)   # each machine with the GFLOP/s measured on it
        machines.append(f"{device} · {m}" + ("" if "GFLOP/s" in m else " (matmul GFLOP/s not recorded)"))
    rows = [("machine", "; ".join(machines))]
    for line in tables.environment_markdown(records).splitlines()[2:]:
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
    for base in (Path.cwd(), project_root(), *(d.parent for d in tables.results_dirs())):
        if (base / p).is_file():
            return base / p
    return None


def _record_figures(src: tables.Source, section: Section) -> None:
    """The figures ``src``'s records name (``metrics["figure"]``), one group per task, the latest record of each
    figure; a named figure that is not on disk becomes a note."""
    by_path: dict[str, Measurement] = {}
    for r in tables.latest(src.records, preferred=("ok", "skipped")):
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
            what = " · ".join(str(x) for x in (tables.label_of(r), r.params.get("input")) if x)
            outcome = r.metrics.get("verdict") or r.status
            figures.append(Figure(p.name, p.read_bytes(), what, str(outcome)))
        claims = {str(r.metrics.get("claim")) for _, r in items if r.metrics.get("claim")}
        if figures:
            section.groups.append(FigureGroup(f"{task} · {tag_of(src)}", claims.pop() if len(claims) == 1 else "",
                                              figures))
        if missing:
            section.notes.append(f"{task}: {len(missing)} figure(s) named by the records are not on disk "
                                 f"(e.g. {missing[0]}); rerun the suite to draw them.")


def tag_of(src: tables.Source) -> str:
    return "committed results" if src.committed else "your runs"


def _view_plots(view: tables.View, suite: str, src: tables.Source, section: Section) -> None:
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
    names = list(suites) if suites else registry.suite_names()
    sections = []
    for name in names:
        suite = registry.get_suite(name)
        view = tables.view_of(name)
        section = Section(name, suite.help)
        sources = tables.load_sources(name, db=db, include_committed=include_committed, include_store=include_store)
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
    from .provenance import git_info

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

CSS = """
:root{--fg:#1b1f24;--muted:#57606a;--line:#d0d7de;--bg2:#f6f8fa;--acc:#0b5cad;--rep:#8a5a00;--good:#1a7f37;
--bad:#c62828;--warn:#9a6700}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0 auto;max-width:1180px;padding:16px;color:var(--fg);background:#fff;
font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
h1{font-size:1.6em;margin:.2em 0}
h2{font-size:1.3em;margin:1.6em 0 .3em;padding-top:.4em;border-top:2px solid var(--line)}
h3{font-size:1.05em;margin:1.2em 0 .3em}h4{font-size:.98em;margin:0 0 .35em}
h1,h2,h3,h4,p,li,dd,figcaption{overflow-wrap:anywhere}
a{color:var(--acc)}
.meta,.cap,.prov,.note,figcaption{color:var(--muted);font-size:.85em}
nav ul{padding-left:1.2em;margin:.3em 0}nav li{margin:.1em 0}
.board{margin:1em 0 1.6em;padding:10px 12px;border:1px solid var(--line);border-radius:6px}
.board.reported{border-left:5px solid var(--rep);background:#fffaf0}
.badge{display:inline-block;font-size:.72em;font-weight:600;letter-spacing:.02em;padding:1px 6px;margin-right:6px;
border-radius:10px;vertical-align:1px;background:var(--acc);color:#fff}
.reported .badge{background:var(--rep)}
.scroll{overflow-x:auto;max-width:100%;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;font-size:.86em;font-variant-numeric:tabular-nums}
th,td{padding:3px 8px;border-bottom:1px solid var(--line);vertical-align:top;text-align:left;white-space:nowrap}
th.num,td.num{text-align:right}
td:first-child{position:sticky;left:0;background:inherit;z-index:1;box-shadow:1px 0 0 var(--line)}
tbody tr{background:#fff}
td.text{white-space:normal;min-width:14em;max-width:32em}.nw{white-space:nowrap}
thead th{background:var(--bg2)}
thead th:first-child{position:sticky;left:0;z-index:2}
th button{all:unset;cursor:pointer;font-weight:600}th button:focus-visible{outline:2px solid var(--acc)}
th[aria-sort=ascending] button::after{content:" \\25B2";font-size:.7em}
th[aria-sort=descending] button::after{content:" \\25BC";font-size:.7em}
tbody tr:nth-child(even){background:#fbfcfd}
td.best{font-weight:700}td.good{color:var(--good);font-weight:600}td.bad{color:var(--bad);font-weight:600}
td.warn{color:var(--warn);font-weight:600}td.muted{color:var(--muted)}
figcaption .good{color:var(--good)}figcaption .bad{color:var(--bad)}figcaption .warn{color:var(--warn)}
.cap{margin:.45em 0 0}
.prov{margin:.5em 0 0;display:grid;grid-template-columns:max-content 1fr;gap:0 10px;border-top:1px dashed var(--line);
padding-top:.4em}
.prov dt{font-weight:600}.prov dd{margin:0}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,340px),1fr));gap:12px}
.figs.wide{grid-template-columns:repeat(auto-fill,minmax(min(100%,520px),1fr))}
figure.fig{margin:0;border:1px solid var(--line);border-radius:6px;padding:6px;break-inside:avoid}
figure.fig img{display:block;width:100%;height:auto}
.note{border-left:3px solid var(--warn);padding:2px 8px;white-space:pre-wrap}
@media (max-width:600px){body{padding:10px;font-size:14px}.board{padding:8px}th,td{padding:2px 6px}}
@media print{
body{max-width:none;padding:0;font-size:10pt}nav,th button::after{display:none}
a{color:inherit;text-decoration:none}
h2{break-before:page;border-top:none}section:first-of-type h2{break-before:auto}
h2,h3,h4{break-after:avoid}tr,figure.fig,.prov{break-inside:avoid}
.scroll{overflow:visible}table{font-size:7.5pt}th,td{padding:2px 4px}th,td.num{white-space:normal}
td.name,td.text{white-space:normal;min-width:6em}td:first-child,thead th:first-child{position:static}
.board.reported{background:none}
.figs,.figs.wide{grid-template-columns:1fr 1fr}
}
"""

# Click a column header to sort its rows (numbers by value with their unit, text alphabetically; again to reverse).
JS = """
(function(){
var U={ns:1e-9,'\\u00b5s':1e-6,us:1e-6,ms:1e-3,s:1,B:1,KiB:1024,MiB:1048576,GiB:1073741824,k:1e3};
function key(t){var m=t.replace(/,/g,'').match(/-?\\d+(?:\\.\\d+)?(?:e[-+]?\\d+)?/i);
if(!m)return[1,t.toLowerCase()];var v=parseFloat(m[0]);
var u=t.slice(m.index+m[0].length).match(/^\\s*(ns|\\u00b5s|us|ms|s|B|KiB|MiB|GiB|k)\\b/);
if(u)v*=U[u[1]];return[0,v];}
function cmp(a,b){if(a[0]!==b[0])return a[0]-b[0];return a[1]<b[1]?-1:a[1]>b[1]?1:0;}
document.querySelectorAll('table.board-table').forEach(function(tb){
tb.querySelectorAll('thead th').forEach(function(th,i){
var b=th.querySelector('button');if(!b)return;
b.addEventListener('click',function(){
var dir=th.getAttribute('aria-sort')==='ascending'?-1:1;
tb.querySelectorAll('thead th').forEach(function(h){h.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',dir>0?'ascending':'descending');
var body=tb.tBodies[0],rows=Array.prototype.slice.call(body.rows);
rows.sort(function(x,y){return dir*cmp(key(x.cells[i].textContent),key(y.cells[i].textContent));});
rows.forEach(function(r){body.appendChild(r);});});});});
})();
"""


_NUMBER = re.compile(r"^[-+−]?(\d|\.\d|inf|nan)", re.IGNORECASE)


def _numeric_columns(header: list[str], rows: list[list[object]]) -> list[bool]:
    """Which columns hold numbers (right-aligned): most of their cells that are not a dash start with one."""
    out = []
    for i in range(len(header)):
        cells = [str(r[i]).strip() for r in rows if i < len(r) and str(r[i]).strip() not in ("", "-", "·")]
        prose = header[i].startswith(tables.TEXT_COLUMNS)
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


def _board_html(b: Board, anchor: str) -> str:
    title, header, rows, caption = b.table
    badge = "reported by the paper, not measured" if b.reported else "measured"
    texts = [h.startswith(tables.TEXT_COLUMNS) for h in header]
    nums = _numeric_columns(header, rows)
    ths = "".join(f'<th scope="col" class="{"num" if n else "name"}{" text" if t else ""}"><button type="button" '
                  f'title="sort by {_e(h)}">{_e(h)}</button></th>' for h, t, n in zip(header, texts, nums))
    trs = "\n".join("<tr>" + "".join(_cell(t, n, c) for t, n, c in zip(texts, nums, row)) + "</tr>" for row in rows)
    prov = ""
    if b.provenance:
        prov = ('<dl class="prov">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in b.provenance)
                + "</dl>")
    return (f'<div class="board{" reported" if b.reported else ""}" id="{anchor}">\n'
            f'<h4><span class="badge">{_e(badge)}</span>{_e(title)}</h4>\n'
            f'<div class="scroll"><table class="board-table"><thead><tr>{ths}</tr></thead>\n<tbody>\n{trs}\n'
            f'</tbody></table></div>\n<p class="cap">{_e(caption)}</p>{prov}</div>')


def _figure_html(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    outcome = ""
    if f.outcome:
        cls = _OUTCOMES.get(f.outcome.lower(), "")
        outcome = f': <b class="{cls}">{_e(f.outcome)}</b>'
    alt = f"{f.caption}: {f.outcome}" if f.outcome else f.caption
    return (f'<figure class="fig"><img src="data:image/png;base64,{data}" alt="{_e(alt)}">'
            f"<figcaption>{_e(f.caption)}{outcome}</figcaption></figure>")


def render_html(report: Report) -> str:
    """The page as one HTML document (no external resource of any kind)."""
    toc, body = [], []
    for s in report.sections:
        sid = f"suite-{tables.slug(s.suite)}"
        measured = sum(not b.reported for b in s.boards)
        reported = len(s.boards) - measured
        figs = sum(len(g.figures) for g in s.groups)
        counts = ", ".join(p for p in (f"{measured} measured table(s)", reported and f"{reported} reported",
                                       figs and f"{figs} figure(s)") if p)
        toc.append(f'<li><a href="#{sid}">{_e(s.suite)}</a> — {_e(counts)}</li>')
        parts = [f'<section id="{sid}">\n<h2>{_e(s.suite)}</h2>\n<p class="meta">{_e(s.help)}</p>']
        parts += [f'<p class="note">{_e(n)}</p>' for n in s.notes]
        mine = [b for b in s.boards if not b.reported]
        theirs = [b for b in s.boards if b.reported]
        if mine:
            parts.append("<h3>Leaderboards</h3>")
            parts += [_board_html(b, f"{sid}-t{i}") for i, b in enumerate(mine)]
        if theirs:
            parts.append("<h3>Reported in the papers</h3>\n<p class=\"meta\">Numbers the papers print, as data "
                         "(not measured by attnbench; other hardware, budgets and protocols).</p>")
            parts += [_board_html(b, f"{sid}-r{i}") for i, b in enumerate(theirs)]
        for g in s.groups:
            wide = " wide" if g.wide else ""
            parts.append(f"<h3>Figures: {_e(g.title)}</h3>" + (f'<p class="meta">{_e(g.note)}</p>' if g.note else "")
                         + f'<div class="figs{wide}">' + "".join(_figure_html(f) for f in g.figures) + "</div>")
        parts.append("</section>")
        body.append("\n".join(parts))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>attnbench report</title>
<style>{CSS}</style>
</head>
<body>
<header>
<h1>attnbench report</h1>
<p class="meta">Generated {_e(report.generated)}. Sources: {_e(report.sources)}.
{report.n_tables} table(s), {report.n_figures} figure(s). Click a column header to sort its rows.</p>
<p class="meta">Marks in the tables are the suites' own and are explained in each caption (for example ^ best of a
column, ≈ not significantly different from the best, † at chance, ‡ timed while other attnbench processes ran).
Tables marked <em>reported</em> are numbers printed in the papers, not measured here.</p>
</header>
<nav><h3>Suites</h3><ul>
{chr(10).join(toc)}
</ul></nav>
<main>
{chr(10).join(body)}
</main>
<script>{JS}</script>
</body>
</html>
"""


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
            lines.append(tables.markdown_tables([(title, header, rows, caption)]))
            if b.provenance:
                lines += ["Provenance:", ""] + [f"- **{k}**: {v}" for k, v in b.provenance] + [""]
        for g in s.groups:
            lines += [f"#### Figures: {g.title}", ""] + ([g.note, ""] if g.note else [])
            for f in g.figures:
                name = f"{tables.slug(s.suite)}-{f.name}"
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
        registry.get_suite(n)  # unknown name: the registry's did-you-mean error
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
