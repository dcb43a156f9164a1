"""The LRA suite's model, presets, runner and leaderboard, end to end on very small configs.

Data: ListOps and Pathfinder are generated (suites/lra/generate.py); Text, Retrieval and Image are small files in
their real formats (aclImdb/, tsv_data/new_aan_pairs.*.tsv, cifar-10-batches-py/) written here, read by the
readers of suites/lra/data.py.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

import attnbench
from attnbench.engine.train.trainer import TrainHooks, TrainOrder, step_seed
from attnbench.results.store import Store
from attnbench.suites.lra import config as C
from attnbench.suites.lra import train as T
from attnbench.suites.lra.model import LRAClassifier, LRADualClassifier, build_model, masked_mean

# --------------------------------------------------------------------------------------------- helpers

MODEL = """
[model]
dim = 16
ffn_dim = 32
heads = 2
head_dim = 8
layers = 1
dropout = {dropout}
"""

PRESET = """
name = "unit"
description = "unit-test preset"
tasks_default = ["listops", "pathfinder"]
{model}
[train]
batch_size = 8
lr = 3e-3
warmup = 2
steps = {steps}
eval_every = {eval_every}
eval_batch_size = 16
checkpoint_every = {ckpt}
clip_grad_value = 1.0

[tasks.listops]
seq_len = 64
[tasks.listops.generate]
n_train = 64
n_val = 16
n_test = 16
max_depth = 4
max_args = 4
min_length = 8
max_length = 64

[tasks.pathfinder]
seq_len = 1024
batch_size = 4
steps = 3
eval_every = 3
[tasks.pathfinder.generate]
n = 20

[tasks.text]
seq_len = 96
batch_size = 4
steps = 3
eval_every = 3

[tasks.retrieval]
seq_len = 48
batch_size = 4
steps = 3
eval_every = 3

[tasks.image]
seq_len = 1024
batch_size = 4
steps = 3
eval_every = 3
"""


def write_preset(path: Path, *, steps=6, eval_every=3, ckpt=0, dropout=0.1) -> Path:
    path.write_text(PRESET.format(model=MODEL.format(dropout=dropout), steps=steps, eval_every=eval_every,
                                  ckpt=ckpt))
    return path


def write_real_data(root: Path) -> Path:
    """Tiny files in the real formats of Text (aclImdb), Retrieval (AAN TSV) and Image (CIFAR-10 pickles)."""
    rng = np.random.default_rng(0)
    words = ["good", "bad", "film", "plot", "great", "awful", "actor", "boring", "fun", "the"]
    for sub in ("train", "test"):
        for cls in ("neg", "pos"):
            d = root / "aclImdb" / sub / cls
            d.mkdir(parents=True)
            for i in range(8):
                text = " ".join(rng.choice(words, size=int(rng.integers(5, 30))))
                (d / f"{i}_{7 if cls == 'pos' else 2}.txt").write_text(text)
    tsv = root / "tsv_data"
    tsv.mkdir()
    for split in ("train", "eval", "test"):
        lines = []
        for i in range(12):
            a = " ".join(rng.choice(words, size=8))
            b = " ".join(rng.choice(words, size=6))
            lines.append(f"{float(i % 2)}\tP{i}\tQ{i}\t{a}\t{b}")
        (tsv / f"new_aan_pairs.{split}.tsv").write_text("\n".join(lines) + "\n")
    cif = root / "cifar-10-batches-py"
    cif.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(cif / name, "wb") as f:
            pickle.dump({b"labels": rng.integers(0, 10, size=6).tolist(),
                         b"data": rng.integers(0, 256, size=(6, 3072), dtype=np.uint8)}, f)
    return root


def quiet() -> Console:
    return Console(file=open(os.devnull, "w"), width=200)


def records(db, **kw):
    with Store(db) as s:
        return s.measurements(suite="lra", **kw)


# ------------------------------------------------------------------------------------------------ model


@pytest.mark.parametrize("attention", attnbench.names())
def test_model_forward_backward(attention):
    """Every registered attention trains inside the LRA model (built by name with build_for_length)."""
    torch.manual_seed(0)
    m = build_model(attention, vocab_size=20, num_classes=5, seq_len=32, pair=False, pad_id=0, dim=16, ffn_dim=32,
                    heads=2, head_dim=8, layers=2, dropout=0.1)
    assert isinstance(m, LRAClassifier) and not isinstance(m, LRADualClassifier)
    x = torch.randint(1, 20, (3, 32))
    x[0, 20:] = 0  # padding
    out = m(x)
    assert out.shape == (3, 5) and torch.isfinite(out).all()
    out.logsumexp(-1).sum().backward()
    grads = [p.grad for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("attention", ["softmax", "nala", "polaformer"])
def test_retrieval_dual_head_shares_the_encoder(attention):
    m = build_model(attention, vocab_size=257, num_classes=2, seq_len=24, pair=True, pad_id=0, dim=16, ffn_dim=32,
                    heads=2, head_dim=8, layers=1, dropout=0.0)
    assert isinstance(m, LRADualClassifier)
    assert m.head[0].in_features == 4 * 16  # [u, v, u*v, u-v]
    a, b = torch.randint(1, 257, (2, 24)), torch.randint(1, 257, (2, 24))
    out = m(a, b)
    assert out.shape == (2, 2)
    out.sum().backward()
    m.eval()
    u, v = m.encode(a), m.encode(b)
    torch.testing.assert_close(m(a, b), m.head(torch.cat([u, v, u * v, u - v], -1)))


def test_masked_mean_ignores_padding_and_pixel_tasks_have_no_mask():
    x = torch.arange(12.0).reshape(1, 4, 3)
    mask = torch.tensor([[True, True, False, False]])
    torch.testing.assert_close(masked_mean(x, mask), x[:, :2].mean(1))
    m = build_model("softmax", vocab_size=256, num_classes=2, seq_len=16, pair=False, pad_id=None, dim=16,
                    ffn_dim=32, heads=2, head_dim=8, layers=1, dropout=0.0)
    assert m._mask(torch.zeros(1, 16, dtype=torch.long)) is None  # black pixels (id 0) are data, not padding


def test_model_is_pre_ln_with_final_norm():
    m = build_model("softmax", vocab_size=10, num_classes=2, seq_len=8, pair=False, pad_id=0, dim=16, ffn_dim=32,
                    heads=2, head_dim=8, layers=2, dropout=0.0)
    blk = m.encoder.stack.blocks[0]
    assert hasattr(blk, "norm1") and hasattr(blk, "norm2") and hasattr(m.encoder.stack, "norm")
    assert blk.mha.w_q.out_features == 2 * 8 and blk.mha.out.in_features == 16


# ------------------------------------------------------------------------------------------------ presets


def test_embedded_presets_carry_the_published_settings():
    sky = C.load_preset("skyformer")
    assert (sky.model.dim, sky.model.ffn_dim, sky.model.heads, sky.model.head_dim, sky.model.layers,
            sky.model.dropout) == (64, 128, 2, 32, 2, 0.1)
    lo, te, re, im, pf = (sky.task(t) for t in ("listops", "text", "retrieval", "image", "pathfinder"))
    assert (lo.seq_len, lo.batch_size, lo.lr, lo.warmup, lo.eval_every) == (2000, 32, 1e-4, 1000, 500)
    assert (te.seq_len, te.batch_size, te.lr, te.warmup) == (4000, 32, 1e-4, 80)
    assert (re.seq_len, re.batch_size, re.lr, re.warmup, re.eval_every) == (4000, 16, 2e-4, 800, 1000)
    assert (im.seq_len, im.batch_size, im.lr, im.warmup, im.eval_every, im.patience) == (1024, 256, 1e-4, 175, 50, 0)
    assert (pf.seq_len, pf.batch_size, pf.lr, pf.warmup) == (1024, 128, 2e-4, 312)
    assert {t.steps for t in sky.tasks.values()} == {50000} and lo.patience == 10 and lo.clip_grad_value == 1.0
    assert sky.key == "lra/skyformer" and all(t.generate is None for t in sky.tasks.values())
    tiny = C.load_preset("tiny")
    assert tiny.key == "lra/tiny" and tiny.task("listops").generate and tiny.task("pathfinder").generate
    assert tiny.model == sky.model  # same model, smaller data and budget


@pytest.mark.parametrize("snippet, where, key", [
    ("colour = 1\n", "top level", "colour"),
    ("[model]\ndims = 64\n", "[model]", "dims"),
    ("[train]\nlearning_rate = 1e-3\n", "[train]", "learning_rate"),
    ("[tasks.listops]\nseq_len = 8\nbatch_size = 2\nlr = 1.0\nwarmup = 0\nsteps = 2\neval_every = 1\nbtach = 3\n",
     "[tasks.listops]", "btach"),
    ("[tasks.listops]\nseq_len = 8\nbatch_size = 2\nlr = 1.0\nwarmup = 0\nsteps = 2\neval_every = 1\n"
     "[tasks.listops.generate]\nn_train = 1\nn_val = 1\nn_test = 1\ndepth = 3\n", "[tasks.listops.generate]", "depth"),
    ("[tasks.sentiment]\nseq_len = 8\n", "[tasks]", "sentiment"),
])
def test_preset_loader_rejects_unknown_keys_naming_key_and_file(tmp_path, snippet, where, key):
    p = tmp_path / "bad.toml"
    body = 'name = "bad"\n' + snippet
    if "[tasks." not in snippet:
        body += "\n[tasks.listops]\nseq_len = 8\nbatch_size = 2\nlr = 1.0\nwarmup = 0\nsteps = 2\neval_every = 1\n"
    p.write_text(body)
    with pytest.raises(C.PresetError) as e:
        C.load_preset(p)
    msg = str(e.value)
    assert str(p) in msg and where in msg and repr(key) in msg, msg


def test_preset_loader_rejects_wrong_types_and_generators_for_real_only_tasks(tmp_path):
    p = tmp_path / "bad.toml"
    base = "[tasks.text]\nseq_len = 8\nbatch_size = 2\nlr = 1.0\nwarmup = 0\nsteps = 2\neval_every = 1\n"
    p.write_text('name = "bad"\n' + base.replace("steps = 2", 'steps = "2"'))
    with pytest.raises(C.PresetError, match=r"\[tasks.text\]: key 'steps': expected int"):
        C.load_preset(p)
    p.write_text('name = "bad"\n' + base + "[tasks.text.generate]\nn = 3\n")
    with pytest.raises(C.PresetError, match="has no generator"):
        C.load_preset(p)
    with pytest.raises(Exception, match="unknown LRA preset 'tinny'; did you mean 'tiny'"):
        C.load_preset("tinny")


# ----------------------------------------------------------------------------------------------- running


def test_every_task_end_to_end_and_the_leaderboard(tmp_path):
    """listops + pathfinder generated; text, retrieval, image read from real-format files; via the CLI."""
    from attnbench.cli.main import app

    data = write_real_data(tmp_path / "data")
    preset = write_preset(tmp_path / "p.toml", steps=3, eval_every=3)
    db, out = tmp_path / "db.sqlite", tmp_path / "work"
    res = CliRunner().invoke(app, ["run", "lra", "--attn", "softmax,nala", "--preset", str(preset), "--data-dir",
                                   str(data), "--tasks", "listops,text,retrieval,image,pathfinder", "--db", str(db),
                                   "--out", str(out)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    recs = records(db)
    assert sorted((r.task, r.attention) for r in recs) == sorted(
        (t, a) for t in ("listops", "text", "retrieval", "image", "pathfinder") for a in ("softmax", "nala"))
    for r in recs:
        assert r.status == "ok", (r.task, r.attention, r.error)
        m = r.metrics
        assert 0 <= m["test_acc"] <= 1 and m["score"] == pytest.approx(100 * m["test_acc"])
        assert m["train_samples_per_s"] > 0 and m["wall_s"] > 0 and "peak_mem_bytes" in m
        assert 0 <= m["majority_test_acc"] <= 1 and m["steps_run"] == 3
        assert r.setting == "lra/unit" and r.seed == 0 and r.impl and r.git_commit is not None
        assert r.packages.get("torch") and r.device == "cpu" and r.started_at and r.ended_at
    lo = [r for r in recs if r.task == "listops"][0].metrics
    assert 0 <= lo["first_op_test_acc"] <= 1  # the ListOps heuristic baseline
    origin = {r.task: r.metrics["data"] for r in recs}
    assert origin["listops"].startswith("generated:") and origin["pathfinder"].startswith("generated:")
    assert all(origin[t].startswith("files:") for t in ("text", "retrieval", "image"))
    # the leaderboard: measured rows, then a separate table of reported rows, labelled
    text = res.output
    assert "LRA accuracy — lra/unit" in text and "majority class (baseline)" in text
    assert "reported (NaLaFormer Table 14, Skyformer setting)" in text
    measured = text.split("reported (NaLaFormer Table 14")[0]
    assert "NaLaFormer" not in measured and "73.48" not in measured


def test_tasks_without_data_are_skipped_with_where_to_put_it(tmp_path):
    preset = write_preset(tmp_path / "p.toml")
    out = []
    console = Console(file=open(os.devnull, "w"), width=300)
    console.print = lambda *a, **k: out.append(" ".join(map(str, a)))  # type: ignore[method-assign]
    summary = T.run_lra(attentions=["softmax"], tasks=["text", "image"], preset=str(preset), db=str(tmp_path / "db"),
                        out=str(tmp_path / "w"), console=console, progress=False)
    assert [o.status for o in summary.outcomes] == ["skipped", "skipped"]
    msg = "\n".join(out)
    assert "aclImdb" in msg and "cifar-10-batches-py" in msg and "--data-dir" in msg
    assert records(tmp_path / "db") == []


class Killed(BaseException):
    """Not an Exception and not KeyboardInterrupt: nothing in the runner handles it (a hard kill)."""


def _run(tmp_path, name, preset, **kw):
    return T.run_lra(attentions=kw.pop("attentions", ["softmax"]), tasks=kw.pop("tasks", ["listops"]),
                     preset=str(preset), db=str(tmp_path / f"{name}.db"), out=str(tmp_path / name), console=quiet(),
                     progress=False, **kw)


def test_resume_after_a_kill_continues_from_the_checkpoint_and_matches(tmp_path):
    preset = write_preset(tmp_path / "p.toml", steps=8, eval_every=4, ckpt=3)
    ref = _run(tmp_path, "ref", preset).outcomes[0]
    assert ref.status == "ok" and ref.metrics["resumed_from"] is None

    def kill_at_7(step, loss):
        if step == 7:
            raise Killed

    with pytest.raises(Killed):
        _run(tmp_path, "k", preset, hooks=lambda task, attn: TrainHooks(after_step=kill_at_7))
    ckpts = list((tmp_path / "k" / "checkpoints").rglob("*.pt"))
    assert len(ckpts) == 1 and torch.load(ckpts[0], weights_only=False)["state"]["step"] == 6
    assert records(tmp_path / "k.db") == []  # nothing finished
    steps = []
    resumed = _run(tmp_path, "k", preset, hooks=lambda t, a: TrainHooks(after_step=lambda s, l: steps.append(s))).outcomes[0]
    assert steps == [7, 8] and resumed.metrics["resumed_from"] == 6
    for key in ("test_acc", "test_loss", "best_val_acc", "best_step", "final_train_loss"):
        assert resumed.metrics[key] == pytest.approx(ref.metrics[key], rel=1e-6, abs=1e-9), key
    flat = lambda h: [x for row in h for x in row]  # noqa: E731
    assert flat(resumed.metrics["val_history"]) == pytest.approx(flat(ref.metrics["val_history"]), rel=1e-6)
    assert not list((tmp_path / "k" / "checkpoints").rglob("*.pt"))  # a finished cell drops its checkpoint
    # finished cells are skipped; --force reruns them
    again = _run(tmp_path, "k", preset)
    assert [o.status for o in again.outcomes] == ["skipped"] and len(records(tmp_path / "k.db")) == 1
    forced = _run(tmp_path, "k", preset, force=True)
    assert [o.status for o in forced.outcomes] == ["ok"] and len(records(tmp_path / "k.db")) == 2


def test_ctrl_c_records_interrupted_stops_the_sweep_and_resumes(tmp_path):
    preset = write_preset(tmp_path / "p.toml", steps=6, eval_every=3)

    def ctrl_c(task, attn):
        def hook(step, loss):
            if attn == "softmax" and step == 4:
                raise KeyboardInterrupt

        return TrainHooks(after_step=hook)

    s = _run(tmp_path, "i", preset, attentions=["softmax", "nala"], hooks=ctrl_c)
    assert s.interrupted and [o.status for o in s.outcomes] == ["interrupted"]  # nala never started
    assert [r.status for r in records(tmp_path / "i.db")] == ["interrupted"]
    s2 = _run(tmp_path, "i", preset, attentions=["softmax", "nala"])
    assert [(o.attention, o.status) for o in s2.outcomes] == [("softmax", "ok"), ("nala", "ok")]
    assert s2.outcomes[0].metrics["resumed_from"] == 3


def test_nan_loss_fails_the_cell_and_the_sweep_goes_on(tmp_path):
    preset = write_preset(tmp_path / "p.toml", steps=4, eval_every=2)

    def poison(task, attn):
        return TrainHooks(transform_loss=lambda step, loss: loss * float("nan") if attn == "softmax" and step == 2
                          else loss)

    s = _run(tmp_path, "n", preset, attentions=["softmax", "nala"], hooks=poison)
    by = {o.attention: o for o in s.outcomes}
    assert by["softmax"].status == "failed" and "loss is nan at step 2" in by["softmax"].error
    assert by["nala"].status == "ok"
    rec = {r.attention: r for r in records(tmp_path / "n.db")}
    assert rec["softmax"].status == "failed" and "nan" in rec["softmax"].error and rec["nala"].status == "ok"


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_two_processes_equal_one_and_every_rank_loads_a_plugin(tmp_path):
    """torchrun with 2 CPU processes on gloo vs 1 process, global batch 8, dropout 0 (with dropout the two runs
    draw different masks: each rank has its own stream). Beside softmax, a plug-in (the example, copied outside the
    repository) given by --plugin as a relative path: each rank loads it, its record names its absolute path, and
    ``show`` gives the command that loads it again. One torchrun for both: each start of two ranks costs seconds of
    imports."""
    from attnbench.api.plugins import ENV
    from attnbench.cli.main import app

    plugin = Path(shutil.copy(Path(__file__).resolve().parents[1] / "examples" / "my_attention.py", tmp_path))
    preset = write_preset(tmp_path / "p.toml", steps=6, eval_every=3, dropout=0.0)
    one = _run(tmp_path, "one", preset).outcomes[0]
    env = {**{k: v for k, v in os.environ.items() if k != ENV}, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "attnbench.cli.main", "run", "lra", "--attn", "softmax,my_window", "--plugin",
           plugin.name, "--tasks", "listops", "--preset", str(preset), "--db", str(tmp_path / "two.db"), "--out",
           str(tmp_path / "two"), "--nproc", "2"]   # the plug-in by a relative path: the record names it absolute
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "launching 2 processes" in proc.stdout and "torch.distributed.run" in proc.stdout
    recs = {r.attention: r for r in records(tmp_path / "two.db")}
    assert set(recs) == {"softmax", "my_window"} and all(r.status == "ok" for r in recs.values())
    two, mine = recs["softmax"], recs["my_window"]
    assert two.metrics["world_size"] == 2 and mine.metrics["world_size"] == 2
    for key in ("test_acc", "best_val_acc", "best_step"):
        assert two.metrics[key] == pytest.approx(one.metrics[key], abs=1e-9), key
    for key in ("test_loss", "final_train_loss"):
        assert two.metrics[key] == pytest.approx(one.metrics[key], rel=1e-4), key
    # a run is keyed by its global batch, not by the number of processes: the 1-process run's cell is the same cell
    with Store(tmp_path / "one.db") as s:
        assert s.measurements(suite="lra")[0].config_hash == two.config_hash
    assert f"plugin:{plugin}" in mine.packages and not any(k.startswith("plugin:") for k in two.packages)
    show = CliRunner().invoke(app, ["show", "lra", "my_window", "--db", str(tmp_path / "two.db"), "--no-committed"],
                              env={"COLUMNS": "200"})
    again = [ln.strip() for ln in show.output.splitlines() if ln.strip().startswith("attnbench run lra")]
    assert show.exit_code == 0 and again and f"--plugin {plugin}" in again[0], show.output  # the absolute source


def test_train_order_and_sharding_are_deterministic():
    o = TrainOrder(n=20, batch=8, seed=3)
    a = [o.indices(s).tolist() for s in range(5)]
    b = [TrainOrder(n=20, batch=8, seed=3).indices(s).tolist() for s in range(5)]
    assert a == b and len(set(a[0] + a[1])) == 16  # no repeats within an epoch (2 batches of 8 of 20)
    assert a[2] != a[0]  # a new permutation for epoch 1
    assert step_seed(0, 5, 0) != step_seed(0, 5, 1) and step_seed(0, 5, 0) == step_seed(0, 5, 0)


def test_reported_tables_cite_the_paper_not_a_file_outside_the_repository():
    from attnbench.results.reported import load_dir

    for table in load_dir(Path(__file__).resolve().parents[1] / "suites" / "lra" / "reported"):
        assert "papers/notes" not in table.cite and "arXiv 2506.21137" in table.cite


def test_accuracy_cells_carry_their_interval_and_significance_marks():
    from attnbench.results.stats import seed_stats, two_proportion_p, wilson_interval
    from attnbench.suites.lra.leaderboard import _fmt_cell

    lo, hi = wilson_interval(0.5, 100)
    assert lo < 0.5 < hi and 0.09 < (hi - lo) / 2 < 0.11  # about ±9.8 points at n = 100
    assert two_proportion_p(0.52, 150, 0.487, 150) > 0.05 and two_proportion_p(0.6, 1000, 0.5, 1000) < 1e-3
    # 52% of 150 with a 51.3% majority is at chance (†), and not different from a best of 55% (≈)
    one = lambda x, n: seed_stats([x], n_test=n)  # noqa: E731
    p = two_proportion_p(0.52, 150, 0.55, 150)
    assert _fmt_cell(one(52.0, 150), p, 0.513, False) == "52.00 ± 7.9 ≈†"
    # 90% of 1000 against a best of 95%: significantly worse, clearly above a 10% majority: no mark
    assert _fmt_cell(one(90.0, 1000), two_proportion_p(0.9, 1000, 0.95, 1000), 0.1, False) == "90.00 ± 1.9"
    assert _fmt_cell(one(95.0, 1000), None, 0.1, True) == "95.00 ± 1.4 ^"
    # two seeds: the mean ± its test-set interval, then the t-interval over the seeds (12.71 · 1.41 / √2)
    assert _fmt_cell(seed_stats([50.0, 52.0], n_test=1000), 1e-4, 0.1, False) == "51.00 ± 3.1 (seeds ± 12.71, n=2)"


def test_data_dir_without_preset_says_which_preset_runs(tmp_path, monkeypatch):
    from attnbench.suites.lra import train as lra_train

    out = []
    console = Console(file=open(os.devnull, "w"), width=300)
    console.print = lambda *a, **k: out.append(" ".join(map(str, a)))  # type: ignore[method-assign]
    monkeypatch.setattr(lra_train, "check_tasks", lambda pre, tasks: (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):  # stop right after the announcement
        lra_train.run_lra(attentions=["softmax"], data_dir=str(tmp_path), console=console, progress=False)
    assert any("skyformer" in line and "--preset tiny" in line for line in out)


def test_a_peak_is_measured_while_malloc_keeps_freed_memory():
    """Every run tells glibc to keep freed memory (fewer page faults a step); the meter still sees a block made
    after it starts, with freed blocks of the same size around it (the meter trims them before its baseline)."""
    from attnbench.measure.memory import PeakRSS
    from attnbench.measure.peak import PeakMeter, keep_freed_memory

    if not PeakRSS.available():
        pytest.skip("no /proc/self/status")
    keep_freed_memory()
    for _ in range(3):
        block = torch.ones(5 << 20)              # 20 MiB: under the 32 MiB from which blocks are mapped apart
        del block
    meter = PeakMeter(torch.device("cpu"))
    block = torch.ones(5 << 20)
    peak, how = meter.read()
    assert peak is not None and peak >= 16 << 20, (peak, how)


def test_memory_below_resolution_is_none_with_a_reason_never_zero(monkeypatch):
    from attnbench.measure.memory import PeakRSS
    from attnbench.measure.peak import PeakMeter

    if not PeakRSS.available():
        pytest.skip("no /proc/self/status")
    meter = PeakMeter(torch.device("cpu"))
    monkeypatch.setattr(PeakRSS, "peak", lambda self: 0)  # what an allocator that reuses its pages reports
    peak, how = meter.read()
    assert peak is None and "below resolution" in how
