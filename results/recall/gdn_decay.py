"""Why Gated DeltaNet stays on MQAR's plateau at some seeds of the tiny preset: its first layer's decay at
initialisation (results/recall/README.md, "Gated DeltaNet's plateau").

With one head (the tiny preset's width 64), each layer draws one decay: ``g = -A softplus(a_proj x + dt_bias)``
with FLA's initialisation, ``A ~ U(0, 16)`` and ``dt`` log-uniform in [1e-3, 0.1] (attnbench.models.mixers). At
``a_proj x = 0`` a key written ``t`` tokens before a query is kept with weight ``exp(-A dt) ** t``.

    python results/recall/gdn_decay.py init                      # each seed's draw: retention over 32 tokens
    python results/recall/gdn_decay.py train 0.6 1,3,4 rescue.db # first layer's A set so that retention is 0.6
    python results/recall/gdn_decay.py train 0.004 0,5 break.db  # ... or 0.004

``train`` runs the tiny preset's Gated DeltaNet cell at learning rate 1e-3 with only that change (``dt``, every
other weight, the data and their order as the seed draws them), into its own store and work directory: the cells
keep the identity of the unchanged ones, so never ingest that store into one with real results.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

import attnbench.suites.recall.train as recall_train
from attnbench.suites.recall.config import load_preset, parse_mixers

SPAN = 32   # tokens between a key and its query, about half the 64-token sequence


def retention(attn) -> tuple[float, float, float]:
    """``(A, dt, exp(-A dt) ** SPAN)`` of a Gated DeltaNet mixer's single head."""
    a, dt = attn.A_log.exp().item(), F.softplus(attn.dt_bias).item()
    return a, dt, math.exp(-a * dt) ** SPAN


def init(seeds=range(6)) -> None:
    pre = load_preset("tiny")
    point = pre.points()[0]
    (mixer,) = parse_mixers("gated_deltanet")
    for seed in seeds:
        torch.manual_seed(seed)   # as the runner does before it builds a cell's model
        model = recall_train.build_model(pre.model_config(mixer, point), point.task)
        print(f"seed {seed}: " + " | ".join(
            f"layer {i + 1}: A {a:5.2f} dt {dt:.4f} retention over {SPAN} tokens {r:.3f}"
            for i, (a, dt, r) in enumerate(retention(b.attn) for b in model.blocks)))


def train(keep: float, seeds: list[int], db: str) -> int:
    build = recall_train.build_model

    def with_first_decay(cfg, task):
        model = build(cfg, task)
        attn = model.blocks[0].attn
        if not attn.A_log.is_meta:
            _, dt, before = retention(attn)
            with torch.no_grad():
                attn.A_log.fill_(math.log(-math.log(keep) / (SPAN * dt)))
            print(f"layer 1: retention over {SPAN} tokens {before:.3f} -> {retention(attn)[2]:.3f}", flush=True)
        return model

    recall_train.build_model = with_first_decay
    text = (Path(recall_train.__file__).parent / "presets" / "tiny.toml").read_text()
    assert "learning_rates = [1e-3, 3e-3]" in text
    work = Path(tempfile.mkdtemp(prefix="gdn-decay-"))
    (work / "tiny.toml").write_text(text.replace("learning_rates = [1e-3, 3e-3]", "learning_rates = [1e-3]"))
    summary = recall_train.run_recall(mixers=parse_mixers("gated_deltanet"), preset=str(work / "tiny.toml"), db=db,
                                      out=str(work / "out"), seeds=seeds, threads=1, progress=False)
    return summary.exit_code()


if __name__ == "__main__":
    if sys.argv[1:2] == ["init"]:
        init()
    elif sys.argv[1:2] == ["train"] and len(sys.argv) == 5:
        sys.exit(train(float(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")], sys.argv[4]))
    else:
        sys.exit(__doc__)
