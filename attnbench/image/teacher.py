"""A trained classifier to start from: the softmax ViT that linearisation pipelines start from (a *teacher*), or
any spec's model trained from scratch on a preset.

Where it comes from, in order: a checkpoint file the user gives; the store (the latest ``ok`` record of the
preset's setting for that attention and seed, with the preset's identity and its weights on disk: a model that
``attnbench run`` trained on the same preset); a model this module trained before under the work directory;
else it is trained now by :func:`attnbench.image.classify.fit_classifier` and kept under the work directory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from attnbench.api.spec import AttentionSpec, parse_spec
from attnbench.engine.train.dist import Dist, default_device
from attnbench.results import provenance
from attnbench.results.store import open_existing


@dataclasses.dataclass
class Teacher:
    model: object  # the softmax ViT, weights loaded, eval mode
    path: Path
    origin: str  # "file" | "store" | "trained before" | "trained now"
    test_top1: Optional[float] = None  # as recorded when it was trained (None for a file)


def find_trained(pre, db: Optional[str], seed: int = 0,
                 attention: str = "softmax") -> Optional[tuple[Path, Optional[float]]]:
    """The weights and test top-1 of the latest ok record of ``pre``'s setting for ``attention`` and ``seed`` in
    the store with ``pre``'s identity and its weights on disk, if any."""

    store = open_existing(db)
    if store is None:
        return None
    with store:
        recs = [m for m in store.measurements(setting=pre.key, attention=attention, status="ok")
                if m.seed == seed and m.params.get("identity") == pre.identity_hash()
                and m.metrics.get("weights") and Path(m.metrics["weights"]).is_file()]
    if not recs:
        return None
    last = recs[-1]
    return Path(last.metrics["weights"]), last.metrics.get("test_top1")


def trained_path(work: Path, pre, spec: AttentionSpec, seed: int, data_fingerprint: str) -> Path:
    """Where :func:`get_trained` keeps the model it trains: ``WORK/models/<setting>/<spec>-<identity>-seed<seed>.pt``,
    the identity a hash of the preset's identity, the spec's options and the data."""

    ident = provenance.config_hash({"setting": pre.key, "identity": pre.identity_hash(), "attention": spec.label,
                                    "options": dict(spec.options), "data": data_fingerprint, "seed": seed})
    slug = pre.key.replace("/", "_")
    return work / "models" / slug / f"{spec.label.replace(':', '_').replace('/', '_')}-{ident}-seed{seed}.pt"


def get_trained(pre, spec: AttentionSpec, splits, *, db: Optional[str], work: Path, seed: int = 0, console=None,
                device=None, dist=None) -> tuple[Path, Optional[float], str]:
    """``(weights, test top-1, origin)`` of ``pre``'s classifier with ``spec`` (its preset options applied):
    from the store, else trained before under ``work``, else trained now on ``splits`` (with ``dist``'s
    processes; default: this process on the default device)."""
    import torch

    from attnbench.image.classify import fit_classifier

    label = spec.label  # as the user wrote it: what a record's attention says
    spec = spec.with_defaults(pre.options_for(spec.name))
    found = find_trained(pre, db, seed, label)
    if found is not None:
        return found[0], found[1], "store"
    path = trained_path(Path(work), pre, spec, seed, splits.fingerprint)
    if path.is_file():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        return path, saved.get("metrics", {}).get("test_top1"), "trained before"
    if console is not None:
        console.print(f"no trained {label} model of {pre.key} in the store or {work}: training it first")
    device = device or default_device()
    dist = dist or Dist()
    fitted = fit_classifier(spec, pre, splits, seed=seed, device=device, dist=dist, identity=path.stem,
                            checkpoint=Path(work) / "checkpoints" / path.parent.name / path.name,
                            label=f"{label} ({pre.key})")
    if dist.main:  # the weights (load_pretrained reads them under "model") with the test top-1 they reached
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({"model": fitted.model.state_dict(), "metrics": {"test_top1": fitted.metrics["test_top1"]}}, tmp)
        tmp.replace(path)
        (Path(work) / "checkpoints" / path.parent.name / path.name).unlink(missing_ok=True)
    dist.barrier()
    return path, fitted.metrics["test_top1"], "trained now"


def get_teacher(pre, splits, *, path: Optional[str] = None, db: Optional[str] = None, work: Optional[Path] = None,
                seed: int = 0, console=None, device=None, dist=None) -> Teacher:
    """The softmax ViT of ``pre``: ``path`` if given, else :func:`get_trained`'s (``work``: where a model
    trained here is kept)."""
    from attnbench.image.classify import build_classifier
    from attnbench.models.vit import load_pretrained

    origin, top1 = "file", None
    if path is None:
        if work is None:
            raise ValueError("get_teacher needs the work directory (work=) when no checkpoint path is given")
        path, top1, origin = get_trained(pre, parse_spec("softmax"), splits, db=db, work=work, seed=seed,
                                         console=console, device=device, dist=dist)
    model = build_classifier(parse_spec("softmax"), pre, splits.num_classes)
    load_pretrained(model, path, allow_missing_mechanism=False)
    return Teacher(model=model.eval(), path=Path(path), origin=origin, test_top1=top1)
