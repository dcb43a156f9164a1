"""The softmax ViT that the linearisation pipelines start from (a *teacher*): a checkpoint file, or the model
that ``attnbench run vision --attn softmax`` trained on the same preset (found through the store), trained first
when there is none (the offline default: the tiny digits teacher, about a minute on a CPU)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from attnbench.errors import AttnbenchError
from attnbench.spec import parse_spec

from .config import VisionPreset


@dataclasses.dataclass
class Teacher:
    model: object  # the softmax ViT, weights loaded, eval mode
    path: Path
    origin: str  # "file" | "store" | "trained now"
    test_top1: Optional[float] = None  # as recorded by the vision suite (None for a file)


def find_trained(pre: VisionPreset, db: Optional[str], seed: int = 0) -> Optional[tuple[Path, float]]:
    """The weights and test top-1 of the latest ok softmax cell of ``pre``'s setting in the store, if any."""
    from attnbench.store import open_existing

    store = open_existing(db)
    if store is None:
        return None
    with store:
        recs = [m for m in store.measurements(suite="vision", setting=pre.key, attention="softmax", status="ok")
                if m.seed == seed and m.params.get("identity") == pre.identity_hash()
                and m.metrics.get("weights") and Path(m.metrics["weights"]).is_file()]
    if not recs:
        return None
    last = recs[-1]
    return Path(last.metrics["weights"]), last.metrics.get("test_top1")


def get_teacher(pre: VisionPreset, num_classes: int, *, path: Optional[str] = None, db: Optional[str] = None,
                out: Optional[str] = None, seed: int = 0, console=None, data_dir: Optional[str] = None,
                eval_limit: Optional[int] = None) -> Teacher:
    """``path`` if given, else the store's softmax model of ``pre``, else train one now (``run vision`` on
    ``data_dir``, evaluations cut to ``eval_limit`` images if given)."""
    from attnbench.models.vit import load_pretrained

    from .train import build_model, run_vision

    origin, top1 = "file", None
    if path is None:
        found = find_trained(pre, db, seed)
        origin = "store"
        if found is None:
            if console is not None:
                console.print(f"no softmax teacher for {pre.key} in the store: training it first (attnbench run "
                              f"vision --attn softmax --preset {pre.name})")
            summary = run_vision(attentions=["softmax"], preset=pre, data_dir=data_dir, db=db, out=out, seed=seed,
                                 console=console, progress=False, eval_limit=eval_limit)
            if summary.exit_code():
                raise AttnbenchError(f"training the softmax teacher failed: {summary.line()}")
            found = find_trained(pre, db, seed)
            origin = "trained now"
            if found is None:
                raise AttnbenchError(f"the softmax teacher of {pre.key} was trained but its weights are not found")
        path, top1 = found
    model = build_model(parse_spec("softmax"), pre, num_classes)
    load_pretrained(model, path, allow_missing_mechanism=False)
    return Teacher(model=model.eval(), path=Path(path), origin=origin, test_top1=top1)
