"""LM presets (TOML data in ``presets/*.toml``) and the variants of ``attnbench run lm --attn``.

A preset file has::

    name, description, source, setting
    [data]                      # suites/lm/data.py DataConfig: corpus, tokenizer, sequence length
    [model]                     # attnbench.models.lm.LMConfig fields shared by every layer kind
    [model.<layer>]             # each layer kind's own fields (layers, heads, head_dim, expand_v, use_gate, ...)
    [train]                     # attnbench.engine.train.TrainConfig
    [eval]                      # lm-eval after training: tasks, batch size, limit

A variant (``--attn``) is ``LAYER[+NAME][:key=value...]``. ``LAYER`` is one of NaLaFormer's Table 5 rows:
``transformer``, ``retnet``, ``gla``, ``mamba``, ``deltanet``, ``gated_deltanet``. ``NAME`` fills the layer's
slot: for the delta rules, GLA and RetNet a registered q/k feature map (default ``silu`` for the delta rules, none
for GLA and RetNet, as the published layers); for the Transformer a causal attention mechanism of the registry
(default ``softmax``: ``transformer+nala`` is a Transformer++ with NaLa attention); Mamba has none. Options are
either model options (``qk_norm``, ``key_width``, ``use_short_conv``, ``conv_size``, ``use_gate``, ``chunk_size``)
or the slot's own (NaLa's ``lam``, ``tau``, ``sign_split``). Examples: ``deltanet``, ``gated_deltanet+nala``,
``gated_deltanet+nala:qk_norm=k:key_width=match``, ``gla``, ``transformer+polaformer``.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Optional

from attnbench.api.options import check_options
from attnbench.api.registry import get_attention, get_feature_map, options_of
from attnbench.api.spec import Spec, check_distinct, split_spec
from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.engine import presets
from attnbench.engine.presets import PresetError, check_keys
from attnbench.engine.presets import preset_names as _preset_names
from attnbench.engine.train.config import TrainConfig
from attnbench.models.lm import LAYER_KINDS, LMConfig

from .data import DataConfig

LAYERS = LAYER_KINDS
#: what fills each layer's slot by default (the published layer), and what kind of registered thing it is
SLOT_DEFAULT = {"transformer": "softmax", "retnet": None, "gla": None, "mamba": None, "deltanet": "silu",
                "gated_deltanet": "silu"}
VARIANT_MODEL_OPTIONS = ("qk_norm", "key_width", "use_short_conv", "conv_size", "use_gate", "chunk_size")
# LMConfig fields a preset sets per layer kind or for both; the rest come from the variant or the corpus
MODEL_FIELDS = ("hidden", "layers", "heads", "head_dim", "expand_v", "use_gate", "use_short_conv", "conv_size",
                "hidden_ratio", "intermediate_size", "tie_embeddings", "norm_eps", "init_std", "qk_norm", "key_width",
                "chunk_size", "delta_impl", "rope_theta", "ssm_state", "ssm_expand", "dt_rank")
VARIANT_SYNTAX = "LAYER[+NAME][:key=value...] (e.g. gated_deltanet+nala:qk_norm=k, transformer+nala)"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """lm-eval after training (``attnbench eval lm`` does the same on any checkpoint)."""
    tasks: list[str] = dataclasses.field(default_factory=list)
    batch_size: int = 8
    limit: int = 0          # 0: every document / example
    num_fewshot: int = 0


@dataclasses.dataclass(frozen=True)
class Variant:
    """A model of the table: the layer kind with its model options (``LMConfig`` fields) and what fills its slot
    (:data:`SLOT_DEFAULT`), a :class:`attnbench.api.spec.Spec` (a feature map, or the Transformer's attention)
    with its own options, or None (GLA and RetNet without a map; Mamba)."""

    layer: str
    map: Optional[Spec] = dataclasses.field(default_factory=lambda: Spec("silu", {}, "feature map"))
    model_options: tuple = ()       # ((key, value), ...) sorted by key

    @property
    def feature_map(self) -> Optional[str]:
        return None if self.map is None else self.map.name

    @property
    def map_options(self) -> tuple:
        return () if self.map is None else tuple(self.map.options.items())

    @property
    def label(self) -> str:
        """``LAYER[+NAME][:model options][:slot options]``, each group sorted (parses back to this variant)."""
        head = self.layer + ("" if self.feature_map == SLOT_DEFAULT[self.layer] else f"+{self.feature_map}")
        opts = "".join(f":{k}={v}" for k, v in (*self.model_options, *self.map_options))
        return head + opts

    def options(self) -> dict[str, Any]:
        if self.map is None:
            return dict(self.model_options)
        key = "attention" if self.map.kind == "attention" else "feature_map"
        return {key: self.map.name, **dict(self.model_options), **dict(self.map.options)}


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


def parse_variant(text: str) -> Variant:
    """One ``LAYER[+MAP][:key=value...]`` (the grammar of :func:`attnbench.api.spec.split_spec`): each option goes to
    the model when it is one of ``VARIANT_MODEL_OPTIONS``, else to the map; names and value types are checked by
    the one validator (:func:`attnbench.api.options.check_options`) against ``LMConfig``'s and the map's defaults."""

    head, opts = split_spec(text, what="--attn", syntax=VARIANT_SYNTAX)
    layer, plus, name = head.partition("+")
    if layer not in LAYERS:
        close = difflib.get_close_matches(layer, LAYERS, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UnknownNameError(f"--attn {text!r}: unknown layer {layer!r}{hint} (LM variants are "
                               f"{VARIANT_SYNTAX}; layers: {', '.join(LAYERS)})")
    kind = "attention" if layer == "transformer" else "feature map"
    if plus and layer == "mamba":
        raise AttnbenchError(f"--attn {text!r}: mamba has no q/k slot for {name!r} (its mixer is the selective scan)")
    name = name or SLOT_DEFAULT[layer]
    slot_allowed: dict[str, Any] = {}
    if name:
        try:
            cls = get_attention(name) if kind == "attention" else get_feature_map(name)
        except UnknownNameError as e:
            raise UnknownNameError(f"--attn {text!r}: {e}") from None
        if kind == "attention" and not cls.causal_form:
            raise AttnbenchError(f"--attn {text!r}: {name} has no causal form (bidirectional only), so it cannot be "
                                 f"a language model's attention; `attnbench list` shows the causal ones")
        slot_allowed = options_of(cls)
    defaults = {f.name: f.default for f in dataclasses.fields(LMConfig)}
    model_allowed = {k: defaults[k] for k in VARIANT_MODEL_OPTIONS}
    opts = check_options(f"--attn {text!r}", opts, {**slot_allowed, **model_allowed})  # a model option wins a clash
    model = {k: v for k, v in opts.items() if k in model_allowed}
    slot = Spec.make(name, {k: v for k, v in opts.items() if k not in model_allowed}, kind=kind) if name else None
    return Variant(layer=layer, map=slot, model_options=tuple(sorted(model.items())))


def parse_variants(text: str) -> list[Variant]:
    """``--attn`` of ``attnbench run lm``: comma-separated variants, each validated (layer, map, option names
    and types) before anything runs."""
    items = [t.strip() for t in (text or "").split(",")]
    if not any(items):
        raise AttnbenchError(f"--attn: give at least one variant, {VARIANT_SYNTAX}")
    if not all(items):
        raise AttnbenchError(f"--attn {text!r}: an empty variant between commas")
    out = [parse_variant(item) for item in items]
    check_distinct([v.label for v in out], "--attn: variant(s) given twice: {}")
    return out


__all__ = ["EvalConfig", "LMPreset", "Variant", "load_preset", "parse_variant", "parse_variants", "preset_names"]
