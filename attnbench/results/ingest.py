"""``attnbench ingest``: records from elsewhere into a store — a ``.jsonl`` export, another store (a shard job's,
merged run by run), or a suite's own results format (each suite's registered ingester)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Iterable

from attnbench.api import suites as suite_registry
from attnbench.core.errors import AttnbenchError
from attnbench.results import provenance
from attnbench.results.records import Measurement, read_jsonl
from attnbench.results.store import SQLITE_MAGIC, Store, StoreError


def import_records(records: Iterable[Measurement], store: Store) -> tuple[int, int]:
    """Copy records exported from another store (``export --format jsonl``) into ``store``, with their runs.

    A run already present with measurements is skipped whole (importing twice adds nothing). Returns
    ``(records added, runs skipped)``.
    """
    by_run: dict[str, list[Measurement]] = {}
    for m in records:
        by_run.setdefault(m.run_id or f"import-{provenance.config_hash(m.to_dict())}", []).append(m)
    added = skipped = 0
    for run_id, ms in by_run.items():
        if store.has_run(run_id) and store.measurements(run_id=run_id):
            skipped += 1
            continue
        first = ms[0]
        if not store.has_run(run_id):
            env = {"git_commit": first.git_commit, "git_dirty": first.git_dirty, "packages": first.packages,
                   "device": first.device, "device_name": first.device_name}
            store.start_run(suite=first.suite, setting=first.setting, config={"imported": True},
                            source="import", env=env, run_id=run_id)
        copies = [dataclasses.replace(m, id=None, run_id=run_id) for m in ms]
        store.add_many(copies)
        store.finish_run(run_id, "ok")
        added += len(copies)
    return added, skipped


def _measurement_key(m: Measurement) -> tuple:
    """What identifies a measurement across stores (ids are per store)."""
    return (m.config_hash, m.task, m.attention, m.status, m.started_at, m.ended_at)


def merge_store(path: str | os.PathLike, store: Store) -> tuple[int, int, int]:
    """Merge another store file into ``store`` run by run: each run's row (with its status, owner and
    provenance) and the measurements it lacks here. Idempotent: merging the same file again adds nothing, and
    merging a store that has grown since (a shard job still running) adds only the new measurements and the run's
    final status. This is how the stores of ``--shard K/N`` jobs are combined. Returns ``(runs added, records
    added, runs already complete here)``."""
    src = Path(path)
    if src.resolve() == store.path.resolve():
        raise StoreError(f"{path}: that is the store being ingested into")
    runs_added = added = complete = 0
    with Store(src, readonly=True) as other:
        for run in other.runs():
            run_id = run["run_id"]
            theirs = other.measurements(run_id=run_id)
            mine = store.run(run_id)
            have = {_measurement_key(m) for m in store.measurements(run_id=run_id)} if mine else set()
            new = [dataclasses.replace(m, id=None) for m in theirs if _measurement_key(m) not in have]
            if mine is None:
                store._insert_run_row(run)
                runs_added += 1
            elif mine["status"] == "running" and run["status"] != "running":
                store._finish_run_row(run)
            if new:
                store.add_many(new)
                added += len(new)
            elif mine is not None:
                complete += 1
    return runs_added, added, complete


def ingest(path: str | os.PathLike, store: Store) -> str:
    """``attnbench ingest``: bring a results file into ``store``; returns a summary line.

    The store's own formats first: a ``.jsonl`` export of another store (:func:`import_records`), another store
    file (``.db``, or any SQLite file: :func:`merge_store`). Then each registered suite's ``ingest`` (e.g. the
    pytest-benchmark JSON of one suite), which returns None for a format not its own. A file no one recognises,
    a missing or damaged file, is an :class:`AttnbenchError` whose one line names the file.
    """
    p = Path(path)
    if not p.exists():
        raise AttnbenchError(f"{path}: no such file")
    if not p.is_file():
        raise AttnbenchError(f"{path}: not a file")
    try:
        if p.suffix.lower() == ".jsonl":
            added, skipped = import_records(read_jsonl(p), store)
            return (f"imported {added} record(s) from {path} into {store.path}"
                    + (f"; {skipped} run(s) already present" if skipped else ""))
        if p.suffix.lower() == ".db" or _is_sqlite(p):
            runs, added, complete = merge_store(p, store)
            return (f"merged {added} record(s) of {runs} new run(s) from {path} into {store.path}"
                    + (f"; {complete} run(s) already complete" if complete else ""))

        tried = []
        for name in suite_registry.suite_names():
            suite = suite_registry.get_suite(name)
            if suite.ingest is None:
                continue
            what = (suite.ingest.__doc__ or "").strip().splitlines()
            tried.append(f"{name}: {what[0].rstrip('.')}" if what else name)
            message = suite.ingest(p, store)
            if message is not None:
                return message
    except AttnbenchError as e:
        raise AttnbenchError(_naming(path, e)) from None
    except (ValueError, OSError, KeyError, TypeError) as e:  # a damaged file of a known format
        msg = str(e) if str(path) in str(e) else f"cannot ingest: {type(e).__name__}: {e}"
        raise AttnbenchError(_naming(path, msg)) from None
    suites = f", or a format of a suite ({'; '.join(tried)})" if tried else ""
    raise AttnbenchError(f"{path}: not a file attnbench can ingest: expected a .jsonl export (`attnbench export "
                         f"--format jsonl`), another results store (.db){suites}")


def _naming(path: str | os.PathLike, e: BaseException | str) -> str:
    """``e``'s message, on one line, starting with ``path`` unless it already names it."""
    msg = " ".join(str(e).split())
    return msg if str(path) in msg else f"{path}: {msg}"


def _is_sqlite(p: Path) -> bool:
    try:
        with p.open("rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False
