"""The papers' reported numbers: data files in one schema, loaded, checked and rendered by one function.

Reported numbers are transcribed from papers, never measured: they are not in the results store and never share a
table (or a column) with measured rows. A suite keeps them as TOML files in its ``reported/`` folder (package data),
read in file-name order; each file holds the tables of one paper:

.. code-block:: toml

    paper = "MixA"                           # short name of the paper (for filtering)
    citation = "Ahmed, Li, ..., 'MixA: ...' (ICCV 2025)"   # authors, title, where it appeared
    name_header = "method [attnbench name]"  # optional: header of the first column (this is the default)
    caption_end = "..."                      # optional: a sentence ending every caption of this file
    columns = [ ... ]                        # optional: the columns of every table that declares none

    [[table]]
    label = "reported (MixA Table 5, ImageNet-1k, DeiT-T all-linear)"   # unique within the suite
    source = "Table 5 'Comparison with ...'" # where in the paper: table (or section) number and caption
    setting = "imagenet-1k/deit-finetune (...)"  # the setting the numbers belong to (never mixed with another)
    notes = "..."                            # what a reader must know to compare (recipe, caveats)
    ablation = false                         # optional: an ablation table
    leaderboard = true                       # optional: shown by ``attnbench table``; default: not an ablation
    columns = [                              # in print order
      {key = "top1", header = "top-1 (%)", unit = "%", direction = "higher", decimals = 1},
    ]
    rows = [                                 # one row a line, in the paper's order
      {method = "Stella (Ours)", attention = "stella", top1 = 73.71, note = "..."},
    ]

A column: ``key`` (the row field), ``header`` (as printed), ``unit``, ``direction`` (``higher`` / ``lower`` is
better), ``decimals`` (at least this many; more where the transcribed value has them, so a number prints as the
paper printed it), ``type`` (``number``, the default, or ``text``), ``suffix`` and ``missing`` (what an absent value
prints, default ``-``). A ``%`` column holds values in [0, 100]. A row: ``method`` as printed in the paper, then
``attention`` (a registered attnbench mechanism, with its ``options``) or ``variant`` (a suite's own model variant),
one field per column, and an optional ``note`` (the table gets a "note" column when a row has one).

Every problem is one :class:`ReportedError` line that names the file and line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import tomllib
from pathlib import Path
from typing import Any, Iterable

from attnbench.api import registry
from attnbench.core.errors import AttnbenchError

Number = int | float
TableData = tuple[str, list[str], list[list[str]], str]  # as attnbench.views.render.TableData (views sit above results)

DEFAULT_NAME_HEADER = "method [attnbench name]"
_FILE_KEYS = {"paper", "citation", "name_header", "caption_end", "columns", "table"}
_TABLE_KEYS = {"label", "source", "setting", "notes", "ablation", "leaderboard", "columns", "rows"}
_COLUMN_KEYS = {"key", "header", "unit", "direction", "decimals", "type", "suffix", "missing"}
_ROW_KEYS = {"method", "attention", "variant", "options", "note"}


class ReportedError(AttnbenchError):
    """A reported-numbers file that does not follow the schema (the message names the file and line)."""


@dataclasses.dataclass(frozen=True)
class ReportedColumn:
    key: str
    header: str
    unit: str = ""
    direction: str = ""  # "higher" or "lower" is better; "" for a descriptive column
    decimals: int = 0
    type: str = "number"  # or "text"
    suffix: str = ""
    missing: str = "-"


@dataclasses.dataclass(frozen=True)
class ReportedRow:
    method: str  # as printed in the paper
    attention: str | None = None  # a registered attnbench mechanism
    variant: str | None = None  # a suite's own model variant (e.g. the LM's "deltanet+nala")
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # the mechanism's options the row used
    values: dict[str, Number | str] = dataclasses.field(default_factory=dict)  # column key -> value
    note: str = ""
    line: int = 0


@dataclasses.dataclass(frozen=True)
class ReportedTable:
    label: str
    paper: str
    citation: str
    source: str
    setting: str
    notes: str
    columns: tuple[ReportedColumn, ...]
    rows: tuple[ReportedRow, ...]
    ablation: bool = False
    leaderboard: bool = True
    name_header: str = DEFAULT_NAME_HEADER
    caption_end: str = ""
    path: str = ""
    line: int = 0

    @property
    def cite(self) -> str:
        """The full reference: paper, then table."""
        return f"{self.citation}, {self.source}"


# --- loading ---------------------------------------------------------------------------------------------------
def _mechanisms() -> set[str]:
    """The built-in attention names (no torch import)."""
    return set(registry.BUILTIN_ATTENTIONS)


class _Lines:
    """Line numbers of the ``[[table]]`` headers and of the one-line entries of their arrays, for error messages."""

    def __init__(self, text: str):
        self.tables: list[int] = []
        self.top: dict[str, list[int]] = {}
        self.items: list[dict[str, list[int]]] = []
        current: dict[str, list[int]] = self.top
        array = None
        for n, line in enumerate(text.splitlines(), 1):
            s = line.strip()
            if s.startswith("[[table]]"):
                self.tables.append(n)
                current, array = {}, None
                self.items.append(current)
                continue
            m = re.match(r"(\w+)\s*=\s*\[", s)
            if m:
                array = m.group(1)
                current.setdefault(array, [])
                s = s[m.end():].strip()
            if array and s.startswith("{"):
                current[array].append(n)

    def table(self, i: int) -> int:
        return self.tables[i] if i < len(self.tables) else 1

    def item(self, i: int | None, array: str, j: int) -> int:
        lines = (self.top if i is None else self.items[i] if i < len(self.items) else {}).get(array, [])
        return lines[j] if j < len(lines) else (1 if i is None else self.table(i))


def _fail(path: str, line: int, msg: str):
    raise ReportedError(f"{path}:{line}: {msg}")


def _columns(raw: Any, path: str, where: int, lines: _Lines, i: int | None) -> tuple[ReportedColumn, ...]:
    if not isinstance(raw, list) or not raw:
        _fail(path, where, "'columns' must be a non-empty array of {key = ..., header = ...} tables")
    out: list[ReportedColumn] = []
    for j, c in enumerate(raw):
        at = lines.item(i, "columns", j)
        if not isinstance(c, dict):
            _fail(path, at, f"column {j + 1} must be a table {{key = ..., header = ...}}")
        unknown = set(c) - _COLUMN_KEYS
        if unknown:
            _fail(path, at, f"unknown column field(s) {sorted(unknown)}; allowed: {sorted(_COLUMN_KEYS)}")
        if not isinstance(c.get("key"), str) or not isinstance(c.get("header"), str):
            _fail(path, at, "a column needs a string 'key' and a string 'header'")
        if c["key"] in _ROW_KEYS or c["key"] in {o.key for o in out}:
            _fail(path, at, f"column key {c['key']!r} is reserved or declared twice")
        if c.get("direction", "") not in ("", "higher", "lower"):
            _fail(path, at, f"column {c['key']!r}: direction must be 'higher' or 'lower', not {c['direction']!r}")
        if c.get("type", "number") not in ("number", "text"):
            _fail(path, at, f"column {c['key']!r}: type must be 'number' or 'text', not {c['type']!r}")
        if not isinstance(c.get("decimals", 0), int) or isinstance(c.get("decimals"), bool) or c.get("decimals", 0) < 0:
            _fail(path, at, f"column {c['key']!r}: decimals must be a whole number >= 0")
        for k in ("unit", "suffix", "missing"):
            if not isinstance(c.get(k, ""), str):
                _fail(path, at, f"column {c['key']!r}: {k} must be a string")
        out.append(ReportedColumn(**c))
    return tuple(out)


def _row(raw: Any, columns: tuple[ReportedColumn, ...], mechanisms: set[str], path: str, at: int,
         j: int) -> ReportedRow:
    if not isinstance(raw, dict):
        _fail(path, at, f"row {j + 1} must be a table {{method = ..., ...}} on one line")
    by_key = {c.key: c for c in columns}
    unknown = set(raw) - _ROW_KEYS - set(by_key)
    if unknown:
        _fail(path, at, f"row field(s) {sorted(unknown)} are not columns of this table ({sorted(by_key)}) "
                        f"nor row fields ({sorted(_ROW_KEYS)})")
    method = raw.get("method")
    if not isinstance(method, str) or not method:
        _fail(path, at, f"row {j + 1} needs a 'method' string (the name printed in the paper)")
    att, variant = raw.get("attention"), raw.get("variant")
    if att is not None and variant is not None:
        _fail(path, at, f"{method!r}: give 'attention' or 'variant', not both")
    if att is not None and att not in mechanisms:
        close = difflib.get_close_matches(str(att), sorted(mechanisms), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(mechanisms))}"
        _fail(path, at, f"{method!r}: attention {att!r} is not a registered mechanism ({hint})")
    if variant is not None and not isinstance(variant, str):
        _fail(path, at, f"{method!r}: variant must be a string")
    options = raw.get("options", {})
    if not isinstance(options, dict):
        _fail(path, at, f"{method!r}: options must be a table {{name = value}}")
    if options and att is None:
        _fail(path, at, f"{method!r} has options but no attention")
    if not isinstance(raw.get("note", ""), str):
        _fail(path, at, f"{method!r}: note must be a string")
    values = {k: v for k, v in raw.items() if k in by_key}
    for k, v in values.items():
        col = by_key[k]
        if col.type == "text":
            if not isinstance(v, str):
                _fail(path, at, f"{method!r}: {k} is a text column, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            _fail(path, at, f"{method!r}: {k} must be a finite number (leave it out where the paper prints none), "
                            f"got {v!r}")
        elif col.unit == "%" and not 0.0 <= v <= 100.0:
            _fail(path, at, f"{method!r}: {k} = {v} is not a percentage")
    return ReportedRow(method, att, variant, dict(options), values, raw.get("note", ""), at)


def load(path: str | Path) -> list[ReportedTable]:
    """The tables of one reported-numbers file, checked against the schema (module docstring)."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ReportedError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column \d+\)", str(e))
        raise ReportedError(f"{name}:{m.group(1) if m else 1}: not valid TOML: {e}") from None
    lines = _Lines(text)
    unknown = set(doc) - _FILE_KEYS
    if unknown:
        _fail(name, 1, f"unknown top-level key(s) {sorted(unknown)}; allowed: {sorted(_FILE_KEYS)}")
    for k in ("paper", "citation"):
        if not isinstance(doc.get(k), str) or not doc[k]:
            _fail(name, 1, f"the file needs a top-level string {k!r}")
    for k in ("name_header", "caption_end"):
        if not isinstance(doc.get(k, ""), str):
            _fail(name, 1, f"{k!r} must be a string")
    default_columns = _columns(doc["columns"], name, lines.item(None, "columns", 0), lines, None) \
        if "columns" in doc else None
    tables = doc.get("table")
    if not isinstance(tables, list) or not tables:
        _fail(name, 1, "no [[table]] in the file")
    mechanisms = _mechanisms()
    out = []
    for i, t in enumerate(tables):
        at = lines.table(i)
        unknown = set(t) - _TABLE_KEYS
        if unknown:
            _fail(name, at, f"unknown table field(s) {sorted(unknown)}; allowed: {sorted(_TABLE_KEYS)}")
        for k in ("label", "source", "setting", "notes"):
            if not isinstance(t.get(k), str) or (k != "notes" and not t[k]):
                _fail(name, at, f"table {i + 1} needs a string {k!r}")
        for k in ("ablation", "leaderboard"):
            if not isinstance(t.get(k, False), bool):
                _fail(name, at, f"{t['label']!r}: {k} must be true or false")
        columns = _columns(t["columns"], name, lines.item(i, "columns", 0), lines, i) if "columns" in t \
            else default_columns
        if columns is None:
            _fail(name, at, f"{t['label']!r} declares no columns and the file has no default 'columns'")
        rows = t.get("rows")
        if not isinstance(rows, list) or not rows:
            _fail(name, at, f"{t['label']!r} has no rows")
        ablation = t.get("ablation", False)
        out.append(ReportedTable(
            label=t["label"], paper=doc["paper"], citation=doc["citation"], source=t["source"], setting=t["setting"],
            notes=t["notes"], columns=columns,
            rows=tuple(_row(r, columns, mechanisms, name, lines.item(i, "rows", j), j) for j, r in enumerate(rows)),
            ablation=ablation, leaderboard=t.get("leaderboard", not ablation),
            name_header=doc.get("name_header", DEFAULT_NAME_HEADER), caption_end=doc.get("caption_end", ""),
            path=name, line=at))
    return out


def load_dir(folder: str | Path) -> list[ReportedTable]:
    """Every table of the ``*.toml`` files in ``folder``, in file-name order; labels are unique across them."""
    folder = Path(folder)
    files = sorted(folder.glob("*.toml"))
    if not files:
        raise ReportedError(f"{folder}: no reported-numbers files (*.toml) here")
    out: list[ReportedTable] = []
    seen: dict[str, ReportedTable] = {}
    for f in files:
        for t in load(f):
            if t.label in seen:
                _fail(t.path, t.line, f"label {t.label!r} is already used at {seen[t.label].path}:"
                                      f"{seen[t.label].line}")
            seen[t.label] = t
            out.append(t)
    return out


def select(tables: Iterable[ReportedTable], *, paper: str | None = None, leaderboard: bool | None = None,
           ablations: bool = True) -> list[ReportedTable]:
    """The tables of one ``paper`` (if given), only those shown on the leaderboard (if ``leaderboard``), without
    ablations (if not ``ablations``)."""
    return [t for t in tables if (paper is None or t.paper == paper) and (ablations or not t.ablation)
            and (leaderboard is None or t.leaderboard == leaderboard)]


# --- rendering -------------------------------------------------------------------------------------------------
def _places(x: Number) -> int:
    """The decimals the transcribed value ``x`` has (at most 4)."""
    s = repr(float(x))
    return min(len(s.split(".")[1].rstrip("0")), 4) if "." in s and "e" not in s else 0


def _cell(col: ReportedColumn, v: Number | str | None) -> str:
    if v is None:
        return col.missing
    if col.type == "text":
        return f"{v}{col.suffix}"
    return f"{v:.{max(col.decimals, _places(v))}f}{col.suffix}"


def _option(v: Any) -> str:
    if isinstance(v, float):
        for k in (1, 2, 4, 8):
            if math.isclose(v, math.pi / k):
                return "π" if k == 1 else f"π/{k}"
        return f"{v:g}"
    return str(v)


def _name(r: ReportedRow) -> str:
    if r.variant:
        return f"{r.method} [{r.variant}]"
    if not r.attention:
        return r.method
    opts = ",".join(f"{k}={_option(v)}" for k, v in r.options.items())
    return f"{r.method} [{r.attention}{f'({opts})' if opts else ''}]"


def render(tables: Iterable[ReportedTable]) -> list[TableData]:
    """(title, header, rows, caption) of each table, for :func:`attnbench.views.render.render_tables`: a first column with
    the paper's name and the attnbench one, the declared columns, and a "note" column where a row has a note."""
    out: list[TableData] = []
    for tab in tables:
        with_note = any(r.note for r in tab.rows)
        header = [tab.name_header, *[c.header for c in tab.columns]] + (["note"] if with_note else [])
        rows = [[_name(r), *[_cell(c, r.values.get(c.key)) for c in tab.columns]] + ([r.note] if with_note else [])
                for r in tab.rows]
        caption = (f"Published numbers, not measured by attnbench{' (ablation)' if tab.ablation else ''}. "
                   f"Source: {tab.cite}. {tab.notes}" + (f" {tab.caption_end}" if tab.caption_end else ""))
        out.append((f"{tab.label} — {tab.setting}", header, rows, caption))
    return out


def leaderboard_tables(folder: str | Path) -> list[TableData]:
    """The rendered tables of ``folder`` that ``attnbench table`` shows (a suite view's ``extra``)."""
    return render(select(load_dir(folder), leaderboard=True))
