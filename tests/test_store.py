"""The results store: round trip, provenance, resume set, WAL and concurrent writers, path resolution."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import sqlite3
import time

import pytest

from attnbench.results import paths, records
from attnbench.results import store as st
from attnbench.results.records import Measurement
from attnbench.results.store import Store


def _record(run, i: int = 0, status: str = "ok", **kw) -> Measurement:
    return run.record(task="fwd/bidir", attention=kw.pop("attention", "linear"), status=status, impl="torch",
                      dtype="fp32", options={"eps": 1e-6}, params={"seq_len": 1024 * (i + 1), "mode": "fwd"},
                      metrics={"time_median_s": 0.001 * (i + 1), "peak_mem_bytes": 1000 * (i + 1)}, seed=0, **kw)


def test_round_trip_carries_provenance(tmp_db):
    with Store() as s:
        assert s.path == tmp_db
        run = s.start_run(suite="scaling", setting="scaling/test", config={"a": 1}, device="cpu", threads=2,
                          argv=["attnbench", "run"])
        m = _record(run)
        (mid,) = s.add_many([m])
        s.finish_run(run.run_id, "ok")
        (back,) = s.measurements(suite="scaling")
        assert back.id == mid
        for field in ("suite", "task", "setting", "attention", "options", "impl", "config_hash", "seed",
                      "git_commit", "git_dirty", "packages", "device", "device_name", "dtype", "params", "metrics",
                      "status", "started_at", "ended_at", "run_id", "source"):
            assert getattr(back, field) == getattr(m, field), field
        assert back.packages.get("torch") and back.packages.get("python")
        assert back.device == "cpu" and back.device_name
        assert back.started_at and back.ended_at
        (r,) = s.runs("scaling")
        assert r["status"] == "ok" and r["config"] == {"a": 1} and r["ended_at"]
        assert s._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s._conn.execute("PRAGMA user_version").fetchone()[0] == st.SCHEMA_VERSION


def test_point_identity_and_resume_set(tmp_db):
    with Store() as s:
        run = s.start_run(suite="scaling", setting="scaling/test")
        a, b, c = _record(run, 0), _record(run, 1, status="oom"), _record(run, 2, status="interrupted")
        s.add_many([a, b, c])
        # same inputs -> same hash; a different N -> a different point
        assert _record(run, 0).config_hash == a.config_hash != b.config_hash
        # finished: ok and oom; interrupted (and failed) points are measured again
        assert s.finished("scaling") == {a.config_hash, b.config_hash}
        assert s.finished("scaling", [a.config_hash, c.config_hash]) == {a.config_hash}
        assert s.finished("lra") == set()


def test_bad_status_and_filters(tmp_db):
    with pytest.raises(ValueError, match="status"):
        Measurement(suite="s", task="t", setting="x", attention="a", status="great", device="cpu")
    with Store() as s:
        run = s.start_run(suite="scaling", setting="scaling/test")
        s.add_many([_record(run, 0), _record(run, 1, attention="softmax", status="timeout")])
        assert [m.attention for m in s.measurements(status="timeout")] == ["softmax"]
        assert [m.attention for m in s.measurements(attention="linear")] == ["linear"]
        assert s.count("scaling") == 2 and s.count() == 2


def test_transaction_is_all_or_nothing(tmp_db):
    with Store() as s:
        run = s.start_run(suite="scaling", setting="scaling/test")
        good = _record(run, 0)
        bad = _record(run, 1)
        bad.params = {"unserialisable": object()}  # canonical_json falls back to str: still fine ...
        s.add_many([good, bad])
        bad2 = _record(run, 2)
        bad2.suite = None  # NOT NULL: the insert fails and the whole batch rolls back
        with pytest.raises(sqlite3.IntegrityError):
            s.add_many([_record(run, 3), bad2])
        assert s.count() == 2


def test_jsonl_round_trip(tmp_path, tmp_db):
    with Store() as s:
        run = s.start_run(suite="scaling", setting="scaling/test")
        s.add_many([_record(run, i) for i in range(3)])
        recs = s.measurements()
    path = tmp_path / "out" / "x.jsonl"
    assert records.write_jsonl(recs, path) == 3
    assert [r.to_dict() for r in records.read_jsonl(path)] == [r.to_dict() for r in recs]
    path.write_text('{"nope": 1}\n')
    with pytest.raises(ValueError, match="x.jsonl:1"):
        records.read_jsonl(path)


def _writer(path: str, worker: int, n: int) -> None:
    with Store(path) as s:
        run = s.start_run(suite="scaling", setting=f"scaling/w{worker}", env={"device": "cpu"})
        for i in range(n):
            s.add(run.record(task="fwd/bidir", attention=f"w{worker}", status="ok", params={"i": i}))
        s.finish_run(run.run_id, "ok")


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "shared.db")
    Store(path).close()  # create the schema first (both writers would race to create it otherwise, also fine)
    ctx = mp.get_context("fork")
    n = 150
    procs = [ctx.Process(target=_writer, args=(path, w, n)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with Store(path) as s:
        assert s.count() == 2 * n
        for w in range(2):
            got = sorted(m.params["i"] for m in s.measurements(attention=f"w{w}"))
            assert got == list(range(n))
        assert [r["status"] for r in s.runs()] == ["ok", "ok"]


def test_db_path_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    proj = tmp_path / "proj"
    (proj / "sub" / "deeper").mkdir(parents=True)
    (proj / "pyproject.toml").write_text("")
    monkeypatch.chdir(proj / "sub" / "deeper")
    assert paths.default_db_path() == proj.resolve() / "results" / "attnbench.db"
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "env.db"))
    assert paths.default_db_path() == tmp_path / "env.db"
    assert paths.resolve_db(tmp_path / "flag.db") == tmp_path / "flag.db"   # --db wins
    assert st.open_existing(tmp_path / "missing.db") is None
    assert not (tmp_path / "missing.db").exists()


# --- a damaged file: one line naming it, never a traceback --------------------------------------------------------
def _damaged_files(tmp_path):
    rnd = tmp_path / "random.db"
    rnd.write_bytes(bytes(range(256)) * 8)
    good = tmp_path / "good.db"
    with Store(good) as s:
        run = s.start_run(suite="demo", setting="demo/x", env={"device": "cpu"})
        s.add_many([_record(run, i) for i in range(400)])
        s._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = good.read_bytes()
    cut = tmp_path / "truncated.db"
    cut.write_bytes(data[: len(data) // 2])
    return [rnd, cut]


def test_damaged_store_is_one_line_naming_the_file(tmp_path):
    for path in _damaged_files(tmp_path):
        with pytest.raises(st.StoreError) as info:
            Store(path)
        msg = str(info.value)
        assert str(path) in msg and "move it aside" in msg and "--db" in msg and "\n" not in msg, msg
        assert isinstance(info.value, st.AttnbenchError)


def test_damaged_store_in_the_cli(tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    for path in _damaged_files(tmp_path):
        for args in (["table", "demo", "--db", str(path)], ["export", "--format", "csv", "--db", str(path)],
                     ["ingest", str(path), "--db", str(tmp_path / "fine.db")],
                     ["ingest", str(tmp_path / "x.jsonl"), "--db", str(path)]):
            r = CliRunner().invoke(app, args)
            lines = r.output.strip().splitlines()
            assert r.exit_code != 0 and len(lines) == 1 and str(path) in lines[0], (args, r.output)
            assert lines[0].startswith("error:") and "Traceback" not in r.output


def test_schema_version_1_is_migrated_in_place(tmp_path):
    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    import re

    v1 = st._SCHEMA.replace(",\n    pid         INTEGER,\n    hostname    TEXT,\n    note        TEXT", "")
    v1 = re.sub(r"CREATE TABLE IF NOT EXISTS leases \(.*?\);", "", v1, flags=re.S)   # version 3 adds it
    assert "hostname" not in v1
    conn.executescript(v1)
    conn.execute("INSERT INTO runs (run_id, suite, setting, started_at, status) VALUES ('old', 'demo', 'demo/x', "
                 "'2025-01-01T00:00:00+00:00', 'running')")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with Store(path) as s:
        assert s._conn.execute("PRAGMA user_version").fetchone()[0] == st.SCHEMA_VERSION == 3
        assert s.leases() == []                                              # the leases table was created
        (old,) = s.runs()
        assert old["run_id"] == "old" and old["pid"] is None and old["hostname"] is None
        assert s.reap_dead_runs() == [] and s.run("old")["status"] == "running"   # no owner: left alone
        run = s.start_run(suite="demo", setting="demo/x")
        assert s.run(run.run_id)["pid"] == os.getpid()


def test_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(st.StoreError, match="newer than this attnbench"):
        Store(path)


# --- runs whose process died are reaped -----------------------------------------------------------------------
def _open_run_and_die(path: str, ready) -> None:
    s = Store(path)
    s.start_run(suite="demo", setting="demo/killed", env={"device": "cpu"})
    ready.set()
    time.sleep(600)  # killed by the parent long before


def start_and_sigkill(path) -> str:
    """A child process opens a run in ``path`` and is SIGKILLed; returns the run's id."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_open_run_and_die, args=(str(path), ready))
    proc.start()
    assert ready.wait(120)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    with Store(path) as s:
        (run,) = [r for r in s.runs() if r["setting"] == "demo/killed" and r["pid"] == proc.pid]
        assert run["status"] == "running" and run["hostname"] == socket.gethostname()
        return run["run_id"]


def test_runs_of_a_killed_process_are_marked_interrupted(tmp_db):
    run_id = start_and_sigkill(tmp_db)
    with Store() as s:
        mine = s.start_run(suite="demo", setting="demo/alive")                # this process: alive
        elsewhere = s.start_run(suite="demo", setting="demo/elsewhere")
        s._conn.execute("UPDATE runs SET hostname = 'another-host', pid = 1 WHERE run_id = ?", (elsewhere.run_id,))
        notes = s.reap_dead_runs()
        assert len(notes) == 1 and run_id[:12] in notes[0] and "interrupted" in notes[0]
        dead = s.run(run_id)
        assert dead["status"] == "interrupted" and dead["ended_at"] and dead["note"] == notes[0]
        assert s.run(mine.run_id)["status"] == "running"
        assert s.run(elsewhere.run_id)["status"] == "running"                 # not this host's to judge
        assert s.reap_dead_runs() == []                                        # once


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_a_reused_pid_does_not_keep_a_dead_run_alive(tmp_db):
    with Store() as s:
        run = s.start_run(suite="demo", setting="demo/reused")
        host = dict(s.run(run.run_id)["host"], pid_start=1)                  # same pid, another process start
        s._conn.execute("UPDATE runs SET host = ? WHERE run_id = ?", (json.dumps(host), run.run_id))
        assert len(s.reap_dead_runs()) == 1 and s.run(run.run_id)["status"] == "interrupted"


# --- leases: concurrent runs on one store (issue 27) -------------------------------------------------------------
def test_a_cell_is_claimed_once_and_dead_or_stale_claims_are_taken_over(tmp_db):
    h = "0123456789abcdef"
    with Store() as s:
        assert s.claim("demo", h, run_id="r1") == ("claimed", None)
        assert s.claim("demo", h, run_id="r1") == ("claimed", None)          # the holder itself: idempotent
        assert [row["pid"] for row in s.leases()] == [os.getpid()]
        host = socket.gethostname()

        def hold(pid, hostname, when="2999-01-01T00:00:00+00:00"):
            s._conn.execute("UPDATE leases SET pid = ?, pid_start = NULL, hostname = ?, heartbeat_at = ?",
                            (pid, hostname, when))

        hold(os.getppid(), host)                                                 # a live process of this host
        state, lease = s.claim("demo", h)
        assert state == "held" and lease["pid"] == os.getppid()
        dead = mp.get_context("spawn").Process(target=time.sleep, args=(0,))
        dead.start()
        dead.join()
        hold(dead.pid, host)                                                     # its process is gone: taken over
        assert s.claim("demo", h) == ("claimed", None)
        hold(12345, "another-host")                                              # another host, renewed: held
        assert s.claim("demo", h)[0] == "held"
        hold(12345, "another-host", "2000-01-01T00:00:00+00:00")                 # not renewed for ages: stale
        assert s.claim("demo", h) == ("claimed", None)
        s.release(h)
        assert s.leases() == []
        run = s.start_run(suite="demo", setting="demo/x")
        s.add(run.record(task="t", attention="a", status="ok", config_hash=h))
        assert s.claim("demo", h) == ("finished", None)                         # another process finished it
        assert s.claim("demo", h, force=True) == ("claimed", None)


_WORKER = r"""
import os, sys, time
from rich.console import Console
from attnbench.engine.sweep import Cell, CellResult, run_sweep

db, flag = sys.argv[1], sys.argv[2]

def run_cell(cell, ctx):
    t0 = time.time()
    while not os.path.exists(flag) and time.time() - t0 < 120:   # held until the test lets it go
        time.sleep(0.1)
    return CellResult("ok", metrics={"waited_s": time.time() - t0})

s = run_sweep([Cell(task="t", attention="a", config_hash="00000000000000aa")], run_cell, suite="demo",
              setting="demo/x", db=db, console=Console(width=200), progress=False)
sys.exit(s.exit_code())
"""


def test_two_processes_on_one_store_run_a_cell_once_and_the_record_names_the_other(tmp_path):
    import subprocess
    import sys

    db, flag = tmp_path / "shared.db", tmp_path / "go"
    env = {**os.environ, "ATTNBENCH_DB": str(db)}
    # an attnbench command running on this host meanwhile (any store): the record must say so
    other = subprocess.Popen(["bash", "-c", "exec -a attnbench sleep 120"])
    first = subprocess.Popen([sys.executable, "-c", _WORKER, str(db), str(flag)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:                                   # wait until the first one holds the cell
            if db.exists():
                try:
                    with Store(db) as s:
                        if s.leases():
                            break
                except st.StoreError:
                    pass
            time.sleep(0.2)
        second = subprocess.run([sys.executable, "-c", _WORKER, str(db), str(flag)], env=env, text=True,
                                capture_output=True, timeout=120)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "another process is running it (pid" in second.stdout and str(first.pid) in second.stdout
        flag.touch()
        out, _ = first.communicate(timeout=120)
        assert first.returncode == 0, out
    finally:
        flag.touch()
        other.kill()
        first.kill()
    with Store(db) as s:
        (m,) = s.measurements(suite="demo")                             # one record of the cell, by the first
        assert m.status == "ok" and s.leases() == []
        assert other.pid in [p["pid"] for p in m.metrics["concurrent_attnbench"]]


def test_a_record_names_the_other_workers_of_its_launcher_but_not_its_own_ranks():
    """The load a cell's timing shares the host with: a sibling worker of `--launcher workers` (another cell) is
    named; the processes of its own cell (a torchrun launcher and its ranks, a data-loader worker) and the idle
    commands above it are not."""
    from attnbench.engine.sweep import others_in

    py = "/usr/bin/python3"
    run = ["attnbench", "run", "vision", "--attn", "softmax"]
    table = {
        10: (1, ["bash"]),
        20: (10, [*run, "--launcher", "workers", "--jobs", "2"]),          # the launcher, waiting
        21: (20, [py, "-m", "attnbench.cli.main", "run", "vision"]),      # worker 1 (this process)
        22: (20, [py, "-m", "attnbench.cli.main", "run", "vision"]),      # worker 2: another cell
        23: (21, [py, "-m", "attnbench.cli.main", "run", "vision"]),      # worker 1's data-loader child
        30: (10, ["torchrun", "--nproc-per-node", "2", "attnbench", "run", "lm"]),
        31: (30, [py, "-m", "attnbench.cli.main", "run", "lm"]),          # rank 0
        32: (30, [py, "-m", "attnbench.cli.main", "run", "lm"]),          # rank 1
        40: (1, ["sleep", "9"]),
    }
    assert [p["pid"] for p in others_in(table, 21)] == [22, 31, 32]      # not the launcher, torchrun itself
    assert [p["pid"] for p in others_in(table, 31)] == [20, 21, 22, 23]
    alone = {k: v for k, v in table.items() if k < 30}
    del alone[22]
    assert others_in(alone, 21) == []


def test_an_unwritable_store_path_fails_before_any_work(tmp_path):
    assert st.check_writable(tmp_path / "new" / "a.db") == tmp_path / "new" / "a.db"
    with pytest.raises(st.StoreError, match="is a directory"):
        st.check_writable(tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(st.StoreError, match="cannot create the results store there"):
        st.check_writable(tmp_path / "file" / "a.db")                  # its "directory" is a file


def test_many_processes_on_one_store_run_every_cell_once(tmp_path):
    """benchmarks/store_stress.py small: processes sweeping the same short cells on one store (as N copies of one
    run command on a GPU node) record every cell once, run none twice and never fail on a locked database."""
    from pathlib import Path

    from .helpers import load_file

    stress = load_file("store_stress", Path(__file__).resolve().parents[1] / "benchmarks" / "store_stress.py")
    r = stress.stress(3, 30, tmp_path / "s.db", cell_ms=(1, 3), timeout=300)
    assert stress.failures(r) == [], r
    assert sum(r["cells_per_process"]) == 30
