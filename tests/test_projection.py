"""What more seeds would separate (attnbench.results.stats' projection under every separation line) and
``attnbench plan``: planted rows of known means and spreads, checked against simulated seeds (Welch + Holm)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from attnbench.cli.main import app
from attnbench.results import stats
from attnbench.results.store import Store
from attnbench.views import compare
from attnbench.views.plan import pair_needs, plan
from attnbench.views.sources import Source
from attnbench.views.tables import view_of

# Planted rows: accuracy (%) means and seed standard deviations. c and d have equal means; a-b are close.
MEANS = {"a": 60.0, "b": 61.5, "c": 66.0, "d": 66.0, "e": 75.0}
SDS = {"a": 2.0, "b": 3.0, "c": 1.5, "d": 4.0, "e": 2.5}
# How far the projection may stray from the simulation, in pairs of the 10, by seeds a row: Holm's step-down is
# approximated by a level per pair, and at three seeds Welch's degrees of freedom, estimated from the draws, are
# fewer than the truth's the projection uses, so it overstates (measured: 1.96 against 1.23 at 3, 4.17 against
# 3.79 at 4, within 0.05 from 6 on).
TOLERANCE = {3: 0.8, 4: 0.5, 6: 0.2, 10: 0.2}


def _pairs(n: int) -> list[stats.PairSpread]:
    labs = sorted(MEANS)
    return [stats.PairSpread(MEANS[x] - MEANS[y], SDS[x], SDS[y], n, n) for x, y in itertools.combinations(labs, 2)]


def simulate(seeds: int, reps: int = 4000, alpha: float = 0.05) -> float:
    """Mean number of pairs separated over ``reps`` draws of ``seeds`` seeds a row from normals of the planted means
    and spreads: Welch's t (degrees of freedom rounded down, as compare tests) and Holm's step-down over all pairs."""
    rng = np.random.default_rng(0)
    labs = sorted(MEANS)
    mu, sd = np.array([MEANS[x] for x in labs]), np.array([SDS[x] for x in labs])
    x = rng.normal(mu[None, :, None], sd[None, :, None], size=(reps, len(labs), seeds))
    mean, var = x.mean(2), x.var(2, ddof=1) / seeds
    i, j = np.triu_indices(len(labs), 1)
    se2 = var[:, i] + var[:, j]
    df = np.floor(se2 ** 2 / ((var[:, i] ** 2 + var[:, j] ** 2) / (seeds - 1))).clip(1)
    p = np.sort(2 * sps.t.sf(np.abs(mean[:, i] - mean[:, j]) / np.sqrt(se2), df), axis=1)
    m = p.shape[1]
    return float(np.cumprod(p <= alpha / (m - np.arange(m)), axis=1).sum(1).mean())


@pytest.mark.parametrize("seeds", sorted(TOLERANCE))
def test_projected_separations_agree_with_simulated_seeds(seeds):
    projected, simulated = stats.expected_separated(_pairs(seeds)), simulate(seeds)
    assert abs(projected - simulated) <= TOLERANCE[seeds], (projected, simulated)


def test_equal_means_are_never_separated():
    tie = stats.PairSpread(0.0, 1.5, 4.0, 3, 3)
    for n in (3, 30, 300):
        assert stats.welch_power(tie.at(n), 0.05) == pytest.approx(0.05, abs=0.01)   # its false-alarm rate only
    needs = {(n.a, n.b): n for n in pair_needs(tuple(itertools.combinations(sorted(MEANS), 2)), tuple(_pairs(3)))}
    assert needs[("c", "d")].seeds is None                   # no seed count separates it
    assert needs[("a", "e")].seeds is not None and needs[("a", "e")].seeds <= 5
    assert needs[("a", "b")].seeds > needs[("a", "c")].seeds  # a small gap needs more seeds


def _records(rows: dict[str, list[float]], *, suite: str = "demo", wall: float = 60.0):
    from attnbench.results.records import Measurement

    return {a: [Measurement(suite=suite, setting=f"{suite}/tiny", task="t", attention=a, status="ok", seed=i,
                            device="cpu", params={"seed": i}, metrics={"score": s, "n_test": 2000, "wall_s": wall},
                            config_hash=f"{a}{i}") for i, s in enumerate(ss)] for a, ss in rows.items()}


def _draws(n: int = 3) -> dict[str, list[float]]:
    """Seeds whose mean and standard deviation are the planted ones exactly (m - s, m, m + s at three)."""
    assert n == 3
    return {a: [MEANS[a] - SDS[a], MEANS[a], MEANS[a] + SDS[a]] for a in MEANS}


def test_the_separation_line_projects_several_seeds_and_explains_one():
    several = compare.separation(_records(_draws(3)), compare.metric("score")).line("Separation")
    assert "Projection (a calculation, not a measurement" in several and "8 seeds a row would separate about" in several
    assert "of 10 pairs" in several and "could show at 32 seeds" in several
    one = compare.separation(_records({a: [m] for a, m in MEANS.items()}), compare.metric("score")).line()
    assert "One seed a row: its intervals are the test set's alone" in one and "needs 3 seeds" in one
    assert "Projection" not in one


def _store(path, rows: dict[str, list[float]], wall: float = 60.0) -> str:
    env = {"device": "cpu", "device_name": "CPU A", "git_commit": "a" * 40, "git_dirty": False, "packages": {}}
    with Store(path) as s:
        run = s.start_run(suite="demo", setting="demo/tiny", env=env)
        s.add_many([run.record(task="t", attention=a, status="ok", dtype="float32", seed=i, params={"seed": i},
                               metrics={"score": v, "n_test": 2000, "wall_s": wall})
                    for a, vs in rows.items() for i, v in enumerate(vs)])
        s.finish_run(run.run_id, "ok")
    return str(path)


def test_plan_sizes_a_fixed_design_within_the_budget(tmp_path):
    db = _store(tmp_path / "p.db", _draws(3))
    text = "\n".join(plan("demo", db=db, cells=40))
    assert "A fixed design chosen now" in text and "no sequential stop" in text
    assert "not separable by 64 seeds a row" in text and "c vs d" in text.split("not separable")[1]
    # the budget holds: at most 40 more cells (seeds of a row)
    cells = int(text.split("cost at the pilot's cell times (")[1].split("): ")[1].split(" cells")[0])
    assert 0 < cells <= 40
    small = "\n".join(plan("demo", db=db, cells=1))
    assert "beyond this budget" in small


def test_plan_of_one_seed_rows_asks_for_a_first_estimate(tmp_path):
    db = _store(tmp_path / "one.db", {a: [m] for a, m in MEANS.items()})
    text = "\n".join(plan("demo", db=db, hours=1))
    assert "One seed a row" in text and "Run seeds 1,2 first" in text


@pytest.mark.parametrize("args, msg", [
    (["plan", "doctor", "--cells", "10"], "no finished doctor records"),
    (["plan", "demo", "--cells", "0"], "the budget must be positive"),
    (["plan", "demo", "--hours", "0"], "the budget must be positive"),
    (["plan", "demo"], "give a budget"),
    (["plan", "demo", "--cells", "5", "--gpu", "V100"], "--gpu 'V100'"),
])
def test_bad_input_is_one_line_and_fails(tmp_path, args, msg):
    db = _store(tmp_path / "p.db", _draws(3))
    res = CliRunner().invoke(app, args + ["--db", db])
    assert res.exit_code != 0 and msg in res.output and len(res.output.strip().splitlines()) == 1, res.output


def test_plan_prints_the_run_line_of_a_registered_suite(tmp_path):
    from attnbench.views.plan import BoardPlan, run_lines

    recs = [r for rs in _records({"softmax": [99.0, 99.5], "nala": [80.0, 85.0]}, suite="recall").values() for r in rs]
    for r in recs:
        r.params.update(preset="tiny", threads=1)
        r.task = "mqar d=32"  # a sweep's board: the line runs its point, not the preset's default one
    p = BoardPlan("b", {"softmax": 2, "nala": 2}, {"softmax": 4, "nala": 4}, {"softmax": 60.0, "nala": 60.0}, [], [],
                  0.0, 0.0, 0.0, 0, {"softmax": [0, 1], "nala": [0, 1]})
    assert run_lines("recall", p, recs, "r.db") == [
        "attnbench run recall --preset tiny --point 'mqar d=32' --attn nala,softmax --seeds 2,3 --threads 1 --db r.db"]


def test_a_plan_line_spells_each_row_as_it_was_run(tmp_path):
    """LRA labels a row with the options its preset added ("nystromformer(landmarks=128)"), a spelling `--attn`
    refuses; the plan's line gives the spec as it was run, which takes them from the preset again. A spec that
    spells its options is not labelled twice."""
    env = {"device": "cpu", "device_name": "CPU A", "git_commit": "a" * 40, "git_dirty": False, "packages": {}}
    rows = {("nystromformer", 128): [30.0, 33.0, 31.5], ("laplacian:landmarks=16", 16): [29.0, 30.5, 28.0]}
    with Store(tmp_path / "l.db") as s:
        run = s.start_run(suite="lra", setting="lra/mine", env=env)   # not the committed results' setting
        s.add_many([run.record(task="listops", attention=a, options={"landmarks": n}, status="ok", dtype="float32",
                               seed=i, params={"seed": i, "preset": "tiny", "threads": 1},
                               metrics={"score": v, "n_test": 2000, "wall_s": 20.0})
                    for (a, n), vs in rows.items() for i, v in enumerate(vs)])
        s.finish_run(run.run_id, "ok")
        table = "\n".join(ln for t in view_of("lra").data(Source("mine", s.measurements(suite="lra")))
                          for ln in map(str, t[2]))
    assert "nystromformer(landmarks=128)" in table and "laplacian:landmarks=16(" not in table
    lines = [ln for ln in plan("lra", db=str(tmp_path / "l.db"), cells=20, setting="lra/mine")
             if "attnbench run lra" in ln]
    assert lines and all(" --attn laplacian:landmarks=16,nystromformer --seeds 3," in ln for ln in lines), lines


def test_every_committed_table_says_what_more_seeds_would_tell():
    """The committed leaderboards (results/*/*.md, rendered by `attnbench export`): a line tested over seeds carries
    its projection, a line of one seed a row its caveat."""
    from pathlib import Path

    lines = [line for md in Path(__file__).parents[1].glob("results/**/*.md") for line in md.read_text().splitlines()
             if "pairs separated (" in line]
    assert lines
    for line in lines:
        for part in line.split("Separation")[1:]:
            if "pairs separated (Welch t over seeds" in part:
                assert "Projection (a calculation, not a measurement" in part, part[:200]
            elif "pairs separated (two-proportion z" in part:
                assert "One seed a row" in part, part[:200]


def test_a_suite_that_runs_every_row_at_once_gets_the_same_seeds_a_row():
    from attnbench.views.plan import choose_together

    needs = pair_needs(tuple(itertools.combinations(sorted(MEANS), 2)), tuple(_pairs(3)))
    now = {a: 3 for a in MEANS}
    planned, chosen = choose_together(needs, now, {a: 1.0 for a in MEANS}, budget_s=10.0, max_seeds=64)
    assert set(planned.values()) == {5} and all(n.seeds <= 5 for n in chosen) and chosen  # 2 more seeds of 5 rows
    assert choose_together(needs, now, {a: 1.0 for a in MEANS}, budget_s=4.0, max_seeds=64) == (now, [])


def test_gpu_cost_is_measured_where_the_store_has_that_gpu_else_a_flop_estimate(tmp_path):
    db = _store(tmp_path / "g.db", _draws(3))
    assert "a FLOP estimate" not in "\n".join(plan("demo", db=db, cells=40))   # neither timings nor FLOPs: said so
    env = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "git_commit": "a" * 40, "git_dirty": False,
           "packages": {}}
    with Store(db) as s:
        run = s.start_run(suite="demo", setting="demo/tiny", env=env)
        s.add_many([run.record(task="t", attention=a, status="ok", dtype="float32", seed=0, params={"seed": 0},
                               metrics={"score": MEANS[a], "n_test": 2000, "wall_s": 2.0}) for a in MEANS])
        s.finish_run(run.run_id, "ok")
    text = "\n".join(plan("demo", db=db, cells=40, gpu="H100"))
    assert "measured on it" in text and "on one H100: " in text
