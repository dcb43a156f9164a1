"""Seeds: a cell is (spec, task, seed); a leaderboard row is (spec, task) over its seeds (attnbench.views.rows.seed_rows,
aggregate, fmt_seeds; attnbench.results.stats.SeedStats); ``attnbench show`` gives the command that makes a row again."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attnbench.results import stats
from attnbench.results.records import Measurement, point_hash, read_jsonl
from attnbench.results.store import Store
from attnbench.views import tables
from attnbench.views.render import markdown_tables
from attnbench.views.rows import fmt_seeds
from attnbench.views.sources import committed_records, reference_files, Source


# --- the statistics -----------------------------------------------------------------------------------------------
def test_closed_forms_match_scipy():
    sst = pytest.importorskip("scipy.stats")
    for df in range(1, 15):
        assert stats.t_quantile(df) == pytest.approx(sst.t.ppf(0.975, df), rel=1e-9)
        for t in (0.2, 1.0, 2.5, 7.0):
            assert stats.t_two_sided_p(t, df) == pytest.approx(2 * sst.t.sf(t, df), rel=1e-9, abs=1e-15)
        for x in (0.05, 1.0, 4.0, 12.0, 40.0):
            assert stats.chi2_sf(x, df) == pytest.approx(sst.chi2.sf(x, df), rel=1e-9, abs=1e-15)
    a, b = [30.1, 31.7, 29.4, 30.0], [28.2, 27.9, 29.5]
    assert stats.welch_p(a, b) >= sst.ttest_ind(a, b, equal_var=False).pvalue  # df rounded down: conservative


def test_seed_stats_interval_and_disagreement():
    st = stats.seed_stats([30.1, 30.5, 30.3], n_test=2000)
    assert st.n == 3 and st.mean == pytest.approx(30.3)
    assert st.half == pytest.approx(stats.t_quantile(2) * 0.2 / 3 ** 0.5)
    assert st.test_half == pytest.approx(2.0, abs=0.05) and not st.disagree
    chi2 = pytest.importorskip("scipy.stats").chi2_contingency
    counts = [[400, 1600], [600, 1400], [800, 1200]]
    wild = stats.seed_stats([20.0, 30.0, 40.0], n_test=2000)
    assert wild.disagree and wild.disagree_p == pytest.approx(chi2(counts, correction=False)[1], rel=1e-6)
    assert stats.seed_stats([55.0, 60.0], n_test=None).disagree_p is None  # not a proportion: no test
    one = stats.seed_stats([30.0], n_test=2000)
    assert one.half is None and one.disagree_p is None and fmt_seeds(one) == "30.00 ± 2.0"


# --- identity -----------------------------------------------------------------------------------------------------
def test_the_seed_is_in_the_identity_and_seed_0_keeps_the_legacy_one():
    base = dict(suite="s", task="t", setting="s/x", attention="nala", status="ok", device="cpu", dtype="float32")
    legacy = point_hash(suite="s", setting="s/x", task="t", attention="nala", options={}, params={},
                        dtype="float32", device="cpu")
    assert Measurement(**base, seed=0).config_hash == legacy == Measurement(**base).config_hash
    assert len({Measurement(**base, seed=s).config_hash for s in (0, 1, 2)}) == 3
    # the training suites put the seed in params themselves (seed 0 too): their identities are unchanged
    p = {"seed": 1, "steps": 4}
    assert Measurement(**base, seed=1, params=p).config_hash == point_hash(
        suite="s", setting="s/x", task="t", attention="nala", options={}, params=p, dtype="float32", device="cpu")


def test_every_committed_record_keeps_its_identity():
    from attnbench.views.sources import committed_records

    for suite in ("lra", "vision", "mixa", "adala", "lm"):
        for r in committed_records(suite):
            if "seed" in r.params:
                again = dataclasses.replace(r, config_hash="")
                assert again.config_hash == r.config_hash or r.task == "lm-eval", (suite, r.attention)


# --- tables -------------------------------------------------------------------------------------------------------
def _reseeded(recs: list[Measurement], scores: dict[int, float]) -> list[Measurement]:
    """Copies of ``recs`` at other seeds with planted scores (seed -> score)."""
    out = []
    for r in recs:
        for seed, score in scores.items():
            out.append(dataclasses.replace(r, seed=seed, params={**r.params, "seed": seed}, config_hash="", id=None,
                                           metrics={**r.metrics, "score": score}))
    return out


def _render(suite: str, recs: list[Measurement]) -> str:
    return markdown_tables(tables.view_of(suite).data(Source("planted", recs)))


@pytest.mark.parametrize("suite, attention", [("lra", "nala"), ("vision", "nala"), ("mixa", "mixa"),
                                               ("adala", "linear")])
def test_every_accuracy_table_shows_mean_seed_interval_and_the_disagreement_mark(suite, attention):
    recs = [r for r in committed_records(suite) if r.attention == attention and r.seed == 0
            and r.status == "ok"][:1]
    assert recs, suite
    agree = _render(suite, _reseeded(recs, {0: 90.0, 1: 90.4, 2: 89.6}))
    assert "90.00 ± " in agree and "(seeds ± 0.99, n=3)" in agree and " !" not in agree.split("\n\n")[1]
    assert "χ² test of homogeneity" in agree  # the caption defines the mark
    wild = _render(suite, _reseeded(recs, {0: 70.0, 1: 90.0, 2: 80.0}))
    assert "(seeds ± 24.84, n=3) !" in wild


def test_the_committed_seed_files_render_as_mean_and_seed_interval():
    lm = _render("lm", read_jsonl(reference_files("lm")[0].parent / "tiny-cpu.jsonl"))
    row = next(ln for ln in lm.splitlines() if ln.startswith("| deltanet |"))
    assert "54.10 (seeds ± 5.35, n=3)" in row  # results/lm/README.md: 54.10 ± 5.35 over 3 seeds
    assert "no disagreement mark" in lm
    mixa = _render("mixa", read_jsonl(reference_files("mixa")[0].parent / "tiny-cpu-seeds.jsonl"))
    row = next(ln for ln in mixa.splitlines() if ln.startswith("| mixa |"))
    assert "95.93 ± 2.4 (seeds ± 4.71, n=2)" in row    # seeds 1 and 2: 95.56, 96.30 (results/mixa/README.md)
    # every committed MixA record: the deep study trained a teacher per seed and is one table over its 3 seeds; the
    # tiny reference run, an older configuration of the preset, is a table of its own beside seeds 1 and 2's
    boards = _render("mixa", committed_records("mixa")).split("#### ")
    deep = next(b for b in boards if b.startswith("mixa — mixa/tiny-deep"))
    row = next(ln for ln in deep.splitlines() if ln.startswith("| mixa |"))
    assert "94.69 ± 2.7 (seeds ± 8.30, n=3)" in row and "seed 2: softmax-" in deep  # results/mixa/README.md: 94.69 ± 8.30
    tiny = [b for b in boards if b.startswith("mixa — mixa/tiny ·")]
    rows = sorted(next(ln for ln in b.splitlines() if ln.startswith("| mixa |")) for b in tiny)
    assert len(tiny) == 2 and "91.11" in rows[0] and "(seeds ± 4.71, n=2)" in rows[1]
    assert {b.split(" · preset ")[1][:8] for b in tiny} == {"ea44c3b2", "d65bd091"}


def test_show_of_a_committed_row_prints_checkout_and_command(tmp_path):
    from attnbench.cli.main import app

    res = CliRunner().invoke(app, ["show", "lm", "deltanet", "--db", str(tmp_path / "none.db")])
    assert res.exit_code == 0, res.output
    assert "3 seed(s) [0, 1, 2]" in res.output
    assert "git checkout 1c1e799077456045d8dbb30efc9b444729658a67" in res.output
    assert "attnbench run lm --preset tiny --attn deltanet --seed 2" in res.output
    res = CliRunner().invoke(app, ["show", "lra", "nalla", "--db", str(tmp_path / "none.db")])
    assert res.exit_code == 2 and "no lra row 'nalla'" in res.output and "nala (listops)" in res.output


# --- a run over seeds, end to end -------------------------------------------------------------------------------
TOY = """
name = "toy"
description = "test preset"
tasks_default = ["listops"]
[model]
dim = 16
ffn_dim = 32
heads = 2
head_dim = 8
layers = 1
dropout = 0.0
[tasks.listops]
data = "generate"
seq_len = 32
batch_size = 8
lr = 1e-3
warmup = 2
steps = 4
eval_every = 2
[tasks.listops.generate]
n_train = 64
n_val = 16
n_test = 16
max_depth = 4
max_args = 4
min_length = 8
max_length = 32
"""


def _cli(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "attnbench.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_three_seeds_make_three_cells_one_row_and_show_gives_a_command_that_finds_its_cell(tmp_path, monkeypatch):
    from attnbench.cli.main import app

    (tmp_path / "toy.toml").write_text(TOY)
    db = str(tmp_path / "s.db")
    p = _cli("run", "lra", "--attn", "nala", "--preset", "toy.toml", "--seeds", "0,1,2", "--db", db, "--out",
             str(tmp_path / "w"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with Store(db) as s:
        recs = s.measurements(suite="lra")
    assert sorted(r.seed for r in recs) == [0, 1, 2] and len({r.config_hash for r in recs}) == 3
    assert all(r.params["seed"] == r.seed for r in recs)
    p = _cli("table", "lra", "--db", db, "--no-committed", "--format", "md", cwd=tmp_path)
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("| nala |"))  # the accuracy table
    st = stats.seed_stats([r.metrics["score"] for r in recs], n_test=16)
    assert f"{st.mean:.2f} ± {st.test_half:.1f} (seeds ± {st.half:.2f}, n=3)" in row
    p = _cli("show", "lra", "nala", "--task", "listops", "--db", db, "--no-committed", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "3 seed(s) [0, 1, 2]" in p.stdout and f"cell {recs[1].config_hash}" in p.stdout
    (cmd,) = [ln.strip() for ln in p.stdout.splitlines() if ln.strip().startswith("attnbench run") and
              ln.strip().endswith("--seed 1")]
    assert "--attn nala" in cmd and "--tasks listops" in cmd and "--preset toy.toml" in cmd and "--seeds" not in cmd
    # the shown command, run again (in this process: a process start less): its cell is already there
    monkeypatch.chdir(tmp_path)
    again = CliRunner().invoke(app, cmd.split()[1:], env={"COLUMNS": "250"})
    assert again.exit_code == 0, again.output[-3000:]
    assert "1 cell(s) already finished" in again.output and "1 finished earlier" in again.output
    with Store(db) as s:
        assert len(s.measurements(suite="lra")) == 3


def test_per_seed_runs_each_seed_as_its_own_run_and_merges():
    from attnbench.engine.context import RunOptions
    from attnbench.engine.sweep import Cell, CellResult, Outcome, SweepSummary, per_seed

    assert per_seed(RunOptions(seed=3), lambda o: None) is None  # one seed: the caller runs it
    seen = []

    def one(o):
        seen.append((o.seed, o.seeds))
        cell = Cell(task="t", attention="a", config_hash=f"{o.seed:016x}", seed=o.seed)
        return SweepSummary("s", "s/x", [Outcome(cell, CellResult("ok"))], run_id=f"r{o.seed}", planned=1,
                            interrupted=o.seed == 1)

    merged = per_seed(RunOptions(seeds=[0, 1, 2]), one)
    assert seen == [(0, [0]), (1, [1])]  # stops at the interrupted seed
    assert merged.interrupted and merged.planned == 2 and [o.cell.seed for o in merged.outcomes] == [0, 1]
