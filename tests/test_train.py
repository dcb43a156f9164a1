"""The training engine (attnbench.engine.train) and the sweep (attnbench.engine.sweep) on a toy model (tests/toy_train.py):
kill and resume, SIGTERM, NaN, damaged checkpoints, DDP and FSDP2 on two gloo processes, shards, submitit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from attnbench.engine.sweep import Cell, CellError, CellResult, parse_shard, run_sweep, shard_cells
from attnbench.engine.train.checkpoint import CheckpointError
from attnbench.engine.train.config import ParamGroup, TrainConfig
from attnbench.engine.train.trainer import TrainHooks, train
from attnbench.results.store import Store

sys.path.insert(0, str(Path(__file__).parent))
import toy_train  # noqa: E402

TOY = str(Path(__file__).parent / "toy_train.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def toy(tmp_path, name, *args, check=True):
    proc = subprocess.run([sys.executable, TOY, "--db", str(tmp_path / f"{name}.db"), "--work",
                           str(tmp_path / name), *args], env=ENV, capture_output=True, text=True, timeout=240)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, rows


def toy_here(tmp_path, name, capsys, *args):
    """The toy suite in this process (a process start less): for the runs that are not killed, signalled, launched
    by torchrun or compared to the bit with a run in a process of its own."""
    capsys.readouterr()
    code = toy_train.main(["--db", str(tmp_path / f"{name}.db"), "--work", str(tmp_path / name), *args])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def runs(db):
    with Store(db) as s:
        return s.runs()


def measurements(db, suite="toy"):
    with Store(db) as s:
        return s.measurements(suite=suite)


# --- kill, SIGTERM, resume ------------------------------------------------------------------------------------
def test_sigkill_then_resume_ends_bit_identical_and_the_dead_run_is_not_left_running(tmp_path):
    _, (ref,) = toy(tmp_path, "ref")   # a process like the resumed one: bits compared like with like
    proc, rows = toy(tmp_path, "k", "--kill-at", "7", check=False)
    assert proc.returncode == -9 and rows == []
    assert [r["status"] for r in runs(tmp_path / "k.db")] == ["running"]  # what a SIGKILL leaves behind
    _, (resumed,) = toy(tmp_path, "k")
    assert resumed["resumed_from"] == 6  # checkpoint every 3 steps: killed after 7, resumed at 6
    assert resumed["digest"] == ref["digest"]  # bit-identical weights
    assert resumed["best_val_metric"] == ref["best_val_metric"] and resumed["final_train_loss"] == ref["final_train_loss"]
    statuses = [r["status"] for r in runs(tmp_path / "k.db")]
    assert statuses == ["interrupted", "ok"]  # the dead run was detected on the next start


def test_sigterm_records_interrupted_and_the_rerun_resumes(tmp_path):
    proc, _ = toy(tmp_path, "t", "--term-at", "5", check=False)
    assert proc.returncode == 130
    assert [m.status for m in measurements(tmp_path / "t.db")] == ["interrupted"]
    _, (row,) = toy(tmp_path, "t")
    assert row["resumed_from"] == 3
    assert [m.status for m in measurements(tmp_path / "t.db")] == ["interrupted", "ok"]
    proc, rows = toy(tmp_path, "t")  # finished: skipped, nothing new, exit 0
    assert rows == [] and "1 finished earlier" in proc.stdout


# --- the loop's guards ----------------------------------------------------------------------------------------
def _train_inline(tmp_path, cfg=None, hooks=None, ckpt=None, teacher=None, model=None, loss=None):
    x, y = toy_train.toy_data()
    cfg = cfg or TrainConfig(steps=6, batch_size=8, lr=0.05, eval_every=3)
    torch.manual_seed(0)
    model = model or toy_train.toy_model(0.0)
    task = toy_train.toy_task(x, y, cfg, 0, torch.device("cpu"))
    if loss is not None:
        task.loss = loss
    res = train(model, cfg, task, seed=0, device=torch.device("cpu"), identity="toy", checkpoint=ckpt,
                hooks=hooks, teacher=teacher)
    return model, res


def test_nan_loss_stops_the_run_with_a_clear_message(tmp_path):
    poison = TrainHooks(transform_loss=lambda step, loss: loss * float("nan") if step == 2 else loss)
    cells = [Cell(task="toy", attention=a, config_hash=h) for a, h in (("nan", "aa"), ("fine", "bb"))]

    def run_cell(cell, ctx):
        _, res = _train_inline(tmp_path, hooks=poison if cell.attention == "nan" else None)
        return CellResult("ok", metrics=res.metrics())

    s = run_sweep(cells, run_cell, suite="toy", setting="toy/nan", db=str(tmp_path / "n.db"), progress=False)
    by = {o.cell.attention: o.result for o in s.outcomes}
    assert by["nan"].status == "failed" and "training loss is nan at step 2" in by["nan"].error
    assert by["nan"].error.count("\n") == 0  # one line, no traceback
    assert by["fine"].status == "ok" and s.exit_code() == 1 and "failed: toy · nan" in s.line()


class Killed(BaseException):
    """Not an Exception: nothing in the loop handles it (a simulated hard kill)."""


def _kill_after(step):
    def hook(s, loss):
        if s == step:
            raise Killed

    return TrainHooks(after_step=hook)


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_damaged_checkpoint_is_a_one_line_error_naming_the_file(tmp_path, damage):
    ckpt = tmp_path / "c.pt"
    with pytest.raises(Killed):
        _train_inline(tmp_path, ckpt=ckpt, hooks=_kill_after(4))
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
    with pytest.raises(CheckpointError) as e:
        _train_inline(tmp_path, ckpt=ckpt)
    msg = str(e.value)
    assert str(ckpt) in msg and "--force" in msg and "\n" not in msg
    assert ("empty" in msg) if damage == "empty" else ("damaged" in msg)


def test_checkpoint_of_another_configuration_is_refused(tmp_path):
    ckpt = tmp_path / "c.pt"
    x, y = toy_train.toy_data()
    cfg = TrainConfig(steps=6, batch_size=8, lr=0.05, eval_every=3)

    def run(identity, hooks=None):
        train(toy_train.toy_model(0.0), cfg, toy_train.toy_task(x, y, cfg, 0, torch.device("cpu")), seed=0,
              device=torch.device("cpu"), identity=identity, checkpoint=ckpt, hooks=hooks)

    with pytest.raises(Killed):
        run("one", _kill_after(4))
    with pytest.raises(CheckpointError, match="another configuration"):
        run("two")


def test_gradient_accumulation_equals_the_full_batch():
    full, _ = _train_inline(None, cfg=TrainConfig(steps=4, batch_size=8, lr=0.05, eval_every=4))
    acc, _ = _train_inline(None, cfg=TrainConfig(steps=4, batch_size=8, micro_batch_size=2, lr=0.05, eval_every=4))
    for a, b in zip(full.parameters(), acc.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_frozen_parameters_stay_and_groups_get_their_learning_rates():
    cfg = TrainConfig(steps=3, batch_size=8, lr=0.05, eval_every=3, schedule="constant", frozen=("0.*",),
                      groups=(ParamGroup(("3.weight",), lr_scale=0.0),))
    torch.manual_seed(0)
    model = toy_train.toy_model(0.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _, res = _train_inline(None, cfg=cfg, model=model)
    after = model.state_dict()
    assert torch.equal(after["0.weight"], before["0.weight"]) and torch.equal(after["0.bias"], before["0.bias"])
    assert torch.equal(after["3.weight"], before["3.weight"])  # lr scale 0
    assert not torch.equal(after["3.bias"], before["3.bias"])
    assert res.n_trainable == 16 * 3 + 3  # the last layer; the first is frozen
    assert not model[0].weight.requires_grad


def test_teacher_is_frozen_and_handed_to_the_loss():
    torch.manual_seed(1)
    teacher = toy_train.toy_model(0.0)
    seen = []

    def distill(net, b, t):
        seen.append(t)
        xb, _ = b
        with torch.no_grad():
            target = t(xb)
        return nn.functional.mse_loss(net(xb), target)

    cfg = TrainConfig(steps=3, batch_size=8, lr=0.05, eval_every=3)
    _train_inline(None, cfg=cfg, teacher=teacher, loss=distill)
    assert seen and all(t is teacher for t in seen)
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())


@pytest.mark.parametrize("schedule", ["onecycle", "cosine", "polynomial", "constant"])
def test_schedules_warm_up_and_decay(schedule):
    from attnbench.engine.train.trainer import make_schedule

    cfg = TrainConfig(steps=20, batch_size=8, lr=1.0, warmup=5, schedule=schedule)
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched = make_schedule(opt, cfg)
    lrs = []
    for _ in range(cfg.steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] < lrs[4] <= 1.0 + 1e-9  # warm-up rises
    assert max(lrs) == pytest.approx(1.0, rel=0.05)
    if schedule != "constant":
        assert lrs[-1] < 0.3 * max(lrs)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="schedule must be one of"):
        TrainConfig(steps=3, batch_size=8, lr=0.1, schedule="step")
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(steps=3, batch_size=8, lr=0.1, warmup=3)


# --- distributed ----------------------------------------------------------------------------------------------
def _torchrun(tmp_path, name, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", TOY, "--db",
           str(tmp_path / f"{name}.db"), "--work", str(tmp_path / name), *args]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_ddp_on_two_gloo_processes_matches_one_process_at_the_same_global_batch(tmp_path, capsys):
    (one,) = toy_here(tmp_path, "one", capsys, "--dropout", "0")
    (two,) = _torchrun(tmp_path, "two", "--dropout", "0")
    assert two["world"] == 2
    assert two["best_val_metric"] == one["best_val_metric"] and two["best_step"] == one["best_step"]
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], rel=1e-5)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_fsdp2_trains_and_checkpoints_on_two_gloo_processes(tmp_path, capsys):
    (one,) = toy_here(tmp_path, "one", capsys, "--dropout", "0")
    (two,) = _torchrun(tmp_path, "fsdp", "--dropout", "0", "--strategy", "fsdp")
    assert two["world"] == 2 and two["steps_run"] == 12
    assert two["final_train_loss"] == pytest.approx(one["final_train_loss"], rel=1e-4)


# --- shards and launchers ---------------------------------------------------------------------------------------
def test_shards_cover_every_cell_exactly_once():
    cells = [Cell(task="t", attention=f"a{i}", config_hash=f"{i * 7919:016x}") for i in range(37)]
    for n in (1, 2, 3, 5):
        parts = [shard_cells(cells, (k, n)) for k in range(1, n + 1)]
        keys = [c.config_hash for p in parts for c in p]
        assert sorted(keys) == sorted(c.config_hash for c in cells)
        assert all(parts) or n > len(cells)
    # a shard does not depend on the rest of the grid
    assert shard_cells(cells[:10], (2, 3)) == [c for c in shard_cells(cells, (2, 3)) if c in cells[:10]]
    for bad in ("0/2", "3/2", "a/b", "2"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_shard_runs_through_the_toy_suite(tmp_path, capsys):
    a = toy_here(tmp_path, "s", capsys, "--cells", "4", "--shard", "1/2", "--steps", "3")
    b = toy_here(tmp_path, "s", capsys, "--cells", "4", "--shard", "2/2", "--steps", "3")
    assert sorted(r["cell"] for r in a + b) == ["mlp0", "mlp1", "mlp2", "mlp3"]


def test_cell_errors_map_to_statuses(tmp_path):
    def run_cell(cell, ctx):
        kind = cell.attention
        if kind == "incorrect":
            raise CellError("outputs disagree", status="incorrect")
        if kind == "oom":
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
        if kind == "timeout":
            raise TimeoutError("past its budget")
        if kind == "boom":
            raise KeyError("x")
        return CellResult("ok")

    cells = [Cell(task="t", attention=k, config_hash=f"{i:016x}")
             for i, k in enumerate(("ok", "incorrect", "oom", "timeout", "boom"))]
    s = run_sweep(cells, run_cell, suite="toy", setting="toy/st", db=str(tmp_path / "s.db"), progress=False)
    assert [o.result.status for o in s.outcomes] == ["ok", "incorrect", "oom", "timeout", "failed"]
    assert s.exit_code() == 1
    assert [m.status for m in measurements(tmp_path / "s.db")] == ["ok", "incorrect", "oom", "timeout", "failed"]
    empty = run_sweep([], run_cell, suite="toy", setting="toy/none", db=str(tmp_path / "s.db"), progress=False)
    assert empty.exit_code() == 1 and "nothing to run" in empty.line()


def test_ema_is_what_is_evaluated_and_resumes_bit_identical(tmp_path):
    cfg = TrainConfig(steps=6, batch_size=8, lr=0.05, eval_every=3, checkpoint_every=2, ema_decay=0.9)
    plain_cfg = TrainConfig(steps=6, batch_size=8, lr=0.05, eval_every=3)
    ema_model, ema_res = _train_inline(tmp_path, cfg=cfg)
    raw_model, _ = _train_inline(tmp_path, cfg=plain_cfg)
    assert not torch.equal(ema_model[0].weight, raw_model[0].weight)  # the kept weights are the average's
    ckpt = tmp_path / "e.pt"
    with pytest.raises(Killed):
        _train_inline(tmp_path, cfg=cfg, ckpt=ckpt, hooks=_kill_after(5))
    resumed, res = _train_inline(tmp_path, cfg=cfg, ckpt=ckpt)
    assert res.state.resumed_from == 4
    for a, b in zip(resumed.state_dict().values(), ema_model.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="ema_decay"):
        TrainConfig(steps=3, batch_size=8, lr=0.1, ema_decay=1.0)
