"""Training checkpoints: written atomically, checked on load (format version, the run's identity), and a
damaged or foreign file is a one-line :class:`CheckpointError` naming the file and the way out — never a
traceback and never a silent restart."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

from attnbench.engine.sweep import CellError
from attnbench.io.formats import refused_global

FORMAT = 3  # 1: the LRA runner's dict checkpoints (before attnbench.engine.train); 2: numpy RNG state pickled


class CheckpointError(CellError):
    """A checkpoint that cannot be resumed from (damaged, of another format or of another configuration)."""
    def __init__(self, message: str):
        super().__init__(message, status="failed")


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """``torch.save`` to a temporary file in the same directory, then ``os.replace``: a kill never leaves a
    half-written checkpoint under ``path``."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path, *, identity: str) -> dict[str, Any]:
    """The checkpoint at ``path`` written by a run with this ``identity`` (config hash)."""
    import torch

    remedy = "rerun with --force to start this cell from scratch (or move the file aside)"
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes): {remedy}")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain values only
    except pickle.UnpicklingError as e:
        held = refused_global(e)
        reason = (f"it holds {held}, a Python object beyond tensors and plain values (an older attnbench wrote it, "
                  f"or another program), which is not unpickled" if held else "not a torch file")
        raise CheckpointError(f"checkpoint {path} is damaged ({reason}): {remedy}") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is damaged ({reason}): {remedy}") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        got = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise CheckpointError(f"checkpoint {path} has format {got!r}, this attnbench writes {FORMAT}: {remedy}")
    if saved.get("identity") != identity:
        raise CheckpointError(f"checkpoint {path} belongs to another configuration ({saved.get('identity')!r}, "
                              f"this run is {identity!r}): {remedy}")
    return saved
