"""Exports of records: csv rows, jsonl records (what gets committed under ``results/``) and markdown
leaderboards with their environment."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

from attnbench.core.errors import AttnbenchError
from attnbench.results import provenance
from attnbench.results.paths import project_root, resolve_db
from attnbench.results.records import Measurement, write_jsonl
from attnbench.results.store import open_existing
from attnbench.views.render import markdown_tables
from attnbench.views.sources import PACKAGE_ROOT, Source, describe_records
from attnbench.views.tables import source_tables, view_of


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


def _check_committable(records: list[Measurement], out: Path) -> None:
    """Records written into this repository's ``results/`` are what gets committed: each must come from a clean
    tree at a commit of this repository's history, so that its commit holds the code that made it."""
    committed = PACKAGE_ROOT / "results"
    if not out.resolve().is_relative_to(committed.resolve()):
        return
    foreign = {c for c in {r.git_commit for r in records} if not provenance.in_history(c)}  # one git call a commit
    bad = sorted({f"{(r.git_commit or 'no commit')[:10]}{' (dirty)' if r.git_dirty is not False else ''}"
                  for r in records if r.git_dirty is not False or r.git_commit in foreign})
    if bad:
        raise AttnbenchError(f"{out}: records made from a tree with uncommitted changes or at a commit not in this "
                             f"repository's history ({', '.join(bad[:5])}); results are committed only from a clean "
                             f"tree: commit the code, run again, then export")


def export(records: list[Measurement], fmt: str, out: str | Path | None = None, *, suite: str | None = None,
           label: str = "exported results", committed: bool = False) -> str:
    """Render ``records`` as csv (flat rows), jsonl (full records) or markdown (the suite's leaderboard and the
    environment; ``committed``: titled as the committed reference results, else as the user's runs). Writes
    ``out`` if given (atomically), returns the text. Paths in the records are made machine-free
    (:func:`attnbench.results.provenance.portable`): an export is what gets committed and shared, and a jsonl
    export into this repository's ``results/`` takes only records of a clean tree at a commit of its history."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    root = project_root()
    records = [dataclasses.replace(r, metrics=provenance.portable(r.metrics, root),
                                   params=provenance.portable(r.params, root)) for r in records]
    if fmt == "jsonl":
        if out:
            _check_committable(records, Path(out))
            write_jsonl(records, out)
            return Path(out).read_text()
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
            src, view = Source(label, recs, committed=committed), view_of(s)
            # as `table` shows them: titles with their machines, the notes of the marks the rows carry
            board = markdown_tables(source_tables(view, src)) if view.data is not None else view.markdown(src)
            parts.append(f"### {s}: {label}\n\n{environment_markdown(recs)}\n{board}")
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
