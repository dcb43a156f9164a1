"""``attnbench run lm --smoke``: each variant of a preset through the real pipeline on the CPU.

A JSONL corpus is written into a temporary directory and read the way ``--data corpus.jsonl`` reads one
(``datasets``' JSON loader, documents split by hash); the preset's tokenizer is trained on it to the preset's
vocabulary (a hub tokenizer, unreachable offline, is replaced by a byte-level BPE trained here to the size the
preset states, so the embedding and output layers have their real size) and the splits are packed into windows;
each variant's model is built at the preset's full size and trained by the preset's recipe (optimizer, schedule,
clipping, gradient accumulation, the NaN and divergence guards) for 3 steps at a batch of 2 (float32 on the CPU),
validated, checkpointed at step 1, stopped inside step 2 and resumed from that checkpoint, scored on the test split,
written as an artifact and scored by lm-eval on the local held-out tasks (a few documents). Then one line per variant:
its parameters and the full run's cost (:class:`attnbench.engine.smoke.FullRunCost`).

What the smoke changes: steps (3), batch (2; micro-batches of 1 when the preset accumulates), precision (float32 on
the CPU, the preset's own on a GPU: :func:`attnbench.engine.smoke.smoke_precision`), the split fractions (3% each for
validation and test: a dozen short documents each), the windows per validation (4), lm-eval's tasks (the two local
ones when the preset's need the hub) and documents (2), and sequences longer than :data:`MAX_SMOKE_SEQ` tokens
(shortened to it: a full-length step of the 340M models on two CPU cores takes minutes). The per-token FLOPs of the
cost line are counted at the smoke's length: the delta rule is linear in the length, so a token costs the same at the
full length (chunks of 64 tokens or fewer fill at either length).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from attnbench.engine.smoke import FullRunCost, StopOnce, smoke_dirs, smoke_precision, smoke_where, train_flops
from attnbench.models.lm import build_lm

from .config import EvalConfig
from .data import DataConfig
from .train import next_token_loss, run_lm

SMOKE_STEPS = 3
SMOKE_BATCH = 2
MAX_SMOKE_SEQ = 128
LOCAL_TASKS = ["attnbench_heldout", "attnbench_cloze"]


def write_corpus(path: Path, *, n_docs: int = 400, n_words: int = 12000, words_per_doc: int = 60,
                 seed: int = 0) -> Path:
    """A JSONL corpus (``{"text": ...}`` per line) of lines of random lower-case words: enough distinct words
    for a byte-level BPE of 32,000 symbols to fill up, lines for the cloze task, short documents so that the
    held-out splits (a few percent of them) are a few windows."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = np.array(["".join(rng.choice(letters, int(rng.integers(4, 13)))) for _ in range(n_words)])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_docs):
            picked = rng.choice(words, words_per_doc)
            lines = [" ".join(picked[i:i + 12]) for i in range(0, words_per_doc, 12)]
            f.write(json.dumps({"text": "\n".join(lines)}) + "\n")
    return path


def smoke_preset(pre, corpus: Path):
    """The preset as the smoke runs it (see the module docstring for each change)."""
    d = pre.data
    data = DataConfig(source="files", path=str(corpus), text_field="text",
                      tokenizer=d.tokenizer if d.tokenizer in ("bpe", "bytes") else "bpe", vocab_size=d.vocab_size,
                      seq_len=min(d.seq_len, MAX_SMOKE_SEQ), val_fraction=0.03, test_fraction=0.03, eval_windows=4)
    t = pre.train
    train = dataclasses.replace(t, steps=SMOKE_STEPS, batch_size=SMOKE_BATCH,
                                micro_batch_size=1 if t.micro_batch_size else 0, warmup=min(t.warmup, 1),
                                eval_every=SMOKE_STEPS, checkpoint_every=1, patience=0, min_steps=0,
                                precision=smoke_precision(t.precision))
    local = all(x in LOCAL_TASKS for x in pre.eval.tasks)
    ev = EvalConfig(tasks=list(pre.eval.tasks) if local and pre.eval.tasks else list(LOCAL_TASKS),
                    batch_size=SMOKE_BATCH, limit=2, num_fewshot=0)
    return dataclasses.replace(pre, data=data, train=train, eval=ev, setting=f"{pre.key}-smoke")


def run_smoke(pre, variants: Sequence, *, seed: int = 0, db: Optional[str] = None, out: Optional[str] = None,
              console=None, gpu: str = "H100") -> int:
    """Run the smoke (see the module docstring); returns the exit code (0 ok, 1 a step failed or did not resume)."""
    import math

    import torch
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    with smoke_dirs(out, db, "lm") as d:
        corpus = write_corpus(d.data / "corpus.jsonl")
        small = smoke_preset(pre, corpus)
        short = (f"; sequences shortened from {pre.data.seq_len} to {small.data.seq_len} tokens"
                 if small.data.seq_len < pre.data.seq_len else "")
        hub = (f"; tokenizer {pre.data.tokenizer!r} (hub) replaced by a BPE trained here to {pre.data.vocab_size}"
               if small.data.tokenizer != pre.data.tokenizer else "")
        console.print(f"[bold]lm {escape(pre.key)} smoke[/]: {len(variants)} variant(s) at full size, "
                      f"{SMOKE_STEPS} steps at batch {SMOKE_BATCH}, {smoke_where(pre.train.precision)}; JSONL corpus "
                      f"{corpus}; store "
                      f"{d.db}{escape(short + hub)}")
        stop = StopOnce(at=2)
        kw = dict(variants=variants, preset=small, seed=seed, db=d.db, out=str(d.work), console=console,
                  hooks=stop.hooks, progress=False)
        second, bad = stop.stop_and_resume(lambda **extra: run_lm(**kw, **extra), console, unit="model (lm-eval "
                                           "scores it after its resume)", first=dict(evaluate=False),
                                           second=dict(evaluate=True))
        if bad is None and second.exit_code():
            bad = f"lm-eval: exit code {second.exit_code()}"
        if bad is not None:
            console.print(f"[bold red]smoke failed:[/] {escape(bad)}")
            return 1
        T = small.data.seq_len
        full_tokens = pre.train.batch_size * pre.data.seq_len
        for v in variants:
            cfg = pre.model_config(v, pre.data.vocab_size)
            torch.manual_seed(0)
            model = build_lm(cfg)
            n = sum(p.numel() for p in model.parameters())
            ids = torch.randint(0, pre.data.vocab_size, (1, T + 1))
            per_token = train_flops(lambda net=model: next_token_loss(net, ids).backward()) / T
            del model
            cost = FullRunCost(pre.train.steps, full_tokens, "tokens", per_token)
            if not math.isfinite(per_token):  # pragma: no cover - the counter returns ints
                console.print(f"[bold red]smoke failed:[/] {escape(v.label)}: FLOPs not counted")
                return 1
            console.print(f"  {escape(v.label):<28} {n / 1e6:8.2f} M parameters (vocabulary {pre.data.vocab_size}) "
                          f"· {escape(cost.line(gpu))}")
    return 0
