"""Registries of attentions and feature maps: register, build, names, did-you-mean.

Adding a mechanism is one file plus its ``@register_attention`` line; the registry-wide tests then cover it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any, Callable, Optional, TypeVar

from .errors import AttnbenchError, UnknownNameError

T = TypeVar("T", bound=type)

_ATTENTIONS: dict[str, type] = {}
_FEATURE_MAPS: dict[str, type] = {}
# Arguments every attention takes; everything else must be an option the mechanism declares.
PROTOCOL_ARGS = ("heads", "head_dim", "causal", "impl")


def _unknown(kind: str, name: str, known: dict[str, type]) -> UnknownNameError:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return UnknownNameError(f"unknown {kind} {name!r}{hint} (registered: {', '.join(sorted(known))})")


def _register(table: dict[str, type], kind: str, cls: T) -> T:
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} must set a class attribute `name` to be registered as a {kind}")
    if name in table and table[name] is not cls:
        raise ValueError(f"{kind} {name!r} is already registered by {table[name].__module__}")
    table[name] = cls
    return cls


def register_attention(cls: T) -> T:
    """Class decorator: register an :class:`attnbench.attention.base.Attention` subclass under ``cls.name``."""
    return _register(_ATTENTIONS, "attention", cls)


def register_feature_map(cls: T) -> T:
    """Class decorator: register a :class:`attnbench.attention.feature_map.FeatureMap` under ``cls.name``."""
    return _register(_FEATURE_MAPS, "feature map", cls)


def _ensure_loaded() -> None:
    from . import attention  # noqa: F401  (importing the package registers every mechanism)


def names() -> list[str]:
    """Registered attention names, sorted."""
    _ensure_loaded()
    return sorted(_ATTENTIONS)


def feature_map_names() -> list[str]:
    """Registered feature-map names, sorted."""
    _ensure_loaded()
    return sorted(_FEATURE_MAPS)


def get_attention(name: str) -> type:
    _ensure_loaded()
    if name not in _ATTENTIONS:
        raise _unknown("attention", name, _ATTENTIONS)
    return _ATTENTIONS[name]


def get_feature_map(name: str) -> type:
    _ensure_loaded()
    if name not in _FEATURE_MAPS:
        raise _unknown("feature map", name, _FEATURE_MAPS)
    return _FEATURE_MAPS[name]


def options_of(cls: type) -> dict[str, Any]:
    """The build options a mechanism declares (keyword arguments beyond the protocol), with defaults."""
    out: dict[str, Any] = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name == "self" or p.name in PROTOCOL_ARGS or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        out[p.name] = p.default if p.default is not inspect.Parameter.empty else None
    return out


def _check_options(kind: str, name: str, cls: type, options: dict[str, Any]) -> None:
    allowed = options_of(cls)
    bad = [o for o in options if o not in allowed]
    if bad:
        hints = []
        for o in bad:
            close = difflib.get_close_matches(o, list(allowed), n=1, cutoff=0.5)
            hints.append(f"{o!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        accepted = ", ".join(f"{k}={v!r}" for k, v in allowed.items()) or "none"
        raise AttnbenchError(f"{kind} {name!r} got unknown option(s) {', '.join(hints)}; it accepts: {accepted}")


def build(name: str, *, heads: int, head_dim: int, causal: bool = False, impl: str = "auto", **options: Any):
    """Build the attention ``name`` for ``heads`` heads of size ``head_dim``.

    ``forward(q, k, v)`` then takes ``[B, H, N, D]`` tensors. ``impl`` is ``"auto"`` (resolved from the input's
    device, see ``Attention.resolve_impl``) or one of the mechanism's ``impls``. Unknown names fail with the
    closest matches; unknown options, bad sizes, an unknown impl and a causal request to a bidirectional-only
    mechanism fail with a message that names the argument.
    """
    cls = get_attention(name)
    _check_options("attention", name, cls, options)
    return cls(heads=heads, head_dim=head_dim, causal=causal, impl=impl, **options)


def build_for_length(name: str, *, seq_len: int, heads: int, head_dim: int, causal: bool = False,
                     impl: str = "auto", **options: Any):
    """:func:`build` for inputs of length ``seq_len``: adds the options the mechanism derives from the length
    (``Attention.shape_options``, e.g. Linformer's ``seq_len``) unless given explicitly."""
    cls = get_attention(name)
    merged = {**cls.shape_options(seq_len), **options}
    return build(name, heads=heads, head_dim=head_dim, causal=causal, impl=impl, **merged)


def build_feature_map(name: str, *, heads: int, head_dim: int, causal: bool = False, **options: Any):
    """Build the feature map ``name``; ``phi_q(q)`` and ``phi_k(k)`` map ``[B, H, N, D] -> [B, H, N, M]``."""
    cls = get_feature_map(name)
    _check_options("feature map", name, cls, options)
    return cls(heads=heads, head_dim=head_dim, causal=causal, **options)


def describe(name: str) -> dict[str, Any]:
    """What ``attnbench list`` shows for one attention."""
    cls = get_attention(name)
    return {
        "name": name,
        "paper": cls.paper,
        "bidirectional": cls.bidirectional,
        "causal": cls.causal_form,
        "impls": tuple(cls.impls),
        "options": options_of(cls),
    }


# --- suites (plug-ins) ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Suite:
    """What a suite plugs into the core. The core (CLI, report, store) reaches a suite only through this record.

    ``run``: the typer command function of ``attnbench run <name>``; ``evaluate``: that of ``attnbench eval
    <name>`` (scoring a trained artifact, e.g. a language model by lm-eval); ``view``: an :class:`attnbench.tables.View`
    (``table`` / ``plot`` / markdown export; None: the generic view); ``data``: ``attnbench data <command>``
    functions; ``ingest``: ``(path, store) -> message | None`` for a results file format of the suite's own (None:
    not that format), tried by ``attnbench ingest`` after the store's own formats.
    A suite's ``__init__`` must stay cheap to import (no torch): every CLI invocation discovers all suites.
    """

    name: str
    help: str
    run: Optional[Callable[..., Any]] = None
    evaluate: Optional[Callable[..., Any]] = None
    view: Any = None
    data: dict[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    ingest: Optional[Callable[..., Optional[str]]] = None


_SUITES: dict[str, Suite] = {}
_SUITES_DISCOVERED = False


def register_suite(suite: Suite) -> Suite:
    """Register a suite (called from the suite package's ``__init__``)."""
    if suite.name in _SUITES and _SUITES[suite.name] != suite:
        raise ValueError(f"suite {suite.name!r} is already registered")
    _SUITES[suite.name] = suite
    return suite


def _discover_suites() -> None:
    """Import every sub-package of ``attnbench.suites``: each registers itself. The core names no suite."""
    global _SUITES_DISCOVERED
    if _SUITES_DISCOVERED:
        return
    _SUITES_DISCOVERED = True
    import importlib
    import pkgutil

    try:
        pkg = importlib.import_module("attnbench.suites")
    except ImportError:  # pragma: no cover - an install without suites
        return
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.ispkg:
            importlib.import_module(f"attnbench.suites.{info.name}")


def suite_names() -> list[str]:
    _discover_suites()
    return sorted(_SUITES)


def get_suite(name: str) -> Suite:
    """The registered suite ``name``; an unknown name fails with the closest registered names."""
    _discover_suites()
    if name not in _SUITES:
        raise _unknown("suite", name, _SUITES)  # type: ignore[arg-type]
    return _SUITES[name]
