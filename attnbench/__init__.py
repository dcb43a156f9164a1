"""attnbench: attention mechanisms behind one ``Attention(q, k, v)`` protocol, driven through the same suites."""

from .protocol import AttnbenchError, ShapeError, UnknownNameError, UnsupportedError
from .registry import (
    build,
    build_feature_map,
    build_for_length,
    describe,
    feature_map_names,
    get_attention,
    names,
    register_attention,
    register_feature_map,
)

__version__ = "0.1.0"

__all__ = [
    "AttnbenchError",
    "ShapeError",
    "UnknownNameError",
    "UnsupportedError",
    "build",
    "build_feature_map",
    "build_for_length",
    "describe",
    "feature_map_names",
    "get_attention",
    "names",
    "register_attention",
    "register_feature_map",
]
