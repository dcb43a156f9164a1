"""The results store: round trip, provenance, resume set, WAL and concurrent writers, path resolution."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3

import pytest

from attnbench import store as st
from attnbench.store import Measurement, Store


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
    assert st.write_jsonl(recs, path) == 3
    assert [r.to_dict() for r in st.read_jsonl(path)] == [r.to_dict() for r in recs]
    path.write_text('{"nope": 1}\n')
    with pytest.raises(ValueError, match="x.jsonl:1"):
        st.read_jsonl(path)


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
    monkeypatch.delenv(st.ENV_VAR, raising=False)
    proj = tmp_path / "proj"
    (proj / "sub" / "deeper").mkdir(parents=True)
    (proj / "pyproject.toml").write_text("")
    monkeypatch.chdir(proj / "sub" / "deeper")
    assert st.default_db_path() == proj.resolve() / "results" / "attnbench.db"
    monkeypatch.setenv(st.ENV_VAR, str(tmp_path / "env.db"))
    assert st.default_db_path() == tmp_path / "env.db"
    assert st.resolve_db(tmp_path / "flag.db") == tmp_path / "flag.db"   # --db wins
    assert st.open_existing(tmp_path / "missing.db") is None
    assert not (tmp_path / "missing.db").exists()
