"""A trained language model on disk: one directory that lm-eval (``attnbench eval lm``) and anyone else can load.

Layout (``FORMAT`` 1)::

    config.json      {"format", "model": LMConfig fields, "eos_id", "max_length", "meta": {...}}
    model.pt         the state dict (the weights of the best validation step)
    tokenizer.json   a ``tokenizers.Tokenizer`` (a locally trained byte-level BPE, or a hub tokenizer's fast form)

``meta`` holds at least ``setting`` (``lm/tiny``), ``variant`` (``gated_deltanet+nala``), ``config_hash`` (the
training cell's), the corpus description and, for local corpora, ``heldout``: a JSONL file of the held-out
documents (``{"text": ...}`` per line) from which the local lm-eval tasks are built; for a model whose feature map
comes from a plug-in, ``plugins``: ``{source: "sha256:..."}``, loaded again by :func:`load_lm`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from attnbench.api import plugins
from attnbench.core.errors import AttnbenchError

FORMAT = 1
FILES = ("config.json", "model.pt", "tokenizer.json")


class ArtifactError(AttnbenchError):
    """A checkpoint directory that is missing, incomplete or damaged (the message names the path)."""


@dataclasses.dataclass
class LoadedLM:
    model: Any            # attnbench.models.lm.DeltaLM, eval mode
    tokenizer: Any        # tokenizers.Tokenizer
    eos_id: int
    max_length: int
    meta: dict


def save_lm(folder: str | os.PathLike, model, tokenizer, *, eos_id: int, max_length: int, meta: dict) -> Path:
    """Write the artifact into ``folder`` (via a temporary sibling renamed into place: never half-written)."""
    import torch

    used = plugins.provenance(str(meta.get("variant", "")), model.cfg.to_dict())
    if used:  # the plug-ins its layers come from: load_lm loads them again (lm-eval's process, another machine)
        meta = {**meta, "plugins": {k.removeprefix("plugin:"): v for k, v in used.items()}}
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    torch.save(state, tmp / "model.pt")
    tokenizer.save(str(tmp / "tokenizer.json"))
    (tmp / "config.json").write_text(json.dumps({"format": FORMAT, "model": model.cfg.to_dict(), "eos_id": eos_id,
                                                 "max_length": max_length, "meta": meta}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def read_config(path: str | os.PathLike) -> dict:
    """The checked ``config.json`` of the artifact at ``path``, without torch: the directory, its files, the
    format and the JSON. :class:`ArtifactError` (one line naming the path) when any is missing or damaged."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path}: not an attnbench LM checkpoint directory (expected {', '.join(FILES)}); "
                            f"`attnbench run lm` writes them under results/runs/lm/models/")
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise ArtifactError(f"{path}: incomplete checkpoint, missing {', '.join(missing)}")
    try:
        cfg_file = json.loads((path / "config.json").read_text(encoding="utf-8"))
        if not isinstance(cfg_file, dict) or not isinstance(cfg_file.get("meta") or {}, dict):
            raise TypeError("config.json or its meta is not a table")
    except (OSError, ValueError, TypeError) as e:
        raise ArtifactError(f"{path / 'config.json'}: damaged ({type(e).__name__}: {e})") from None
    if cfg_file.get("format") != FORMAT:
        raise ArtifactError(f"{path / 'config.json'}: format {cfg_file.get('format')!r}, this attnbench reads "
                            f"format {FORMAT}")
    return cfg_file


def read_meta(path: str | os.PathLike) -> dict:
    """The ``meta`` of the artifact at ``path`` (:func:`read_config`; no torch)."""
    return dict(read_config(path).get("meta") or {})


def load_lm(path: str | os.PathLike, device: str = "cpu") -> LoadedLM:
    """The model (eval mode, on ``device``), tokenizer and metadata of the artifact at ``path``."""
    import torch
    from tokenizers import Tokenizer

    from attnbench.models.lm import LMConfig, build_lm

    path = Path(path)
    cfg_file = read_config(path)
    try:
        recorded = (cfg_file.get("meta") or {}).get("plugins") or {}
        if recorded:  # a model with a plug-in's feature map: its plug-in first (exported to lm-eval's children too)
            loaded = {p.source: p for p in plugins.activate(list(recorded))}
            for source, digest in recorded.items():
                now = loaded.get(plugins.resolve(source))
                if now is not None and f"sha256:{now.sha256}" != digest:
                    raise ArtifactError(f"{path}: trained with plug-in {source} at {digest[:19]}, which is now "
                                        f"sha256:{now.short_hash}; restore that version of the file, or retrain")
        cfg = LMConfig.from_dict(cfg_file["model"])
    except (KeyError, TypeError) as e:
        raise ArtifactError(f"{path / 'config.json'}: damaged ({type(e).__name__}: {e})") from None
    try:
        state = torch.load(path / "model.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is one message naming it
        raise ArtifactError(f"{path / 'model.pt'}: damaged or truncated ({type(e).__name__}); retrain or copy "
                            f"it again") from None
    try:
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001
        raise ArtifactError(f"{path / 'tokenizer.json'}: damaged ({type(e).__name__}: {e})") from None
    model = build_lm(cfg)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ArtifactError(f"{path / 'model.pt'}: weights do not fit config.json "
                            f"({str(e).splitlines()[0]})") from None
    return LoadedLM(model=model.to(device).eval(), tokenizer=tokenizer, eos_id=int(cfg_file["eos_id"]),
                    max_length=int(cfg_file["max_length"]), meta=dict(cfg_file.get("meta") or {}))
