"""The token mixers a language model can hold, named as ``LAYER[+NAME][:key=value...]`` (the LM suite's ``--attn``;
the recall suite's too, where a registered attention name alone stands for a Transformer with it).

``LAYER`` is one of NaLaFormer's Table 5 rows: ``transformer``, ``retnet``, ``gla``, ``mamba``, ``deltanet``,
``gated_deltanet``. ``NAME`` fills the layer's slot: for the delta rules, GLA and RetNet a registered q/k feature map
(default ``silu`` for the delta rules, none for GLA and RetNet, as the published layers); for the Transformer a
causal attention mechanism of the registry (default ``softmax``: ``transformer+nala`` is a Transformer++ with NaLa
attention); Mamba has none. Options are either model options (``qk_norm``, ``key_width``, ``use_short_conv``,
``conv_size``, ``use_gate``, ``chunk_size``) or the slot's own (NaLa's ``lam``, ``tau``, ``sign_split``). Examples:
``deltanet``, ``gated_deltanet+nala``, ``gated_deltanet+nala:qk_norm=k:key_width=match``, ``gla``,
``transformer+polaformer``.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Optional

from attnbench.api.options import check_options
from attnbench.api.registry import get_attention, get_feature_map, options_of
from attnbench.api.spec import Spec, check_distinct, split_spec
from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.models.lm import LAYER_KINDS, LMConfig

LAYERS = LAYER_KINDS
#: what fills each layer's slot by default (the published layer), and what kind of registered thing it is
SLOT_DEFAULT = {"transformer": "softmax", "retnet": None, "gla": None, "mamba": None, "deltanet": "silu",
                "gated_deltanet": "silu"}
VARIANT_MODEL_OPTIONS = ("qk_norm", "key_width", "use_short_conv", "conv_size", "use_gate", "chunk_size")
VARIANT_SYNTAX = "LAYER[+NAME][:key=value...] (e.g. gated_deltanet+nala:qk_norm=k, transformer+nala)"


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


__all__ = ["LAYERS", "SLOT_DEFAULT", "VARIANT_MODEL_OPTIONS", "VARIANT_SYNTAX", "Variant", "parse_variant",
           "parse_variants"]
