"""Stateless math shared by two or more mechanisms (or suites), each with a naive reference beside it."""

from attnbench.ops.delta import delta_rule, delta_rule_chunked, delta_rule_recurrent, resolve_delta_impl
from attnbench.ops.linear_attn import (
    linear_attention,
    linear_attention_bidirectional,
    linear_attention_blocked,
    linear_attention_chunked,
    linear_attention_recomputed,
    linear_attention_recurrent,
    linear_attention_reference,
)
from attnbench.ops.nala_map import nala_feature_map_blocked

__all__ = [
    "delta_rule",
    "delta_rule_chunked",
    "delta_rule_recurrent",
    "resolve_delta_impl",
    "linear_attention",
    "linear_attention_bidirectional",
    "linear_attention_blocked",
    "linear_attention_chunked",
    "linear_attention_recomputed",
    "linear_attention_recurrent",
    "linear_attention_reference",
    "nala_feature_map_blocked",
]
