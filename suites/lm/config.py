"""LM presets (TOML data in ``presets/*.toml``) and the variants of ``attnbench run lm --attn``.

A preset file has::

    name, description, source, setting
    [data]                      # suites/lm/data.py DataConfig: corpus, tokenizer, sequence length
    [model]                     # attnbench.models.lm.LMConfig fields shared by every layer kind
    [model.<layer>]             # each layer kind's own fields (layers, heads, head_dim, expand_v, use_gate, ...)
    [train]                     # attnbench.engine.train.TrainConfig
    [eval]                      # lm-eval after training: tasks, batch size, limit

A variant (``--attn``) is ``LAYER[+NAME][:key=value...]``: :mod:`attnbench.models.variants`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from attnbench.engine import presets
from attnbench.engine.presets import PresetError, check_keys
from attnbench.engine.presets import preset_names as _preset_names
from attnbench.engine.train.config import TrainConfig
from attnbench.models.lm import LMConfig
from attnbench.models.variants import LAYERS, Variant, parse_variant, parse_variants

from .data import DataConfig

# LMConfig fields a preset sets per layer kind or for both; the rest come from the variant or the corpus
MODEL_FIELDS = ("hidden", "layers", "heads", "head_dim", "expand_v", "use_gate", "use_short_conv", "conv_size",
                "hidden_ratio", "intermediate_size", "tie_embeddings", "norm_eps", "init_std", "qk_norm", "key_width",
                "chunk_size", "delta_impl", "rope_theta", "ssm_state", "ssm_expand", "dt_rank")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """lm-eval after training (``attnbench eval lm`` does the same on any checkpoint)."""
    tasks: list[str] = dataclasses.field(default_factory=list)
    batch_size: int = 8
    limit: int = 0          # 0: every document / example
    num_fewshot: int = 0


@dataclasses.dataclass(frozen=True)
class LMPreset(presets.SuitePreset):
    suite = "lm"

    data: DataConfig
    train: TrainConfig
    model: dict[str, Any]                 # shared LMConfig fields
    layers: dict[str, dict[str, Any]] = dataclasses.field(  # per layer kind: the [model.<layer>] tables
        default_factory=dict, metadata={"from_file": False})
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)

    def model_config(self, variant: Variant, vocab_size: int):
        """The :class:`attnbench.models.lm.LMConfig` of ``variant`` in this preset, for a vocabulary."""
        fields = {**self.model, **self.layers.get(variant.layer, {}), **dict(variant.model_options)}
        if variant.map is not None and variant.map.kind == "attention":
            slot = dict(attention=variant.map.name, attention_options=dict(variant.map.options))
        else:
            slot = dict(feature_map=variant.feature_map, feature_options=dict(variant.map_options))
        return LMConfig(layer=variant.layer, vocab_size=vocab_size, **slot, **fields)

    def identity(self) -> dict[str, Any]:
        """What every variant's cells share; a variant's own layer table is hashed into its cells
        (:meth:`layer_identity`), so adding a layer kind to a preset leaves the others' cells as they were."""
        return {"data": dataclasses.asdict(self.data), "model": self.model, "train": self.train.to_dict()}

    def layer_identity(self, layer: str) -> dict[str, Any]:
        return dict(self.layers.get(layer, {}))


def preset_names() -> list[str]:
    return _preset_names(__package__)


def _read_model(data: dict, file: str) -> dict[str, Any]:
    """``[model]``: the shared LMConfig fields, with a ``[model.<layer>]`` table per layer kind."""
    if "model" not in data:
        raise PresetError(f"{file}: top level: missing key 'model'")
    model = dict(data["model"])
    layers = {k: model.pop(k) for k in LAYERS if k in model}
    check_keys(model, MODEL_FIELDS, f"{file}: [model]")
    for k, table in layers.items():
        check_keys(table, MODEL_FIELDS, f"{file}: [model.{k}]")
    return {"model": model, "layers": layers}


def load_preset(name_or_path: str | Path) -> LMPreset:
    """An embedded preset (``tiny``, ``340m``) or a ``.toml`` file."""
    return presets.load(LMPreset, __package__, name_or_path, kind="lm", own=("model",), read=_read_model)


__all__ = ["EvalConfig", "LMPreset", "Variant", "load_preset", "parse_variant", "parse_variants", "preset_names"]
