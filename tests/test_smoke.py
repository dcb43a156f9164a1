"""``run <suite> --smoke`` for lra, lm, scaling and claims through the CLI: each exits 0, prints the machine line
first and the full run's cost; a broken pipeline (a planted failure) exits non-zero with one line and no traceback.
Also the shared cost line and the stop-and-resume helper of :mod:`attnbench.engine.smoke`.

Covered here: lra ``tiny`` and ``skyformer`` (all five tasks, skyformer's at their published lengths from files
in the release formats), lm ``tiny`` (one variant), scaling ``tiny``, ``cpu-default`` (the default preset) and
``cpu-full``, claims (every check on its smallest inputs). The vision presets' smokes are in
``test_vision_smoke.py``, adala's and mixa's in their own test files. lm ``340m`` is the README's by-hand command
(four models of 374M-512M parameters: about 30 CPU-minutes, 17 GB peak memory, 21 GB of temporary checkpoints),
here marked ``slow`` and run only with ``ATTNBENCH_SLOW=1``.
"""

from __future__ import annotations

import os
import re

import pytest
from typer.testing import CliRunner

from attnbench.cli.main import app
from attnbench.engine.smoke import FullRunCost, PlannedStop, StopOnce, fmt_duration

runner = CliRunner()
ENV = {"COLUMNS": "250"}
slow = [pytest.mark.slow, pytest.mark.skipif(not os.environ.get("ATTNBENCH_SLOW"),
                                             reason="slow: set ATTNBENCH_SLOW=1 (a by-hand smoke of the README)")]


def invoke(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env={**ENV, **(env or {})})


def ok(result, *needles: str) -> str:
    out = result.output
    assert result.exit_code == 0, out[-3000:]
    assert "Traceback" not in out
    first = next(line for line in out.splitlines() if line.strip())
    assert first.startswith("machine: ") and "GFLOP/s" in first, out[:1000]  # printed first, as by every run
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


# --- attnbench.engine.smoke ----------------------------------------------------------------------------------------------
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


def skyformer_smoke(tasks: list[str]) -> None:
    from attnbench.suites.lra.config import load_preset

    pre = load_preset("skyformer")
    out = ok(invoke("run", "lra", "--smoke", "--preset", "skyformer", "--tasks", ",".join(tasks), "--attn",
                    "linear"), "lra/skyformer smoke", "attempt 2")
    for task in tasks:
        cfg = pre.task(task)
        unit = "pairs" if task == "retrieval" else "sequences"
        cost = f"full run: {cfg.steps:,} steps x {cfg.batch_size:,} {unit}"
        assert any(line.lstrip().startswith(task) and cost in line for line in out.splitlines()), (task, cost)
    assert out.count(" ok ") >= len(tasks)


def test_lra_smoke_skyformer_reads_release_files_at_the_published_length():
    """Every task at its published length (ListOps 2000 tokens, IMDb 4000 bytes, AAN two 4000-byte documents,
    CIFAR 1024 pixels, Pathfinder 32x32) from files in the release's format."""
    skyformer_smoke(["listops", "text", "retrieval", "image", "pathfinder"])


def test_lra_smoke_fails_in_one_line_when_a_reader_breaks(monkeypatch):
    from attnbench.core.errors import DataError
    from attnbench.suites.lra import data

    def broken(root, split, **kw):
        raise DataError("planted: reader broken", path=root)

    monkeypatch.setitem(data._LOADERS, "text", broken)
    failed_in_one_line(invoke("run", "lra", "--smoke", "--tasks", "text", "--attn", "linear"), "planted")


def test_lra_smoke_fails_when_the_rerun_does_not_resume(monkeypatch):
    from attnbench.engine.train import trainer

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


@pytest.mark.parametrize("preset", [pytest.param("340m", marks=slow)])
def test_lm_smoke_at_full_size(preset):
    """The 340M models (every row of the table) through the real pipeline at 128 tokens."""
    out = ok(invoke("run", "lm", "--smoke", "--preset", preset), "attempt 2", "lm-eval", f"lm/{preset} smoke")
    assert out.count("full run: ") == 8, out[-3000:]


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


def scaling_smoke(*preset: str) -> None:
    out = ok(invoke("run", "scaling", "--smoke", *preset))
    name = preset[-1] if preset else "cpu-default"  # the default preset
    kinds = int(re.search(r"(\d+) point kind\(s\) at N = ", out)[1])
    done = re.search(rf"scaling/{name}-smoke: (\d+) ok(?:, (\d+) unsupported)?", out)
    assert done and int(done[1]) + int(done[2] or 0) == kinds, out[-3000:]
    assert "full sweep: " in out and "on this machine" in out


def test_scaling_smoke_default_preset():
    """cpu-default, the preset ``run scaling`` runs without ``--preset``: every point kind at its smallest N."""
    scaling_smoke()


def test_scaling_smoke_cpu_full():
    scaling_smoke("--preset", "cpu-full")


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
