"""``attnbench run lra --smoke``: every task of a preset through its real pipeline on the CPU, in minutes.

For each task: a few examples written in the release's file format into a temporary directory (ListOps TSVs and
Pathfinder PNGs + metadata by the project's generators, IMDb's ``aclImdb`` tree of ``*.txt`` reviews, AAN's
five-column TSVs, CIFAR-10's python pickles), then the preset's own pipeline — the reader at the task's length,
the model at the preset's size, AdamW under OneCycleLR, clipping, validation, the test split, the store — for
three steps at a batch of two in float32. Each cell's first attempt stops inside step 2 after its step-1
checkpoint; the rerun must resume from it. Then one line per (task, attention): the full run's cost
(:class:`attnbench.engine.smoke.FullRunCost`). What the smoke shortens: steps (3), batch (2), data (a few examples);
everything else is the preset's.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from attnbench.api.spec import as_specs
from attnbench.core.errors import AttnbenchError
from attnbench.engine.smoke import FullRunCost, StopOnce, smoke_dirs, smoke_where, train_flops

from . import generate
from .config import PAIR_TASKS, load_preset
from .data import PATHFINDER_DIRS
from .model import build_model
from .train import check_tasks, prepare_task, run_lra

SMOKE_STEPS = 3
SMOKE_BATCH = 2
N_TRAIN, N_VAL, N_TEST = 8, 4, 4


# ------------------------------------------------------------------------------- files in the release formats
def _words(rng: np.random.Generator, n_bytes: int) -> bytes:
    """Printable ASCII words, at least ``n_bytes`` long (byte-level readers cut them to the task's length)."""
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    out = rng.choice(letters, size=n_bytes)
    out[rng.random(n_bytes) < 0.15] = ord(" ")
    return out.tobytes()


def write_imdb(root: Path, n_per_class: int, n_bytes: int, seed: int = 0) -> Path:
    """``root/aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt`` as the IMDb release names them."""
    rng = np.random.default_rng(seed)
    base = root / "aclImdb"
    for split in ("train", "test"):
        for cls, ratings in (("neg", (1, 4)), ("pos", (7, 10))):
            d = base / split / cls
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n_per_class):
                rating = int(rng.integers(ratings[0], ratings[1] + 1))
                (d / f"{i}_{rating}.txt").write_bytes(_words(rng, n_bytes))
    return base


def write_aan(root: Path, n: dict[str, int], n_bytes: int, seed: int = 0) -> Path:
    """``root/tsv_data/new_aan_pairs.{train,eval,test}.tsv``: headerless ``label\\tid1\\tid2\\ttext1\\ttext2``,
    labels written as floats (``1.0``) as in the release."""
    rng = np.random.default_rng(seed)
    d = root / "tsv_data"
    d.mkdir(parents=True, exist_ok=True)
    for split, fname in (("train", "train"), ("val", "eval"), ("test", "test")):
        lines = []
        for i in range(n[split]):
            label = float(i % 2)
            a, b = _words(rng, n_bytes).decode(), _words(rng, n_bytes).decode()
            lines.append(f"{label}\tacl-{split}-{i}a\tacl-{split}-{i}b\t{a}\t{b}")
        (d / f"new_aan_pairs.{fname}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def write_cifar(root: Path, per_batch: int, n_test: int, seed: int = 0) -> Path:
    """``root/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``: the python release's pickles (bytes
    keys, ``data`` uint8 ``[n, 3072]`` in R, G, B planes, ``labels`` a list of ints)."""
    rng = np.random.default_rng(seed)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True, exist_ok=True)

    def batch(name: str, n: int) -> None:
        payload = {b"batch_label": name.encode(), b"labels": [int(x) for x in rng.integers(0, 10, n)],
                   b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                   b"filenames": [f"smoke_{name}_{i}.png".encode() for i in range(n)]}
        with open(d / name, "wb") as f:
            pickle.dump(payload, f, protocol=2)

    for i in range(1, 6):
        batch(f"data_batch_{i}", per_batch)
    batch("test_batch", n_test)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names, b"num_cases_per_batch": per_batch, b"num_vis": 3072}, f, protocol=2)
    return d


def write_task_files(task: str, cfg, root: Path) -> None:
    """The few examples of ``task`` the smoke reads, in the release's layout under ``root`` (``--data-dir``)."""
    if task == "listops":
        hi = max(cfg.seq_len, 8)  # trees as long as the task's length, so the reader's cut is exercised
        generate.generate_listops(root, n_train=N_TRAIN, n_val=N_VAL, n_test=N_TEST, seed=0,
                                  min_length=max(hi // 2, 5), max_length=hi + 2)
    elif task == "text":
        write_imdb(root, n_per_class=N_TRAIN // 2, n_bytes=cfg.seq_len + 50)
    elif task == "retrieval":
        write_aan(root, {"train": N_TRAIN, "val": N_VAL, "test": N_TEST}, n_bytes=cfg.seq_len + 50)
    elif task == "image":
        write_cifar(root, per_batch=2, n_test=N_TEST)
    elif task == "pathfinder":
        lengths = {"curv_baseline": 6, "curv_contour_length_9": 9, "curv_contour_length_14": 14}
        contour = lengths[PATHFINDER_DIRS.get(cfg.difficulty, cfg.difficulty)]
        generate.generate_pathfinder(root, n=20, seed=0, contour_length=contour, size=cfg.resolution)
    else:  # pragma: no cover - check_tasks refuses it
        raise AttnbenchError(f"no smoke data for task {task!r}")


# ------------------------------------------------------------------------------------------- smoke preset
def smoke_task(cfg):
    """The task's config for the smoke: its length, model, optimizer, schedule kind and evaluation; 3 steps at a
    batch of 2, evaluated at the end, checkpointed every step; a generator (if the preset has one) shrunk to a
    few examples."""
    gen = cfg.generate
    if gen is not None:
        if hasattr(gen, "n_train"):
            gen = dataclasses.replace(gen, n_train=N_TRAIN, n_val=N_VAL, n_test=N_TEST)
        else:
            gen = dataclasses.replace(gen, n=20)
    return dataclasses.replace(cfg, steps=SMOKE_STEPS, batch_size=SMOKE_BATCH, eval_batch_size=SMOKE_BATCH,
                               warmup=2 if cfg.warmup else 0, eval_every=SMOKE_STEPS, eval_batches=0,
                               checkpoint_every=1, patience=0, min_steps=0, train_limit=0, val_limit=0,
                               test_limit=0, generate=gen)


def smoke_preset(pre, tasks: Sequence[str]):
    return dataclasses.replace(pre, tasks={t: smoke_task(pre.task(t)) for t in tasks}, tasks_default=list(tasks),
                               setting=f"{pre.key}-smoke")


# ------------------------------------------------------------------------------------------------- the run
def run_smoke(*, attentions: Sequence[str], preset: Optional[str], tasks: Optional[Sequence[str]], seed: int = 0,
              db: Optional[str] = None, out: Optional[str] = None, console=None, gpu: str = "H100") -> int:
    """Run the smoke (see the module docstring); prints one line per cell and the full runs' cost; returns the
    exit code (0 ok, 1 a cell failed or did not resume)."""
    import torch
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    pre = load_preset(preset or "tiny")
    # every task the preset defines (not only its default ones): each has its own reader and length
    tasks = check_tasks(pre, list(tasks) if tasks else list(pre.tasks))
    specs = as_specs(attentions)
    small = smoke_preset(pre, tasks)
    with smoke_dirs(out, db, "lra") as d:
        d.data.mkdir(parents=True)
        for t in tasks:
            if small.task(t).data != "generate":
                write_task_files(t, small.task(t), d.data)
        console.print(f"[bold]lra {escape(pre.key)} smoke[/]: {', '.join(tasks)} x "
                      f"{', '.join(s.label for s in specs)}; {SMOKE_STEPS} steps at batch {SMOKE_BATCH}, "
                      f"{smoke_where()}; data in the release formats under {d.data}; store {d.db}")
        stop = StopOnce(at=2)
        hooks = lambda task, attention: stop.hooks((task, attention))  # noqa: E731
        kw = dict(attentions=specs, tasks=tasks, preset=small, data_dir=str(d.data), seed=seed, db=d.db,
                  out=str(d.work), console=console, hooks=hooks, progress=False, estimate=False)
        _, bad = stop.stop_and_resume(lambda: run_lra(**kw), console)
        if bad is not None:
            console.print(f"[bold red]smoke failed:[/] {escape(bad)}")
            return 1
        # the full runs' cost: FLOPs of one training example at the preset's length and model
        for t in tasks:
            cfg, m = pre.task(t), pre.model
            data = prepare_task(t, small.task(t), data_dir=d.data, cache=d.work / "data")
            for spec in specs:
                full = spec.with_defaults(pre.options_for(spec.name))
                torch.manual_seed(0)
                model = build_model(full, vocab_size=data.train.vocab_size, num_classes=data.train.num_classes,
                                    seq_len=cfg.seq_len, pair=t in PAIR_TASKS, pad_id=data.train.pad_id, dim=m.dim,
                                    ffn_dim=m.ffn_dim, heads=m.heads, head_dim=m.head_dim, layers=m.layers,
                                    dropout=m.dropout)
                x = data.train.padded(1)[:1]
                x2 = data.train.padded(2)[:1] if t in PAIR_TASKS else None

                def step():
                    (model(x, x2) if x2 is not None else model(x)).float().sum().backward()

                per_item = train_flops(step)
                cost = FullRunCost(cfg.steps, cfg.batch_size, "pairs" if t in PAIR_TASKS else "sequences", per_item)
                early = " at most (early stopping)" if cfg.patience else ""
                console.print(f"  {t:<10} {escape(spec.label):<14} {escape(cost.line(gpu))}{early}")
    return 0
