"""Stateless math shared by two or more mechanisms, each with a naive reference beside it."""

from .linear_attn import (
    linear_attention,
    linear_attention_bidirectional,
    linear_attention_blocked,
    linear_attention_chunked,
    linear_attention_recurrent,
    linear_attention_reference,
)

__all__ = [
    "linear_attention",
    "linear_attention_bidirectional",
    "linear_attention_blocked",
    "linear_attention_chunked",
    "linear_attention_recurrent",
    "linear_attention_reference",
]
