"""The results store: one SQLite file of runs and measurements.

Where it lives: ``--db PATH``, else the environment variable ``ATTNBENCH_DB``, else ``results/attnbench.db``
under the *project root* — the nearest directory at or above the current working directory that holds a
``.git`` or ``pyproject.toml`` (the current directory itself if there is none). The file is not committed;
committed reference results are text exports under ``results/<suite>/`` (see :mod:`attnbench.report`).

Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`)::

    runs          one invocation of a suite (or one ingested pytest-benchmark file)
      run_id TEXT PRIMARY KEY, suite, setting, source ('attnbench' | 'pytest-benchmark' | 'import'),
      config JSON, config_hash, argv, git_commit, git_dirty, packages JSON, device, device_name, host JSON,
      started_at, ended_at, status ('running' | 'ok' | 'interrupted' | 'failed')
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
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator

from . import provenance

ENV_VAR = "ATTNBENCH_DB"
DEFAULT_RELATIVE = Path("results") / "attnbench.db"
SCHEMA_VERSION = 1

STATUSES = ("ok", "oom", "timeout", "incorrect", "failed", "interrupted", "unsupported", "skipped")
# A point with one of these is done: a re-run skips it unless forced. 'failed' and 'interrupted' are retried.
FINISHED = ("ok", "oom", "timeout", "incorrect", "unsupported", "skipped")
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
    status      TEXT NOT NULL DEFAULT 'running'
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
CREATE INDEX IF NOT EXISTS measurements_point ON measurements (suite, config_hash, status);
CREATE INDEX IF NOT EXISTS measurements_view ON measurements (suite, setting, task);
CREATE INDEX IF NOT EXISTS measurements_run ON measurements (run_id);
"""

_JSON_COLUMNS = ("options", "packages", "params", "metrics")


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) with a ``.git`` or ``pyproject.toml``."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / ".git").exists() or (d / "pyproject.toml").exists():
            return d
    return here


def default_db_path() -> Path:
    """``$ATTNBENCH_DB`` if set, else ``<project root>/results/attnbench.db``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return project_root() / DEFAULT_RELATIVE


def resolve_db(path: str | os.PathLike | None = None) -> Path:
    """An explicit ``path`` (``--db``) wins over :func:`default_db_path`."""
    return Path(path).expanduser() if path else default_db_path()


def point_hash(*, suite: str, setting: str, task: str, attention: str, options: dict, params: dict,
               dtype: str | None, device: str) -> str:
    """The identity of a measured point (what resume compares)."""
    return provenance.config_hash({"suite": suite, "setting": setting, "task": task, "attention": attention,
                                   "options": options, "params": params, "dtype": dtype, "device": device})


@dataclasses.dataclass
class Measurement:
    """One measured point with its provenance. ``params`` are the point's inputs, ``metrics`` its results."""

    suite: str
    task: str
    setting: str
    attention: str
    status: str
    device: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    impl: str | None = None
    dtype: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    config_hash: str = ""
    seed: int | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    packages: dict[str, str] = dataclasses.field(default_factory=dict)
    device_name: str | None = None
    error: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    source: str = "attnbench"
    run_id: str | None = None
    id: int | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"measurement status must be one of {STATUSES}, got {self.status!r}")
        if not self.config_hash:
            self.config_hash = point_hash(suite=self.suite, setting=self.setting, task=self.task,
                                          attention=self.attention, options=self.options, params=self.params,
                                          dtype=self.dtype, device=self.device)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown measurement field(s) {sorted(unknown)}")
        return cls(**d)

    def flat(self) -> dict[str, Any]:
        """One flat row (CSV): ``params.*`` and ``metrics.*`` spread into columns, other dicts as JSON."""
        d = self.to_dict()
        params, metrics = d.pop("params"), d.pop("metrics")
        for key in ("options", "packages"):
            d[key] = provenance.canonical_json(d[key])
        d.update({f"params.{k}": v for k, v in params.items()})
        d.update({f"metrics.{k}": v for k, v in metrics.items()})
        return d


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
               device: str | None = None) -> Measurement:
        """A :class:`Measurement` of this run, with the run's provenance filled in."""
        env = self.env
        return Measurement(
            suite=self.suite, task=task, setting=setting or self.setting, attention=attention, status=status,
            device=device or env.get("device") or "cpu", options=dict(options or {}), impl=impl, dtype=dtype,
            params=dict(params or {}), metrics=dict(metrics or {}), seed=seed,
            git_commit=env.get("git_commit"), git_dirty=env.get("git_dirty"), packages=dict(env.get("packages") or {}),
            device_name=env.get("device_name"), error=error, started_at=started_at or provenance.now(),
            ended_at=ended_at or provenance.now(), source=self.source, run_id=self.run_id)


class Store:
    """The SQLite results store. ``Store()`` opens (and creates) the default database; use as a context manager
    or call :meth:`close`. Safe to use from several processes at once (each opens its own ``Store``)."""

    def __init__(self, path: str | os.PathLike | None = None, *, timeout: float = 60.0):
        self.path = resolve_db(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), timeout=timeout, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        with self.transaction() as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"{self.path} has schema version {version}, newer than this attnbench "
                                   f"({SCHEMA_VERSION}); upgrade attnbench")
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                c.execute(stmt)
            c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # --- plumbing --------------------------------------------------------------------------------------
    def close(self) -> None:
        self._conn.close()

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
        with self.transaction() as c:
            c.execute(
                "INSERT INTO runs (run_id, suite, setting, source, config, config_hash, argv, git_commit, git_dirty,"
                " packages, device, device_name, host, started_at, status) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run.run_id, suite, setting, source, provenance.canonical_json(run.config),
                 provenance.config_hash(run.config), json.dumps(argv) if argv is not None else None,
                 env.get("git_commit"), _bool(env.get("git_dirty")), json.dumps(env.get("packages") or {}),
                 env.get("device"), env.get("device_name"), json.dumps(env.get("host") or {}), run.started_at,
                 "running"))
        return run

    def finish_run(self, run_id: str, status: str) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}, got {status!r}")
        with self.transaction() as c:
            c.execute("UPDATE runs SET status = ?, ended_at = ? WHERE run_id = ?", (status, provenance.now(), run_id))

    def has_run(self, run_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is not None

    def runs(self, suite: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM runs", []
        if suite:
            q, args = q + " WHERE suite = ?", [suite]
        out = []
        for row in self._conn.execute(q + " ORDER BY started_at", args):
            d = dict(row)
            for key in ("config", "packages", "host"):
                d[key] = json.loads(d[key]) if d[key] else {}
            out.append(d)
        return out

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


def write_jsonl(records: Iterable[Measurement], path: str | os.PathLike) -> int:
    """Write records one JSON object a line (atomically: temp file then rename); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = 0
    with tmp.open("w") as f:
        for m in records:
            f.write(json.dumps(m.to_dict(), sort_keys=True) + "\n")
            n += 1
    tmp.replace(path)
    return n


def read_jsonl(path: str | os.PathLike) -> list[Measurement]:
    out = []
    with Path(path).open() as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(Measurement.from_dict(json.loads(line)))
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{path}:{i}: not a measurement record: {e}") from e
    return out


# --- pytest-benchmark -------------------------------------------------------------------------------------------
PYTEST_BENCHMARK_SETTING = "pytest-benchmark"


def ingest_pytest_benchmark(path: str | os.PathLike, store: Store) -> tuple[str, int]:
    """Bring a pytest-benchmark JSON (``--benchmark-json`` or a saved ``.benchmarks/*/NNNN_*.json``) into
    ``store``; returns ``(run_id, records added)``. Idempotent: a file already ingested adds nothing.

    Benchmarks of ``benchmarks/test_attention_bench.py`` (``extra_info["attnbench"]`` set) become suite
    ``scaling`` records in setting ``pytest-benchmark[b.,h.,d.]`` with their attention, impl, task, N, dtype and
    FLOPs; any other benchmark becomes a suite ``pytest-benchmark`` record named after the test.
    """
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise ValueError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' key)")
    machine = data.get("machine_info") or {}
    commit = data.get("commit_info") or {}
    stamp = data.get("datetime") or provenance.now()
    names = sorted(b.get("fullname", b.get("name", "")) for b in data["benchmarks"])
    run_id = "pb-" + provenance.config_hash({"datetime": stamp, "node": machine.get("node"), "names": names})
    already = store.has_run(run_id)
    if already and store.measurements(run_id=run_id):
        return run_id, 0
    cpu = machine.get("cpu") or {}
    packages = {"python": machine.get("python_version")} if machine.get("python_version") else {}
    env = {"git_commit": commit.get("id"), "git_dirty": commit.get("dirty"), "packages": packages,
           "device": "cpu", "device_name": cpu.get("brand_raw") or machine.get("processor"),
           "host": {"node": machine.get("node"), "machine": machine.get("machine"), "cpus": cpu.get("count")}}
    records = []
    for b in data["benchmarks"]:
        info = b.get("extra_info") or {}
        st = b.get("stats") or {}
        metrics = {"time_median_s": st.get("median"), "time_q25_s": st.get("q1"), "time_q75_s": st.get("q3"),
                   "time_iqr_s": st.get("iqr"), "time_min_s": st.get("min"), "time_mean_s": st.get("mean"),
                   "time_stddev_s": st.get("stddev"), "reps": st.get("rounds")}
        ours = bool(info.get("attnbench"))
        if ours:
            pk = {**packages, **(info.get("packages") or {})}
            if info.get("flops") and st.get("median"):
                metrics["flops"] = info["flops"]
                metrics["gflops"] = info["flops"] / st["median"] / 1e9
            for key in ("check_err", "check_tol"):
                if key in info:
                    metrics[key] = info[key]
            params = {k: info[k] for k in ("seq_len", "mode", "causal", "batch", "heads", "head_dim", "threads")
                      if k in info}
            setting = (f"{PYTEST_BENCHMARK_SETTING}[b{info.get('batch')},h{info.get('heads')},"
                       f"d{info.get('head_dim')}]")
            m = Measurement(suite="scaling", task=info.get("task") or b.get("group") or "fwd/bidir", setting=setting,
                            attention=info.get("attention") or b.get("name"), status="ok",
                            device=info.get("device", "cpu"), options=info.get("options") or {},
                            impl=info.get("impl"), dtype=info.get("dtype"), params=params, metrics=metrics,
                            seed=info.get("seed"), git_commit=env["git_commit"], git_dirty=env["git_dirty"],
                            packages=pk, device_name=env["device_name"], started_at=stamp, ended_at=stamp,
                            source="pytest-benchmark", run_id=run_id)
        else:
            m = Measurement(suite="pytest-benchmark", task=b.get("group") or "benchmark",
                            setting=PYTEST_BENCHMARK_SETTING, attention=b.get("name") or "?", status="ok",
                            device="cpu", params=dict(b.get("params") or {}), metrics=metrics,
                            git_commit=env["git_commit"], git_dirty=env["git_dirty"], packages=packages,
                            device_name=env["device_name"], started_at=stamp, ended_at=stamp,
                            source="pytest-benchmark", run_id=run_id)
        records.append(m)
    if not already:  # (a run row without records: an ingest killed half-way; its records are added now)
        store.start_run(suite="scaling" if any(r.suite == "scaling" for r in records) else "pytest-benchmark",
                        setting=PYTEST_BENCHMARK_SETTING, config={"file": str(path)}, source="pytest-benchmark",
                        env=env, run_id=run_id)
    store.add_many(records)
    store.finish_run(run_id, "ok")
    return run_id, len(records)


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


def ingest(path: str | os.PathLike, store: Store) -> str:
    """``attnbench ingest``: a pytest-benchmark JSON, or a ``.jsonl`` export of another store; returns a summary."""
    if str(path).endswith(".jsonl"):
        added, skipped = import_records(read_jsonl(path), store)
        return (f"imported {added} record(s) from {path} into {store.path}"
                + (f"; {skipped} run(s) already present" if skipped else ""))
    run_id, n = ingest_pytest_benchmark(path, store)
    return (f"ingested {n} benchmark(s) from {path} into {store.path} (run {run_id})"
            + ("" if n else " — already ingested"))
