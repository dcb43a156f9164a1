"""LM presets (TOML data in ``presets/*.toml``) and the variants of ``attnbench run lm --attn``.

A preset file has::

    name, description, source, setting
    [data]                      # suites/lm/data.py DataConfig: corpus, tokenizer, sequence length
    [model]                     # attnbench.models.lm.LMConfig fields shared by both layer kinds
    [model.deltanet]            # the DeltaNet model's own fields (layers, heads, head_dim, expand_v, use_gate)
    [model.gated_deltanet]      # the Gated DeltaNet model's
    [train]                     # attnbench.train.TrainConfig
    [eval]                      # lm-eval after training: tasks, batch size, limit

A variant (``--attn``) is ``LAYER[+MAP][:key=value...]``: ``LAYER`` is ``deltanet`` or ``gated_deltanet``,
``MAP`` any registered feature map (default ``silu``, the published layers); options are either model options
(``qk_norm``, ``key_width``, ``use_short_conv``, ``conv_size``, ``use_gate``, ``chunk_size``) or the map's own
(NaLa's ``lam``, ``tau``, ``sign_split``). Examples: ``deltanet``, ``gated_deltanet+nala``,
``gated_deltanet+nala:qk_norm=k:key_width=match``.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

from attnbench import provenance
from attnbench.errors import AttnbenchError, UnknownNameError
from attnbench.presets import build, check_keys, check_top_level, read_preset
from attnbench.presets import preset_names as _preset_names
from attnbench.train import TrainConfig

from .data import DataConfig

LAYERS = ("deltanet", "gated_deltanet")
VARIANT_MODEL_OPTIONS = ("qk_norm", "key_width", "use_short_conv", "conv_size", "use_gate", "chunk_size")
# LMConfig fields a preset sets per layer kind or for both; the rest come from the variant or the corpus
MODEL_FIELDS = ("hidden", "layers", "heads", "head_dim", "expand_v", "use_gate", "use_short_conv", "conv_size",
                "hidden_ratio", "intermediate_size", "tie_embeddings", "norm_eps", "init_std", "qk_norm", "key_width",
                "chunk_size", "delta_impl")
VARIANT_SYNTAX = "LAYER[+MAP][:key=value...] (e.g. gated_deltanet+nala:qk_norm=k)"


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """lm-eval after training (``attnbench eval lm`` does the same on any checkpoint)."""

    tasks: list[str] = dataclasses.field(default_factory=list)
    batch_size: int = 8
    limit: int = 0          # 0: every document / example
    num_fewshot: int = 0


@dataclasses.dataclass(frozen=True)
class Variant:
    """A model of the table: layer kind, feature map, options (model options and the map's own)."""

    layer: str
    feature_map: str = "silu"
    model_options: tuple = ()       # ((key, value), ...)
    map_options: tuple = ()

    @property
    def label(self) -> str:
        head = self.layer + ("" if self.feature_map == "silu" else f"+{self.feature_map}")
        opts = "".join(f":{k}={v}" for k, v in (*self.model_options, *self.map_options))
        return head + opts

    def options(self) -> dict[str, Any]:
        return {"feature_map": self.feature_map, **dict(self.model_options), **dict(self.map_options)}


@dataclasses.dataclass(frozen=True)
class LMPreset:
    name: str
    data: DataConfig
    train: TrainConfig
    model: dict[str, Any]                 # shared LMConfig fields
    layers: dict[str, dict[str, Any]]     # per layer kind
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    description: str = ""
    source: str = ""
    setting: str = ""
    path: str = ""

    @property
    def key(self) -> str:
        return self.setting or f"lm/{self.name}"

    def model_config(self, variant: Variant, vocab_size: int):
        """The :class:`attnbench.models.lm.LMConfig` of ``variant`` in this preset, for a vocabulary."""
        from attnbench.models.lm import LMConfig

        fields = {**self.model, **self.layers.get(variant.layer, {}), **dict(variant.model_options)}
        return LMConfig(layer=variant.layer, vocab_size=vocab_size, feature_map=variant.feature_map,
                        feature_options=dict(variant.map_options), **fields)

    def identity(self) -> dict[str, Any]:
        return {"data": dataclasses.asdict(self.data), "model": self.model, "layers": self.layers,
                "train": self.train.to_dict()}

    def identity_hash(self) -> str:
        return provenance.config_hash(self.identity())


def preset_names() -> list[str]:
    return _preset_names(__package__)


def load_preset(name_or_path: str | Path) -> LMPreset:
    """An embedded preset (``tiny``, ``340m``) or a ``.toml`` file."""
    data, file = read_preset(__package__, name_or_path, kind="lm")
    check_top_level(data, file, tables=("data", "model", "train", "eval"), required=("name", "data", "model", "train"))
    model = dict(data["model"])
    layers = {k: model.pop(k) for k in LAYERS if k in model}
    check_keys(model, MODEL_FIELDS, f"{file}: [model]")
    for k, table in layers.items():
        check_keys(table, MODEL_FIELDS, f"{file}: [model.{k}]")
    return LMPreset(
        name=data["name"], data=build(DataConfig, data["data"], f"{file}: [data]"),
        train=build(TrainConfig, data["train"], f"{file}: [train]"), model=model, layers=layers,
        eval=build(EvalConfig, data.get("eval", {}), f"{file}: [eval]"),
        description=data.get("description", ""), source=data.get("source", ""), setting=data.get("setting", ""),
        path=file)


def _value(text: str) -> Any:
    from attnbench.spec import _parse_value

    return _parse_value(text)


def parse_variants(text: str) -> list[Variant]:
    """``--attn`` of ``attnbench run lm``: comma-separated variants, each validated (layer, map, option names
    and types) before anything runs."""
    from attnbench.models.lm import LMConfig
    from attnbench.registry import feature_map_names, get_feature_map, options_of

    items = [t.strip() for t in (text or "").split(",")]
    if not any(items):
        raise AttnbenchError(f"--attn: give at least one variant, {VARIANT_SYNTAX}")
    defaults = {f.name: f.default for f in dataclasses.fields(LMConfig)}
    out = []
    for item in items:
        if not item:
            raise AttnbenchError(f"--attn {text!r}: an empty variant between commas")
        head, *opts = item.split(":")
        layer, _, fmap = head.partition("+")
        if layer not in LAYERS:
            close = difflib.get_close_matches(layer, LAYERS + ("gated_deltanet",), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UnknownNameError(f"--attn {item!r}: unknown layer {layer!r}{hint} (LM variants are "
                                   f"{VARIANT_SYNTAX}; layers: {', '.join(LAYERS)})")
        fmap = fmap or "silu"
        if fmap not in feature_map_names():
            close = difflib.get_close_matches(fmap, feature_map_names(), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UnknownNameError(f"--attn {item!r}: unknown feature map {fmap!r}{hint} (registered: "
                                   f"{', '.join(feature_map_names())})")
        map_allowed = options_of(get_feature_map(fmap))
        model_opts, map_opts = {}, {}
        for opt in opts:
            key, eq, raw = opt.partition("=")
            if not eq or not key:
                raise AttnbenchError(f"--attn {item!r}: option {opt!r} is not key=value ({VARIANT_SYNTAX})")
            value = _value(raw)
            if key in VARIANT_MODEL_OPTIONS:
                default = defaults[key]
                if type(default) is bool and not isinstance(value, bool) or (
                        type(default) is int and (isinstance(value, bool) or not isinstance(value, int))):
                    raise AttnbenchError(f"--attn {item!r}: {key}={raw!r} must be a {type(default).__name__}")
                model_opts[key] = value
            elif key in map_allowed:
                default = map_allowed[key]
                if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                    value = float(value)
                if default is not None and not isinstance(value, type(default)):
                    raise AttnbenchError(f"--attn {item!r}: {key}={raw!r} must be a {type(default).__name__} "
                                         f"(default {default!r})")
                map_opts[key] = value
            else:
                known = list(VARIANT_MODEL_OPTIONS) + list(map_allowed)
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise AttnbenchError(f"--attn {item!r}: unknown option {key!r}{hint}; model options: "
                                     f"{', '.join(VARIANT_MODEL_OPTIONS)}; {fmap} options: "
                                     f"{', '.join(map_allowed) or 'none'}")
        out.append(Variant(layer=layer, feature_map=fmap, model_options=tuple(sorted(model_opts.items())),
                           map_options=tuple(sorted(map_opts.items()))))
    labels = [v.label for v in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise AttnbenchError(f"--attn: variant(s) given twice: {', '.join(dup)}")
    return out


__all__ = ["EvalConfig", "LMPreset", "Variant", "load_preset", "parse_variants", "preset_names"]
