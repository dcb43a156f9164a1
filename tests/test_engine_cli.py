"""The shared model blocks, suites as plug-ins, and the generic CLI pieces (--attn, --shard,
--launcher) through a real suite (LRA on a toy preset)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.api import suites as suite_registry
from attnbench.api.spec import parse_spec
from attnbench.core.errors import UnknownNameError
from attnbench.models import BlockOptions, TransformerStack
from attnbench.results.store import Store

ROOT = Path(__file__).resolve().parents[1]


# --- models ---------------------------------------------------------------------------------------------------
def test_a_mixed_model_is_a_list_of_specs_and_the_block_options_are_recorded():
    specs = [parse_spec("softmax"), parse_spec("nala")]
    m = TransformerStack(specs, layers=2, dim=16, ffn_dim=32, heads=2, head_dim=8)
    assert [b.mha.attn.name for b in m.blocks] == ["softmax", "nala"]
    x = torch.randn(2, 5, 16, requires_grad=True)
    m(x).sum().backward()
    assert x.grad is not None and m.resolve_impl("cpu") == "sdpa,torch"
    with pytest.raises(ValueError, match="3 attention specs for 2 layers"):
        TransformerStack(specs + specs[:1], layers=2, dim=16, ffn_dim=32, heads=2, head_dim=8)
    opts = BlockOptions(dwc_kernel=3)
    assert opts.active() == {"dwc_kernel": 3} and BlockOptions().active() == {}
    grid = TransformerStack(specs[1], layers=1, dim=16, ffn_dim=32, heads=2, head_dim=8, options=opts, grid=(2, 3))
    assert grid(torch.randn(2, 6, 16)).shape == (2, 6, 16)
    with pytest.raises(ValueError, match="odd"):
        BlockOptions(dwc_kernel=2)


def test_the_depthwise_conv_on_v_changes_the_output_only_when_on():
    torch.manual_seed(0)
    plain = TransformerStack(parse_spec("linear"), layers=1, dim=16, ffn_dim=32, heads=2, head_dim=8)
    torch.manual_seed(0)
    dwc = TransformerStack(parse_spec("linear"), layers=1, dim=16, ffn_dim=32, heads=2, head_dim=8,
                           options=BlockOptions(dwc_kernel=3))
    x = torch.randn(1, 7, 16)
    with torch.no_grad():
        dwc.blocks[0].mha.dwc.weight.zero_()
        dwc.blocks[0].mha.dwc.bias.zero_()
        torch.testing.assert_close(plain(x), dwc(x))  # same init (created after the rest), zero conv = no change
        dwc.blocks[0].mha.dwc.bias.fill_(1.0)
        assert not torch.allclose(plain(x), dwc(x))


# --- suites as plug-ins ----------------------------------------------------------------------------------------
def test_the_core_never_imports_or_names_a_suite():
    suites = suite_registry.suite_names()
    assert {"lra", "scaling"} <= set(suites)
    for path in sorted((ROOT / "attnbench").rglob("*.py")):
        code = ast.parse(path.read_text())
        for node in ast.walk(code):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = node.module
            elif isinstance(node, ast.Import):
                mod = ",".join(a.name for a in node.names)
            else:
                continue
            for s in suites:
                assert f"suites.{s}" not in mod and not mod.startswith(f"{s}"), f"{path} imports suite {s}"
        # no string literal that is a suite name used as a key (docstrings may mention suites)
        for node in ast.walk(code):
            if isinstance(node, ast.Constant) and node.value in suites:
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} names the suite {node.value!r}")


def test_a_new_suite_is_one_registration(tmp_path, monkeypatch):
    import typer

    from attnbench.views import tables

    calls = []

    def run(x: int = typer.Option(1, "--x")) -> None:
        calls.append(x)

    suite = suite_registry.register_suite(suite_registry.Suite(name="toy-suite", help="a toy suite", run=run))
    try:
        assert suite_registry.get_suite("toy-suite") is suite and tables.view_of("toy-suite") is tables.GENERIC
        with pytest.raises(UnknownNameError, match="did you mean 'toy-suite'"):
            suite_registry.get_suite("toy-suit")
        import importlib

        import attnbench.cli.main as cli_mod

        cli_mod = importlib.reload(cli_mod)  # the CLI adds the commands of every registered suite
        res = CliRunner().invoke(cli_mod.app, ["run", "toy-suite", "--x", "3"])
        assert res.exit_code == 0, res.output and calls == [3]
    finally:
        suite_registry._SUITES.pop("toy-suite")


# --- the generic CLI pieces through LRA -------------------------------------------------------------------------
PRESET = """
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
[tasks.text]
seq_len = 32
batch_size = 8
lr = 1e-3
warmup = 2
steps = 4
eval_every = 2
"""


@pytest.fixture
def preset(tmp_path):
    p = tmp_path / "toy.toml"
    p.write_text(PRESET)
    return p


def _cli(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "attnbench.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_bad_attn_fails_before_any_data_is_generated(tmp_path, preset, monkeypatch):
    import attnbench.cli.main as cli_mod

    monkeypatch.chdir(tmp_path)
    for bad, msg in ((",", "names no attention"), ("nala:lamb=1", "unknown option(s) 'lamb'"),
                     ("nalla", "did you mean 'nala'")):
        p = CliRunner().invoke(cli_mod.app, ["run", "lra", "--attn", bad, "--preset", str(preset), "--db",
                                             str(tmp_path / "x.db"), "--out", str(tmp_path / "w")],
                               env={"COLUMNS": "200"})
        assert p.exit_code == 2 and msg in p.output, p.output
        assert "Traceback" not in p.output
    assert not (tmp_path / "w").exists() and not (tmp_path / "x.db").exists()


def test_spec_options_reach_the_record(tmp_path, preset, monkeypatch):
    from .helpers import invoke_isolated

    # the command in this process (the CLI's own process: the tests below)
    p = invoke_isolated(monkeypatch, ["run", "lra", "--attn", "performer:features=16", "--preset", str(preset),
                                      "--db", str(tmp_path / "o.db"), "--out", str(tmp_path / "w")], cwd=tmp_path)
    assert p.exit_code == 0, p.output[-3000:]
    with Store(tmp_path / "o.db") as s:
        (m,) = s.measurements(suite="lra")
    assert m.attention == "performer:features=16" and m.options == {"features": 16} and m.status == "ok"
    assert "1 cell(s): listops 4 steps x 8; estimated" in p.output  # the size and a time estimate, before it runs


def test_submitit_local_runs_two_shards_into_stores_that_ingest_merges(tmp_path, preset):
    pytest.importorskip("submitit")
    p = _cli("run", "lra", "--attn", "softmax,linear", "--preset", str(preset), "--db", str(tmp_path / "all.db"),
             "--out", str(tmp_path / "w"), "--launcher", "submitit-local", "--jobs", "2", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    shards = sorted((tmp_path / "w" / "jobs").glob("shard-*-of-2.db"))
    assert len(shards) == 2
    per_shard = []
    for db in shards:
        with Store(db) as s:
            per_shard.append(sorted(m.attention for m in s.measurements(suite="lra")))
    assert sorted(a for part in per_shard for a in part) == ["linear", "softmax"]  # each cell exactly once
    with Store(tmp_path / "all.db") as s:
        merged = s.measurements(suite="lra")
    assert sorted(m.attention for m in merged) == ["linear", "softmax"] and {m.status for m in merged} == {"ok"}


def test_workers_share_one_store_and_run_each_cell_once(tmp_path, preset):
    p = _cli("run", "lra", "--attn", "softmax,linear,relu_linear", "--preset", str(preset), "--db",
             str(tmp_path / "all.db"), "--out", str(tmp_path / "w"), "--launcher", "workers", "--jobs", "2",
             cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 workers on one store" in p.stdout and "worker 2 exited 0" in p.stdout
    logs = sorted((tmp_path / "w" / "workers").glob("worker-*.log"))
    assert len(logs) == 2 and all("--launcher" not in log.read_text() for log in logs)
    with Store(tmp_path / "all.db") as s:
        recs = s.measurements(suite="lra")
        assert s.leases() == []
    assert sorted(m.attention for m in recs) == ["linear", "relu_linear", "softmax"]  # each cell exactly once
    assert {m.status for m in recs} == {"ok"} and "softmax" in p.stdout  # the table of both workers' cells


def test_a_run_with_nothing_to_run_exits_non_zero_and_says_why(tmp_path, preset):
    from attnbench.cli.main import app

    p = CliRunner().invoke(app, ["run", "lra", "--attn", "softmax", "--tasks", "text", "--preset", str(preset),
                                 "--db", str(tmp_path / "x.db"), "--out", str(tmp_path / "w")], env={"COLUMNS": "200"})
    assert p.exit_code == 1, p.output[-3000:]
    assert "skipped, no data" in p.output and "1 skipped" in p.output


class _Killed(BaseException):
    pass


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_a_damaged_lra_checkpoint_is_one_line_and_force_recovers(tmp_path, preset, damage, monkeypatch):
    import attnbench.cli.main as cli_mod
    from attnbench.engine.train.trainer import TrainHooks
    from attnbench.suites.lra.train import run_lra

    def kill(task, attn):
        def hook(step, loss):
            if step == 3:
                raise _Killed

        return TrainHooks(after_step=hook)

    from rich.console import Console

    quiet = Console(file=open(os.devnull, "w"))
    with pytest.raises(_Killed):
        run_lra(attentions=["softmax"], preset=str(preset), db=str(tmp_path / "d.db"), out=str(tmp_path / "w"),
                console=quiet, progress=False, hooks=kill)
    (ckpt,) = (tmp_path / "w" / "checkpoints").rglob("*.pt")
    ckpt.write_bytes(ckpt.read_bytes()[:100] if damage == "truncated" else b"")
    args = ("run", "lra", "--attn", "softmax", "--preset", str(preset), "--db", str(tmp_path / "d.db"), "--out",
            str(tmp_path / "w"))
    monkeypatch.chdir(tmp_path)   # the commands in this process (no torch import per command)
    p = CliRunner().invoke(cli_mod.app, list(args), env={"COLUMNS": "200"})
    assert p.exit_code == 1 and "Traceback" not in p.output
    line = next(x for x in p.output.splitlines() if "failed" in x and "checkpoint" in x)
    assert ckpt.name in p.output and "--force" in line
    p = CliRunner().invoke(cli_mod.app, [*args, "--force"], env={"COLUMNS": "200"})
    assert p.exit_code == 0, p.output[-2000:]
