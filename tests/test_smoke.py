"""``run <suite> --smoke`` for lra, lm, scaling and claims through the CLI: each exits 0 and prints the full run's
cost; a broken pipeline (a planted failure) exits non-zero with one line and no traceback. Also the shared cost
line and the stop-and-resume helper of :mod:`attnbench.smoke`.

Covered here (the budget of the test suite): lra ``tiny`` (all five tasks) and ``skyformer`` (ListOps, its
release-format file path), lm ``tiny`` (one variant), scaling ``tiny``, claims (every check on its smallest
inputs). The other presets' smokes are the README's commands (lm ``340m``: minutes and 6 GB of checkpoint on a CPU).
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.smoke import FullRunCost, PlannedStop, StopOnce, fmt_duration

runner = CliRunner()
ENV = {"COLUMNS": "250"}


def invoke(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env={**ENV, **(env or {})})


def ok(result, *needles: str) -> str:
    out = result.output
    assert result.exit_code == 0, out[-3000:]
    assert "Traceback" not in out
    for n in needles:
        assert n in out, (n, out[-3000:])
    return out


def failed_in_one_line(result, needle: str) -> str:
    out = result.output
    assert result.exit_code != 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    lines = re.findall(r"(?:smoke failed|error): [^\n]*", out)  # (a progress bar may precede it on its line)
    assert len(lines) == 1 and needle in lines[0], out[-3000:]
    return lines[0]


# --- attnbench.smoke ----------------------------------------------------------------------------------------------
def test_cost_line_arithmetic_and_gpu_names():
    c = FullRunCost(steps=1000, items_per_step=256, unit="images", train_flops_per_item=1e9)
    assert c.items == 256_000 and c.flops == pytest.approx(2.56e14)
    assert c.hours_on("H100", 0.5) == pytest.approx(2.56e14 / (989e12 * 0.5) / 3600)
    line = c.line("A100")
    assert line.startswith("full run: 1,000 steps x 256 images = 2.56e+05 images, 2.6e+14 FLOPs;") and "A100" in line
    with pytest.raises(ValueError, match="unknown GPU"):
        c.hours_on("V100")
    assert [fmt_duration(s) for s in (0.2, 30, 600, 7200, 5 * 86400)] == ["under 1 s", "30 s", "10 min", "2.0 h",
                                                                           "5.0 days"]


def test_stop_once_stops_each_key_once_inside_the_given_step():
    stop = StopOnce(at=2)
    h = stop.hooks("a")
    assert h.transform_loss(1, "loss") == "loss"
    with pytest.raises(PlannedStop) as e:
        h.transform_loss(2, "loss")
    assert e.value.status == "interrupted"
    assert stop.hooks("a").transform_loss is None  # the second attempt runs through
    with pytest.raises(ValueError):
        StopOnce(at=1)


# --- lra --------------------------------------------------------------------------------------------------------
def test_lra_smoke_tiny_runs_every_task_and_prints_each_cost():
    out = ok(invoke("run", "lra", "--smoke", "--preset", "tiny", "--attn", "linear"), "attempt 2")
    for task in ("listops", "text", "retrieval", "image", "pathfinder"):
        assert any(line.lstrip().startswith(task) and "full run:" in line for line in out.splitlines()), task
    assert out.count(" ok ") >= 5 and "interrupted" in out  # attempt 1 stopped, attempt 2 finished


def test_lra_smoke_skyformer_reads_release_files_at_the_published_length():
    out = ok(invoke("run", "lra", "--smoke", "--preset", "skyformer", "--tasks", "listops", "--attn", "linear"),
             "full run: 50,000 steps x 32 sequences")
    assert "lra/skyformer smoke" in out


def test_lra_smoke_fails_in_one_line_when_a_reader_breaks(monkeypatch):
    from attnbench.errors import DataError
    from attnbench.suites.lra import data

    def broken(root, split, **kw):
        raise DataError("planted: reader broken", path=root)

    monkeypatch.setitem(data._LOADERS, "text", broken)
    failed_in_one_line(invoke("run", "lra", "--smoke", "--tasks", "text", "--attn", "linear"), "planted")


def test_lra_smoke_fails_when_the_rerun_does_not_resume(monkeypatch):
    from attnbench.train import trainer

    monkeypatch.setattr(trainer.ckpt_io, "save_atomic", lambda payload, path: None)  # checkpoints lost
    failed_in_one_line(invoke("run", "lra", "--smoke", "--tasks", "listops", "--attn", "linear"),
                       "expected a resume from the checkpoint of step 1")


def test_lra_smoke_refuses_a_data_dir(tmp_path):
    failed_in_one_line(invoke("run", "lra", "--smoke", "--data-dir", str(tmp_path)), "--data-dir")


# --- lm ---------------------------------------------------------------------------------------------------------
def test_lm_smoke_tiny_trains_resumes_evaluates_and_prints_the_cost():
    out = ok(invoke("run", "lm", "--smoke", "--attn", "gated_deltanet+nala"),
             "attempt 2", "lm-eval", "M parameters (vocabulary 2048)", "full run: 300 steps x 2,048 tokens")
    assert "interrupted" in out


def test_lm_smoke_fails_in_one_line_when_tokenizer_training_breaks(monkeypatch):
    from attnbench.suites.lm import data

    def broken(docs, kind, vocab_size):
        raise data.DataError("planted: tokenizer training broken")

    monkeypatch.setattr(data, "train_tokenizer", broken)
    failed_in_one_line(invoke("run", "lm", "--smoke", "--attn", "deltanet"), "planted")


# --- scaling ----------------------------------------------------------------------------------------------------
def test_scaling_smoke_runs_each_point_kind_and_estimates_the_sweep():
    out = ok(invoke("run", "scaling", "--smoke", "--preset", "tiny", "--mode", "fwd,fwd+bwd"),
             "4 point kind(s) at N = 256", "full sweep: 8 points")
    assert out.count(" ok ") >= 4


def test_scaling_smoke_fails_in_one_line_when_a_point_fails():
    failed_in_one_line(invoke("run", "scaling", "--smoke", "--preset", "tiny", "--attn", "softmax",
                              env={"ATTNBENCH_INJECT": "fail:softmax:256"}), "injected failure")


# --- claims -----------------------------------------------------------------------------------------------------
def test_claims_smoke_runs_every_check_on_its_smallest_inputs():
    from attnbench.suites.claims.checks import checks
    from attnbench.suites.claims.smoke import SMOKE_SETTINGS

    assert set(SMOKE_SETTINGS) == set(checks())  # a new check needs its smallest inputs
    out = ok(invoke("run", "claims", "--smoke"), "full run:")
    for name in checks():
        assert f"  {name} · " in out, name


def test_claims_smoke_fails_in_one_line_when_a_check_breaks(monkeypatch):
    from attnbench.suites.claims.checks import memory

    def broken(*a, **k):
        raise RuntimeError("planted: memory probe broken")

    monkeypatch.setattr(memory, "peak_bytes", broken)
    failed_in_one_line(invoke("run", "claims", "--smoke", "--only", "memory", "--attn", "nala"), "planted")
