"""The results store: one SQLite file of runs and measurements, with the leases of the cells in flight.

Where it lives: :mod:`attnbench.results.paths`; the records it holds and their JSONL form:
:mod:`attnbench.results.records`; records from elsewhere: :mod:`attnbench.results.ingest`. The file is not
committed; committed reference results are text exports under ``results/<suite>/``.

Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`)::

    runs          one invocation of a suite (or one ingested file)
      run_id TEXT PRIMARY KEY, suite, setting, source ('attnbench' | 'import' | a suite ingester's, e.g.
      'pytest-benchmark'), config JSON, config_hash, argv, git_commit, git_dirty, packages JSON, device,
      device_name, host JSON, started_at, ended_at, status ('running' | 'ok' | 'interrupted' | 'failed'),
      pid, hostname (the process that owns a running run, and its host: see :meth:`Store.reap_dead_runs`),
      note (why a run ended as it did, when not by itself)
    measurements  one measured point; carries its full provenance (denormalised, so an export row stands alone)
      id INTEGER PRIMARY KEY, run_id -> runs, suite, task, setting, attention, options JSON, impl,
      config_hash, seed, git_commit, git_dirty, packages JSON, device, device_name, dtype,
      params JSON (suite-specific inputs, e.g. {"seq_len": 4096, "mode": "fwd", ...}),
      metrics JSON (e.g. {"time_median_s": ..., "peak_mem_bytes": ...}), status, error,
      started_at, ended_at, source

Writes are transactions (``BEGIN IMMEDIATE`` ... ``COMMIT``) on a WAL-mode database with a busy timeout, so a
killed process never leaves half a record and concurrent writers (several processes) wait for each other
instead of losing rows. ``config_hash`` identifies a point (suite, setting, task, attention, options, params,
dtype, device); a re-run skips points whose hash already has a *finished* status (:data:`FINISHED`).

    leases        the cells in flight: config_hash PRIMARY KEY, suite, run_id, label, pid, pid_start, hostname,
      started_at, heartbeat_at (see :meth:`Store.claim`)

Schema history: 1, the first; 2 adds ``runs.pid``, ``runs.hostname`` and ``runs.note`` (a version-1 file is
migrated in place when opened, in one transaction; its old runs have no owner and are never reaped); 3 adds the
``leases`` table (created when an older file is opened).

Concurrent runs on one store: a sweep *claims* each cell before running it (:meth:`Store.claim`, one row of
``leases`` with the process, its host and start time), renews the claim while it runs and releases it when the
cell's record is written. A second process finds the claim and skips the cell; a claim whose process is gone (this
host) or that was not renewed for :data:`LEASE_STALE_S` (another host) is taken over.

A file that is not an SQLite database, or a damaged one, is a :class:`StoreError` naming the file (move it aside
or use another ``--db``), never a traceback from inside sqlite3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sqlite3
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator

from attnbench.core.errors import AttnbenchError
from attnbench.results import provenance
from attnbench.results.paths import resolve_db
from attnbench.results.processes import process_alive, process_start
from attnbench.results.records import FINISHED, Measurement, plugin_provenance

SCHEMA_VERSION = 3
#: A lease of another host is taken over when its holder has not renewed it for this long (its process cannot be
#: asked whether it lives); a lease of this host is taken over as soon as its process is gone.
LEASE_STALE_S = 600.0

RUN_STATUSES = ("running", "ok", "interrupted", "failed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    suite       TEXT NOT NULL,
    setting     TEXT NOT NULL,
    source      TEXT NOT NULL DEFAULT 'attnbench',
    config      TEXT NOT NULL DEFAULT '{}',
    config_hash TEXT,
    argv        TEXT,
    git_commit  TEXT,
    git_dirty   INTEGER,
    packages    TEXT NOT NULL DEFAULT '{}',
    device      TEXT,
    device_name TEXT,
    host        TEXT NOT NULL DEFAULT '{}',
    started_at  TEXT NOT NULL,
    ended_at    TEXT,
    status      TEXT NOT NULL DEFAULT 'running',
    pid         INTEGER,
    hostname    TEXT,
    note        TEXT
);
CREATE TABLE IF NOT EXISTS measurements (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT REFERENCES runs(run_id),
    suite       TEXT NOT NULL,
    task        TEXT NOT NULL,
    setting     TEXT NOT NULL,
    attention   TEXT NOT NULL,
    options     TEXT NOT NULL DEFAULT '{}',
    impl        TEXT,
    config_hash TEXT NOT NULL,
    seed        INTEGER,
    git_commit  TEXT,
    git_dirty   INTEGER,
    packages    TEXT NOT NULL DEFAULT '{}',
    device      TEXT NOT NULL,
    device_name TEXT,
    dtype       TEXT,
    params      TEXT NOT NULL DEFAULT '{}',
    metrics     TEXT NOT NULL DEFAULT '{}',
    status      TEXT NOT NULL,
    error       TEXT,
    started_at  TEXT,
    ended_at    TEXT,
    source      TEXT NOT NULL DEFAULT 'attnbench'
);
CREATE TABLE IF NOT EXISTS leases (
    config_hash  TEXT PRIMARY KEY,
    suite        TEXT NOT NULL,
    run_id       TEXT,
    label        TEXT,
    pid          INTEGER NOT NULL,
    pid_start    INTEGER,
    hostname     TEXT NOT NULL,
    started_at   TEXT NOT NULL,
    heartbeat_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS measurements_point ON measurements (suite, config_hash, status);
CREATE INDEX IF NOT EXISTS measurements_view ON measurements (suite, setting, task);
CREATE INDEX IF NOT EXISTS measurements_run ON measurements (run_id);
"""

_JSON_COLUMNS = ("options", "packages", "params", "metrics")
# Columns added to ``runs`` after version 1 (migration: ALTER TABLE ... ADD COLUMN, in order).
_RUN_COLUMNS_V2 = (("pid", "INTEGER"), ("hostname", "TEXT"), ("note", "TEXT"))
SQLITE_MAGIC = b"SQLite format 3\x00"


class StoreError(AttnbenchError):
    """A results store that cannot be used (not a database, damaged, too new, locked, not writable)."""


def _store_error(path: Path, exc: BaseException, timeout: float) -> StoreError:
    msg = " ".join(str(exc).split())
    low = msg.lower()
    if "locked" in low or "busy" in low:
        return StoreError(f"{path}: the results store is locked by another process (waited {timeout:g} s: "
                          f"{msg}); wait for it to finish or use another --db")
    if "unable to open" in low or "readonly" in low or "read-only" in low or isinstance(exc, OSError):
        return StoreError(f"{path}: cannot open the results store ({msg}); check that its directory exists and "
                          f"is writable, or use another --db")
    return StoreError(f"{path}: not a usable attnbench results store ({msg}); it is damaged or not an SQLite "
                      f"database: move it aside (e.g. `mv {path} {path}.damaged`) or use another --db")


def check_writable(path: str | os.PathLike | None = None) -> Path:
    """The store path (:func:`resolve_db`) if a store can be written there, else a one-line :class:`StoreError`
    naming the path: run before any work (data generation, training), so a bad ``--db`` fails at once."""
    p = resolve_db(path)
    if p.exists():
        if p.is_dir():
            raise StoreError(f"--db {p}: is a directory; give a file path, e.g. {p / 'attnbench.db'}")
        if not os.access(p, os.R_OK | os.W_OK):
            raise StoreError(f"--db {p}: the results store is not writable (permissions); use another --db")
        return p
    try:  # a real probe: permission bits say nothing for root or on special file systems
        import tempfile

        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=p.parent, prefix=".attnbench-probe-"):
            pass
    except OSError as e:
        raise StoreError(f"--db {p}: cannot create the results store there ({e.strerror or e}); use another "
                         f"--db") from None
    return p


@dataclasses.dataclass
class Run:
    run_id: str
    suite: str
    setting: str
    source: str
    config: dict[str, Any]
    env: dict[str, Any]
    started_at: str
    status: str = "running"
    ended_at: str | None = None

    def record(self, *, task: str, attention: str, status: str, options: dict | None = None,
               impl: str | None = None, dtype: str | None = None, params: dict | None = None,
               metrics: dict | None = None, seed: int | None = None, error: str | None = None,
               started_at: str | None = None, ended_at: str | None = None, setting: str | None = None,
               device: str | None = None, config_hash: str = "") -> Measurement:
        """A :class:`Measurement` of this run, with the run's provenance filled in (and, when this process measured
        its machine, the fp32 matmul GFLOP/s as ``metrics["matmul_fp32_gflops"]``: tables name the machine), and
        the torch thread counts (:func:`attnbench.results.provenance.thread_counts`: ``metrics["threads"]``,
        ``metrics["interop_threads"]``) unless the cell recorded its own (measured in a child process)."""
        env = self.env
        if "threads" not in (metrics or {}):
            metrics = {**(metrics or {}), **provenance.thread_counts()}
        gflops = ((env.get("host") or {}).get("machine") or {}).get("matmul_fp32_gflops")
        if gflops is not None and "matmul_fp32_gflops" not in (metrics or {}):
            metrics = {**(metrics or {}), "matmul_fp32_gflops": gflops}
        return Measurement(
            suite=self.suite, task=task, setting=setting or self.setting, attention=attention, status=status,
            device=device or env.get("device") or "cpu", options=dict(options or {}), impl=impl, dtype=dtype,
            params=dict(params or {}), metrics=dict(metrics or {}), seed=seed,
            git_commit=env.get("git_commit"), git_dirty=env.get("git_dirty"),
            packages={**(env.get("packages") or {}), **plugin_provenance(attention, options, params)},
            device_name=env.get("device_name"), error=error, started_at=started_at or provenance.now(),
            ended_at=ended_at or provenance.now(), source=self.source, run_id=self.run_id,
            config_hash=config_hash)


class Store:
    """The SQLite results store. ``Store()`` opens (and creates) the default database; use as a context manager
    or call :meth:`close`. Safe to use from several processes at once (each opens its own ``Store``)."""

    def __init__(self, path: str | os.PathLike | None = None, *, timeout: float = 60.0, readonly: bool = False):
        self.path = resolve_db(path)
        self.readonly = readonly
        self._conn = None
        try:
            self._open(timeout)
        except (sqlite3.Error, OSError) as e:
            if self._conn is not None:
                self._conn.close()
            raise _store_error(self.path, e, timeout) from None
        except BaseException:
            if self._conn is not None:
                self._conn.close()
            raise

    def _open(self, timeout: float) -> None:
        if self.readonly:
            if not self.path.is_file():
                raise StoreError(f"{self.path}: no such results store")
            self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout,
                                         isolation_level=None)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        if self.readonly:
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            self._check_version(version)
            self._conn.execute("SELECT COUNT(*) FROM runs").fetchone()
            self._conn.execute("SELECT COUNT(*) FROM measurements").fetchone()
            return
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        with self.transaction() as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            self._check_version(version)
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                c.execute(stmt)
            have = {row[1] for row in c.execute("PRAGMA table_info(runs)")}
            for name, kind in _RUN_COLUMNS_V2:   # version 1 -> 2
                if name not in have:
                    c.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")
            if version != SCHEMA_VERSION:
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        # a damaged file can open and pass the above (its header and schema intact): check every page once
        bad = [r[0] for r in self._conn.execute("PRAGMA quick_check(3)")]
        if bad != ["ok"]:
            raise sqlite3.DatabaseError("; ".join(bad))

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}, newer than this attnbench "
                             f"({SCHEMA_VERSION}); upgrade attnbench or use another --db")

    # --- plumbing --------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any error): all or nothing."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # --- runs ------------------------------------------------------------------------------------------
    def start_run(self, *, suite: str, setting: str, config: dict | None = None, device: str = "cpu",
                  threads: int | None = None, argv: list[str] | None = None, source: str = "attnbench",
                  env: dict | None = None, run_id: str | None = None) -> Run:
        """Insert a run in status ``running`` and return it; its :meth:`Run.record` makes measurements."""
        env = env if env is not None else provenance.environment(device, threads)
        run = Run(run_id=run_id or uuid.uuid4().hex, suite=suite, setting=setting, source=source,
                  config=dict(config or {}), env=env, started_at=provenance.now())
        pid = os.getpid()
        host = {**(env.get("host") or {}), "pid_start": process_start(pid)}
        with self.transaction() as c:
            c.execute(
                "INSERT INTO runs (run_id, suite, setting, source, config, config_hash, argv, git_commit, git_dirty,"
                " packages, device, device_name, host, started_at, status, pid, hostname)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run.run_id, suite, setting, source, provenance.canonical_json(run.config),
                 provenance.config_hash(run.config), json.dumps(argv) if argv is not None else None,
                 env.get("git_commit"), _bool(env.get("git_dirty")), json.dumps(env.get("packages") or {}),
                 env.get("device"), env.get("device_name"), json.dumps(host), run.started_at,
                 "running", pid, socket.gethostname()))
        return run

    def reap_dead_runs(self) -> list[str]:
        """Mark ``interrupted`` the runs left ``running`` by a process of this host that no longer exists (killed
        by SIGKILL or the OOM killer, a power loss: it never finished its run). Runs of other hosts, of live
        processes and without an owner (older files) are left alone. Returns one note per run marked (also
        stored in the run's ``note``). Called when a suite run starts."""
        host = socket.gethostname()
        rows = self._conn.execute("SELECT run_id, suite, setting, pid, host, started_at FROM runs WHERE status = "
                                  "'running' AND hostname = ? AND pid IS NOT NULL", (host,)).fetchall()
        notes = []
        for row in rows:
            start = (json.loads(row["host"]) if row["host"] else {}).get("pid_start")
            if process_alive(row["pid"], start):
                continue
            note = (f"run {row['run_id'][:12]} ({row['suite']} {row['setting']}, started {row['started_at']}) was "
                    f"left running by process {row['pid']} on {host}, which no longer exists (killed?): marked "
                    f"interrupted; its finished points are kept, a rerun measures the rest")
            with self.transaction() as c:
                cur = c.execute("UPDATE runs SET status = 'interrupted', ended_at = ?, note = ? WHERE run_id = ? AND "
                                "status = 'running'", (provenance.now(), note, row["run_id"]))
            if cur.rowcount:
                notes.append(note)
        for row in self._conn.execute("SELECT config_hash, pid, pid_start FROM leases WHERE hostname = ?",
                                      (host,)).fetchall():
            if not process_alive(row["pid"], row["pid_start"]):
                with self.transaction() as c:
                    c.execute("DELETE FROM leases WHERE config_hash = ? AND pid = ?", (row["config_hash"], row["pid"]))
        return notes

    def finish_run(self, run_id: str, status: str, note: str | None = None) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, got {status!r}")
        with self.transaction() as c:
            c.execute("UPDATE runs SET status = ?, ended_at = ?, note = COALESCE(?, note) WHERE run_id = ?",
                      (status, provenance.now(), note, run_id))

    # --- leases: cells in flight -------------------------------------------------------------------------
    def claim(self, suite: str, config_hash: str, *, run_id: str | None = None, label: str = "",
              force: bool = False) -> tuple[str, dict[str, Any] | None]:
        """Claim the cell ``config_hash`` for this process, in one transaction. Returns ``("claimed", None)``;
        ``("finished", None)`` when the cell got a finished record meanwhile (another process ran it; not with
        ``force``); or ``("held", lease)`` when a live process holds it (``lease``: its row). A lease whose
        process no longer exists (this host) or that was not renewed for :data:`LEASE_STALE_S` (another host) is
        taken over."""
        import datetime as _dt

        host, pid = socket.gethostname(), os.getpid()
        now = provenance.now()
        with self.transaction() as c:
            if not force:
                q = (f"SELECT 1 FROM measurements WHERE suite = ? AND config_hash = ? AND status IN "
                     f"({', '.join('?' * len(FINISHED))}) LIMIT 1")
                if c.execute(q, [suite, config_hash, *FINISHED]).fetchone():
                    return "finished", None
            row = c.execute("SELECT * FROM leases WHERE config_hash = ?", (config_hash,)).fetchone()
            if row is not None and not (row["hostname"] == host and row["pid"] == pid):
                lease = dict(row)
                if row["hostname"] == host:
                    alive = process_alive(row["pid"], row["pid_start"])
                else:
                    try:
                        age = (_dt.datetime.fromisoformat(now) - _dt.datetime.fromisoformat(row["heartbeat_at"]))
                        alive = age.total_seconds() < LEASE_STALE_S
                    except ValueError:
                        alive = False
                if alive:
                    return "held", lease
            c.execute("INSERT OR REPLACE INTO leases (config_hash, suite, run_id, label, pid, pid_start, hostname, "
                      "started_at, heartbeat_at) VALUES (?,?,?,?,?,?,?,?,?)",
                      (config_hash, suite, run_id, label, pid, process_start(pid), host, now, now))
        return "claimed", None

    def release(self, config_hash: str) -> None:
        """Drop this process's claim on ``config_hash`` (a claim of another process is left alone)."""
        with self.transaction() as c:
            c.execute("DELETE FROM leases WHERE config_hash = ? AND pid = ? AND hostname = ?",
                      (config_hash, os.getpid(), socket.gethostname()))

    def renew(self, pid: int | None = None) -> None:
        """Renew every claim of process ``pid`` (default: this one) on this host."""
        with self.transaction() as c:
            c.execute("UPDATE leases SET heartbeat_at = ? WHERE pid = ? AND hostname = ?",
                      (provenance.now(), pid or os.getpid(), socket.gethostname()))

    def leases(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._conn.execute("SELECT * FROM leases ORDER BY started_at")]

    def has_run(self, run_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is not None

    def run(self, run_id: str) -> dict[str, Any] | None:
        """The run ``run_id`` as :meth:`runs` gives it, or None."""
        return next((r for r in self._runs("SELECT * FROM runs WHERE run_id = ?", [run_id])), None)

    def runs(self, suite: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM runs", []
        if suite:
            q, args = q + " WHERE suite = ?", [suite]
        return self._runs(q + " ORDER BY started_at", args)

    def _runs(self, q: str, args: list) -> list[dict[str, Any]]:
        out = []
        for row in self._conn.execute(q, args):
            d = dict(row)
            for key in ("config", "packages", "host"):
                d[key] = json.loads(d[key]) if d[key] else {}
            out.append(d)
        return out

    def _insert_run_row(self, run: dict[str, Any]) -> None:
        """Copy a run row from another store (as :meth:`runs` gives it) unchanged."""
        row = dict(run)
        for key in ("config", "packages", "host"):
            row[key] = json.dumps(row.get(key) or {})
        cols = [c for c in row if c in self._run_columns()]
        with self.transaction() as c:
            c.execute(f"INSERT INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                      [row[k] for k in cols])

    def _finish_run_row(self, run: dict[str, Any]) -> None:
        with self.transaction() as c:
            c.execute("UPDATE runs SET status = ?, ended_at = ?, note = ? WHERE run_id = ?",
                      (run["status"], run.get("ended_at"), run.get("note"), run["run_id"]))

    def _run_columns(self) -> set[str]:
        return {row[1] for row in self._conn.execute("PRAGMA table_info(runs)")}

    # --- measurements -----------------------------------------------------------------------------------
    def add(self, m: Measurement) -> int:
        """Insert one measurement in its own transaction; returns its id."""
        return self.add_many([m])[0]

    def add_many(self, ms: Iterable[Measurement]) -> list[int]:
        """Insert measurements in one transaction (all or none); returns their ids."""
        ids = []
        with self.transaction() as c:
            for m in ms:
                row = m.to_dict()
                row.pop("id")
                for key in _JSON_COLUMNS:
                    row[key] = provenance.canonical_json(row[key])
                row["git_dirty"] = _bool(row["git_dirty"])
                cols = list(row)
                cur = c.execute(f"INSERT INTO measurements ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                                [row[k] for k in cols])
                m.id = cur.lastrowid
                ids.append(cur.lastrowid)
        return ids

    def measurements(self, *, suite: str | None = None, setting: str | None = None, task: str | None = None,
                     attention: str | None = None, status: str | Iterable[str] | None = None,
                     run_id: str | None = None) -> list[Measurement]:
        """Measurements matching every given filter, oldest first."""
        where, args = [], []
        for col, val in (("suite", suite), ("setting", setting), ("task", task), ("attention", attention),
                         ("run_id", run_id)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)
            where.append(f"status IN ({', '.join('?' * len(statuses))})")
            args.extend(statuses)
        q = "SELECT * FROM measurements" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        return [_measurement(row) for row in self._conn.execute(q, args)]

    def finished(self, suite: str, hashes: Iterable[str] | None = None) -> set[str]:
        """Config hashes of ``suite`` that already have a finished measurement (the resume set)."""
        q = (f"SELECT DISTINCT config_hash FROM measurements WHERE suite = ? AND status IN "
             f"({', '.join('?' * len(FINISHED))})")
        done = {r[0] for r in self._conn.execute(q, [suite, *FINISHED])}
        return done if hashes is None else done & set(hashes)

    def count(self, suite: str | None = None) -> int:
        if suite:
            return self._conn.execute("SELECT COUNT(*) FROM measurements WHERE suite = ?", (suite,)).fetchone()[0]
        return self._conn.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]


def _bool(v: Any) -> int | None:
    return None if v is None else int(bool(v))


def _measurement(row: sqlite3.Row) -> Measurement:
    d = dict(row)
    for key in _JSON_COLUMNS:
        d[key] = json.loads(d[key]) if d[key] else {}
    d["git_dirty"] = None if d["git_dirty"] is None else bool(d["git_dirty"])
    return Measurement(**d)


def open_existing(path: str | os.PathLike | None = None) -> Store | None:
    """The store at ``path`` (or the default) if the file exists, else None (never creates one)."""
    p = resolve_db(path)
    return Store(p) if p.exists() else None


