"""Seeds: a cell is (spec, task, seed); a leaderboard row is (spec, task) over its seeds (attnbench.tables.seed_rows,
aggregate, fmt_seeds; attnbench.stats.SeedStats); ``attnbench show`` gives the command that makes a row again."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from attnbench import stats, tables
from attnbench.store import Measurement, Store, point_hash, read_jsonl


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
    assert one.half is None and one.disagree_p is None and tables.fmt_seeds(one) == "30.00 ± 2.0"


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
    from attnbench.tables import committed_records

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
    return tables.markdown_tables(tables.view_of(suite).data(tables.Source("planted", recs)))


@pytest.mark.parametrize("suite, attention", [("lra", "nala"), ("vision", "nala"), ("mixa", "mixa"),
                                               ("adala", "linear")])
def test_every_accuracy_table_shows_mean_seed_interval_and_the_disagreement_mark(suite, attention):
    recs = [r for r in tables.committed_records(suite) if r.attention == attention and r.seed == 0
            and r.status == "ok"][:1]
    assert recs, suite
    agree = _render(suite, _reseeded(recs, {0: 90.0, 1: 90.4, 2: 89.6}))
    assert "90.00 ± " in agree and "(seeds ± 0.99, n=3)" in agree and " !" not in agree.split("\n\n")[1]
    assert "χ² test of homogeneity" in agree  # the caption defines the mark
    wild = _render(suite, _reseeded(recs, {0: 70.0, 1: 90.0, 2: 80.0}))
    assert "(seeds ± 24.84, n=3) !" in wild


def test_the_committed_seed_files_render_as_mean_and_seed_interval():
    lm = _render("lm", read_jsonl(tables.reference_files("lm")[0].parent / "tiny-cpu-seeds.jsonl"))
    row = next(ln for ln in lm.splitlines() if ln.startswith("| deltanet |"))
    assert "54.13 (seeds ± 5.29, n=3)" in row  # results/lm/README.md: 54.13 ± 5.29 over 3 seeds
    assert "no disagreement mark" in lm
    mixa = _render("mixa", read_jsonl(tables.reference_files("mixa")[0].parent / "tiny-cpu-seeds.jsonl"))
    row = next(ln for ln in mixa.splitlines() if ln.startswith("| mixa |"))
    assert "96.54 ± 2.3 (seeds ± 0.53, n=3)" in row


def test_show_of_a_committed_row_prints_checkout_and_command(tmp_path):
    from attnbench.cli import app

    res = CliRunner().invoke(app, ["show", "mixa", "mixa", "--db", str(tmp_path / "none.db")])
    assert res.exit_code == 0, res.output
    assert "3 seed(s) [0, 1, 2]" in res.output
    assert "git checkout e66af5f676821262ce0efa9c0d88f108ac7c24cc" in res.output
    assert "attnbench run mixa --preset tiny --seed 2" in res.output
    res = CliRunner().invoke(app, ["show", "lra", "nalla", "--db", str(tmp_path / "none.db")])
    assert res.exit_code == 2 and "no lra row 'nalla'" in res.output and "nala (listops)" in res.output
