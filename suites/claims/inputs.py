"""The inputs the checks measure on: synthetic draws of stated distributions, and real queries and keys from a
trained model of the vision suite (its softmax ViT on ``vision/tiny``, found through the store as the ViT-AdaLA and
MixA suites find their teacher, :func:`attnbench.image.teacher.find_trained`).

Real inputs are never faked: when the store has no trained model, :func:`find_teacher` returns None and the
real-input cells are recorded as ``skipped`` with the reason and the command that trains one.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Optional

from attnbench.api.spec import parse_spec
from attnbench.engine.presets import load_suite_preset
from attnbench.image.teacher import find_trained
from attnbench.results.paths import resolve_db

TEACHER_PRESET = "tiny"
REAL_IMAGES = 64  # test images whose q, k the real-input checks read (64 x 65 tokens x 2 heads x 4 layers)


@dataclasses.dataclass(frozen=True)
class TeacherRef:
    """A trained softmax ViT of the vision suite: its weights, test top-1 and setting; ``ident`` (a hash of the
    weights) goes into every real-input cell's identity, so another teacher is another point."""

    path: Path
    top1: Optional[float]
    setting: str
    ident: str

    def describe(self) -> str:
        top1 = self.top1 * 100 if isinstance(self.top1, (int, float)) and self.top1 <= 1 else self.top1  # a fraction
        acc = f", test top-1 {top1:.1f}%" if isinstance(top1, (int, float)) else ""
        return f"the vision suite's softmax ViT of {self.setting} ({self.path.name}, sha256 {self.ident}{acc})"


def no_teacher_reason(db: Optional[str]) -> str:
    return (f"no trained vision/{TEACHER_PRESET} softmax ViT in {resolve_db(db).name} (none committed either): "
            f"`attnbench run vision --attn softmax --preset {TEACHER_PRESET}` trains one (about a minute)")


def find_teacher(db: Optional[str], seed: int = 0) -> Optional[TeacherRef]:
    """The store's softmax ViT of ``vision/tiny`` (seed ``seed``), or None."""
    pre = load_suite_preset("vision", TEACHER_PRESET)
    found = find_trained(pre, db, seed)
    if found is None:
        return None
    path, top1 = found
    ident = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    return TeacherRef(Path(path), top1, pre.key, ident)


def load_teacher(ref: TeacherRef):
    """``(model, splits, preset)``: the teacher in eval mode and the digits splits it was trained on."""
    from attnbench.image.classify import build_classifier, load_splits
    from attnbench.models.vit import load_pretrained

    pre = load_suite_preset("vision", TEACHER_PRESET)
    splits = load_splits(pre, None)
    model = build_classifier(parse_spec("softmax"), pre, splits.num_classes)
    load_pretrained(model, ref.path, allow_missing_mechanism=False)
    return model.eval(), splits, pre


def images(dataset, n: int):
    import torch

    xs = [dataset[i][0] for i in range(min(n, len(dataset)))]
    return torch.stack(xs)


def real_qk(ref: TeacherRef, n_images: int = REAL_IMAGES):
    """Every layer's queries and keys on the first ``n_images`` test images: ``(q, k)``, each
    ``[layers, images, heads, tokens, head_dim]`` in fp32 (the teacher's q, k as its softmax layers saw them)."""
    import torch

    model, splits, _ = load_teacher(ref)
    x = images(splits.test, n_images)
    seen: list = []
    # a pre-hook on each block's mechanism sees exactly the q, k the softmax layer gets
    hooks = [b.attn.mech.register_forward_pre_hook(lambda _m, args: seen.append(args[:2])) for b in model.blocks]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack([q for q, _ in seen]).float(), torch.stack([k for _, k in seen]).float()


_CACHE: dict = {}


def cached_real_qk(ref: TeacherRef):
    """:func:`real_qk`, computed once per process and teacher (several checks read it)."""
    if ref.ident not in _CACHE:
        _CACHE[ref.ident] = real_qk(ref)
    return _CACHE[ref.ident]
