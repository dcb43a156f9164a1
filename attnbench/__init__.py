"""attnbench: attention mechanisms behind one ``Attention(q, k, v)`` protocol, driven through the same suites.

The names below are loaded on first use (PEP 562), so ``attnbench --help`` and ``attnbench list`` do not pay for
importing torch.
"""

from attnbench.api import registry
from attnbench.core.errors import AttnbenchError, ShapeError, UnknownNameError, UnsupportedError

__version__ = "0.1.0"

_FROM_REGISTRY = ("build", "build_feature_map", "build_for_length", "describe", "feature_map_names",
                  "get_attention", "names", "register_attention", "register_feature_map")

__all__ = ["AttnbenchError", "ShapeError", "UnknownNameError", "UnsupportedError", *_FROM_REGISTRY]


def __getattr__(name: str):
    if name in _FROM_REGISTRY:
        return getattr(registry, name)
    raise AttributeError(f"module 'attnbench' has no attribute {name!r}")
