"""Where a view's records come from: the user's results store and the committed reference results.

A view reads :class:`Source` objects: the user's store (``--db`` / ``ATTNBENCH_DB`` / ``results/attnbench.db``)
and the committed reference results, text exports under ``results/<suite>/*.jsonl`` found at the project root
(see :func:`attnbench.results.paths.project_root`) and beside the attnbench sources. The committed ones are
labelled as such, with their machines and dates; records of a run that is part of a committed file are shown
once, as committed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable

from attnbench.results.paths import project_root
from attnbench.results.records import FINISHED, Measurement, read_jsonl
from attnbench.results.store import open_existing


PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Source:
    label: str
    records: list[Measurement]
    committed: bool = False
    path: Path | None = None


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


def committed_records(suite: str, setting: str | None = None) -> list[Measurement]:
    """The committed reference records of ``suite`` (``results/<suite>/*.jsonl``), optionally of one setting."""
    return [r for f in reference_files(suite) for r in read_jsonl(f)
            if r.suite == suite and (setting is None or r.setting == setting)]


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
    if include_committed:  # one source over the suite's files: a row's seeds may come from several of them
        recs, files = [], []
        for f in reference_files(suite):
            mine = [r for r in read_jsonl(f) if r.suite == suite and (setting is None or r.setting == setting)]
            if mine:
                recs += mine
                files.append(f)
        if recs:
            committed_runs |= {r.run_id for r in recs if r.run_id}
            rel = ", ".join(_relative(f) for f in files)
            sources.append(Source(f"committed reference results ({rel}; {describe_records(recs)})", recs,
                                  committed=True, path=files[0]))
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


def machines(records: Iterable[Measurement]) -> dict[str, str]:
    """Each machine (device name) of ``records`` with the fp32 matmul GFLOP/s measured when its runs started
    (``metrics["matmul_fp32_gflops"]``; a range over its runs), or "" where none was recorded."""
    flops: dict[str, list[float]] = {}
    for r in records:
        if r.device_name:
            seen = flops.setdefault(r.device_name, [])
            g = r.metrics.get("matmul_fp32_gflops")
            if isinstance(g, (int, float)):
                seen.append(float(g))
    out = {}
    for name, gs in sorted(flops.items()):
        lo, hi = (f"{min(gs):.0f}", f"{max(gs):.0f}") if gs else ("", "")
        out[name] = "" if not gs else f"fp32 matmul {lo if lo == hi else f'{lo}–{hi}'} GFLOP/s"
    return out


def machine_of(records: Iterable[Measurement]) -> str:
    """The machines that measured ``records``: each device name (CPU or GPU model) with, where recorded, the fp32
    matmul GFLOP/s measured when it ran; several machines each with their own figure."""
    found = machines(records)
    if not found:
        return "machine not recorded"
    if len(found) == 1:
        ((name, flops),) = found.items()
        return f"{name}, {flops}" if flops else name
    return "; ".join(f"{name} ({flops or 'matmul GFLOP/s not recorded'})" for name, flops in found.items())


def commits_of(records: Iterable[Measurement]) -> list[str]:
    """The commits (10 hex digits, ``-dirty`` for a tree with uncommitted changes) that measured ``records``."""
    return sorted({(r.git_commit or "?")[:10] + ("-dirty" if r.git_dirty else "") for r in records})
