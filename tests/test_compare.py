"""``attnbench compare``: cell by cell, each difference against its noise; ``--threshold`` gates a regression."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from attnbench.views import compare
from attnbench.cli.main import app
from attnbench.results.store import Store

TIMED = [("softmax", 1024, 0.0100), ("softmax", 2048, 0.0400), ("nala", 1024, 0.0030), ("nala", 2048, 0.0061)]


def _timing(t: float, slow: float = 1.0) -> dict:
    """A timing record's metrics (attnbench.measure.timing.TimingStats.as_metrics): 50 repeats, IQR 2% of the
    median."""
    t *= slow
    return {"time_median_s": t, "time_q25_s": 0.99 * t, "time_q75_s": 1.01 * t, "time_iqr_s": 0.02 * t,
            "reps": 50, "time_mean_s": t, "time_min_s": 0.97 * t}


def _store(path, *, slow: dict | None = None, scores: dict | None = None, commit: str = "a" * 40,
           machine: str = "CPU A", seeds=(0,)):
    """A store with timed points (one planted ``slow`` factor per (attention, N)) and accuracy cells
    (``scores``: attention -> per-seed accuracy in %, on 2000 test items)."""
    env = {"device": "cpu", "device_name": machine, "git_commit": commit, "git_dirty": False, "packages": {}}
    with Store(path) as s:
        run = s.start_run(suite="demo-scaling", setting="demo/cpu", env=env)
        s.add_many([run.record(task="fwd", attention=a, status="ok", dtype="fp32", params={"seq_len": n},
                               metrics=_timing(t, (slow or {}).get((a, n), 1.0))) for a, n, t in TIMED])
        s.finish_run(run.run_id, "ok")
        run = s.start_run(suite="demo-train", setting="demo/tiny", env=env)
        s.add_many([run.record(task="listops", attention=a, status="ok", dtype="float32", seed=seed,
                               params={"seed": seed, "steps": 600},
                               metrics={"score": sc[i], "n_test": 2000, "train_samples_per_s": 900.0})
                    for a, sc in (scores or {}).items() for i, seed in enumerate(seeds)])
        s.finish_run(run.run_id, "ok")
    return str(path)


def _run(*args):
    res = CliRunner().invoke(app, ["compare", *args, "--format", "md"])
    return res.exit_code, res.output


def test_a_planted_slowdown_fails_with_the_threshold_naming_the_cell_and_passes_without(tmp_path):
    a = _store(tmp_path / "a.db", scores={"nala": [30.75]})
    b = _store(tmp_path / "b.db", slow={("nala", 2048): 1.10}, scores={"nala": [31.25]})  # accuracy: inside noise
    code, out = _run(a, b, "--threshold", "5")
    assert code == 1, out
    bad = [ln for ln in out.splitlines() if ln.startswith("regression beyond 5%")]
    assert len(bad) == 1 and "nala" in bad[0] and "seq_len=2048" in bad[0] and "+10.0%" in bad[0], out
    rows = [ln for ln in out.splitlines() if ln.startswith("| demo")]
    speed = [r for r in rows if "| time |" in r]
    assert len(speed) == 4 and "seq_len=2048" in speed[0] and "slower ✗" in speed[0]  # sorted by size
    assert not any("✗" in r for r in rows if r != speed[0])
    acc = next(r for r in rows if "accuracy" in r)
    assert "within noise" in acc and "two-proportion" in acc  # 30.75 vs 31.25 on 2000 items: not flagged
    code, out = _run(a, b)
    assert code == 0 and "regression" not in out and "slower" in out, out


def test_an_accuracy_drop_beyond_noise_is_flagged_and_a_speed_up_is_not(tmp_path):
    a = _store(tmp_path / "a.db", scores={"nala": [40.0]})
    b = _store(tmp_path / "b.db", slow={("softmax", 1024): 0.8}, scores={"nala": [30.0]})
    code, out = _run(a, b, "--threshold", "5")
    assert code == 1
    (bad,) = [ln for ln in out.splitlines() if ln.startswith("regression")]
    assert "accuracy" in bad and "-25.0%" in bad
    assert "faster" in out  # the softmax speed-up is significant but not a regression


def test_seeds_use_the_seed_interval(tmp_path):
    a = _store(tmp_path / "a.db", scores={"nala": [30.0, 40.0, 35.0]}, seeds=(0, 1, 2))
    b = _store(tmp_path / "b.db", scores={"nala": [33.0, 28.0, 31.0]}, seeds=(0, 1, 2))
    cmp = compare.compare(compare.Side("a", compare.load_records(a)), compare.Side("b", compare.load_records(b)))
    (acc,) = [d for d in cmp.differences if d.metric.key == "score"]
    assert acc.n_a == acc.n_b == 3 and "Welch" in acc.test
    assert acc.a == pytest.approx(35.0) and acc.b == pytest.approx(92 / 3)
    # 2000 test items would call a 4.3-point drop significant; the seeds' spread does not
    assert acc.p > 0.05 and acc.verdict == "within noise"


def test_two_commits_and_two_machines_inside_one_store(tmp_path):
    db = tmp_path / "one.db"
    _store(db, scores={"nala": [30.0]}, commit="1" * 40, machine="Xeon 8480")
    _store(db, slow={("softmax", 2048): 1.2}, scores={"nala": [30.0]}, commit="2" * 40, machine="EPYC 9654")
    code, out = _run(str(db), "--commits", "111,222", "--threshold", "10")
    assert code == 1 and "softmax" in out.split("regression beyond")[1]
    code, out = _run(str(db), "--machines", "xeon,epyc")
    assert code == 0 and "A = " in out and "Xeon 8480" in out and "EPYC 9654" in out


def test_jsonl_exports_compare_like_stores(tmp_path):
    a = _store(tmp_path / "a.db")
    b = _store(tmp_path / "b.db", slow={("nala", 1024): 1.5})
    res = CliRunner().invoke(app, ["export", "--format", "jsonl", "--db", b, "--out", str(tmp_path / "b.jsonl")])
    assert res.exit_code == 0, res.output
    code, out = _run(a, str(tmp_path / "b.jsonl"), "--threshold", "20")
    assert code == 1 and "+50.0%" in out


@pytest.mark.parametrize("args, msg", [
    (["nowhere.db", "b.db"], "no such file"),
    (["a.db"], "exactly one of these"),
    (["a.db", "b.db", "--commits", "x,y"], "exactly one of these"),
    (["a.db", "--commits", "111"], "two commits"),
    (["a.db", "--commits", "111,999"], "matches 0 commits"),
    (["a.db", "--machines", "CPU,nothing"], "matches 0 machines"),
    (["a.db", "b.db", "--threshold", "-1"], "--threshold"),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, args, msg):
    monkeypatch.chdir(tmp_path)
    _store(tmp_path / "a.db", commit="1" * 40)
    _store(tmp_path / "b.db")
    code, out = _run(*args)
    assert code == 2 and msg in out and "Traceback" not in out, out


def test_nothing_in_common_fails(tmp_path):
    a = _store(tmp_path / "a.db")
    with Store(tmp_path / "b.db") as s:
        run = s.start_run(suite="other", setting="x", env={"device": "cpu"})
        s.add(run.record(task="t", attention="softmax", status="ok", metrics=_timing(0.01)))
    code, out = _run(a, str(tmp_path / "b.db"))
    assert code == 1 and "no cell in common" in out


def test_json_output_stays_one_document(tmp_path):
    a = _store(tmp_path / "a.db")
    b = _store(tmp_path / "b.db", slow={("nala", 1024): 1.3})
    res = CliRunner().invoke(app, ["compare", a, b, "--format", "json"])
    assert res.exit_code == 0
    (speed,) = json.loads(res.stdout)
    assert speed["title"] == "compare · speed" and speed["rows"][0]["change"] == "+30.0%"


# --- the separation line under every leaderboard ------------------------------------------------------------------
def test_holm_steps_down_like_its_definition():
    # sorted p: 0.01 <= 0.05/4, 0.015 <= 0.05/3, 0.03 > 0.05/2 stops there; 0.04 is not rejected although < 0.05
    assert compare.holm([0.03, 0.01, 0.04, 0.015]) == [False, True, False, True]
    assert compare.holm([]) == [] and compare.holm([0.049]) == [True] and compare.holm([0.051]) == [False]


def _records(scores: dict, n_test: int = 2000):
    from attnbench.results.records import Measurement

    return {a: [Measurement(suite="demo", setting="demo/tiny", task="listops", attention=a, status="ok", seed=i, device="cpu",
                            metrics={"score": s, "n_test": n_test}, config_hash=f"{a}{i}")
                for i, s in enumerate(ss)] for a, ss in scores.items()}


def test_a_planted_separated_pair_is_counted_and_a_table_of_ties_says_so():
    score = compare.metric("score")
    apart = compare.separation(_records({"softmax": [90.0], "linear": [60.0], "nala": [60.5]}), score)
    assert (apart.separated, apart.pairs) == (2, 3)          # softmax from both; linear and nala 0.5 points apart
    assert apart.line("listops").startswith("listops: 2 of 3 pairs separated (two-proportion z; Holm-corrected")
    ties = compare.separation(_records({"softmax": [61.0], "linear": [60.0], "nala": [60.5]}), score)
    assert ties.separated == 0 and "this table does not tell its rows apart." in ties.line()
    seeds = compare.separation(_records({"a": [60.0, 60.2, 59.9], "b": [70.1, 69.8, 70.0]}), score)
    assert (seeds.separated, seeds.tests) == (1, ("Welch t over seeds",))
    # seeds without spread (one model evaluated at every seed) are tested against the test set, not called apart
    flat = compare.separation(_records({"teacher": [94.8] * 3, "student": [96.3] * 3}, n_test=270), score)
    assert (flat.separated, flat.tests) == (0, ("two-proportion z",))
    ppl = compare.separation(_records({"a": [12.0], "b": [30.0]}), compare.metric("test_ppl"))
    assert (ppl.pairs, ppl.untested) == (0, 1) and "no pair of rows can be tested" in ppl.line()


def test_the_marks_test_a_pair_as_the_separation_line_does():
    """A best row and another 5 points below it, three seeds each: the test set alone (n = 2000) calls them
    apart, but seeds 10 points apart do not; the ≈ mark of every leaderboard reads the seeds, as the line does."""
    from attnbench.suites.vision.leaderboard import measured_tables

    rows = _records({"softmax": [80.0, 90.0, 100.0], "nala": [75.0, 85.0, 95.0]})
    assert compare.two_proportion_p(0.90, 2000, 0.85, 2000) < 1e-5 < 0.05 < compare.score_p(rows["nala"], rows["softmax"])
    assert compare.score_p(rows["nala"][:1], rows["softmax"][:1]) < 0.05    # one seed a row: the test set's test
    assert compare.score_p(rows["nala"], []) is None
    for r in rows["softmax"] + rows["nala"]:
        r.suite, r.setting, r.metrics = "vision", "vision/tiny", {
            **r.metrics, "n_params": 1, "flops_per_image": 1, "train_images_per_s": 1, "infer_images_per_s": 1,
            "wall_s": 1}
    (_, _, table, cap), = measured_tables(rows["softmax"] + rows["nala"], "mine")
    assert table[1][0] == "nala" and table[1][2].endswith(" ≈") and "0 of 1 pairs separated" in cap, (table, cap)
    assert compare.SCORE_TEST in cap


def test_every_suites_leaderboard_carries_the_line():
    from attnbench.views.sources import Source, committed_records
    from attnbench.views.tables import view_of

    for suite in ("lra", "vision", "adala", "mixa", "lm", "scaling", "claims"):
        tables = view_of(suite).data(Source("committed", committed_records(suite), committed=True))
        caps = [cap for _, _, _, cap in tables]
        assert caps and all("Separation" in c for c in caps), (suite, [c[-200:] for c in caps if "Separation" not in c])
