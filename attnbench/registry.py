"""Registries of attentions and feature maps: register, build, names, did-you-mean.

Adding a mechanism is one file plus its ``@register_attention`` line; the registry-wide tests then cover it.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any, Callable, Optional, TypeVar

from .errors import UnknownNameError

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
    from . import plugins

    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise plugins.PluginError(f"{getattr(cls, '__name__', cls)} ({plugins.source_of(cls)}) must set a class "
                                  f"attribute `name` (a non-empty str) to be registered as a {kind}")
    if not plugins._is_builtin(cls) or plugins._LOADING:
        _check_protocol(kind, name, cls)
    old = table.get(name)
    if old is not None and old is not cls and not _same_definition(old, cls):
        raise plugins.PluginError(f"{kind} {name!r} of {plugins.source_of(cls)} clashes with the {kind} of the same "
                                  f"name from {plugins.source_of(old, kind, name)}; rename one of them")
    table[name] = cls
    plugins.note_registered(kind, name, cls)
    return cls


def _same_definition(old: type, new: type) -> bool:
    """The same class defined again by the same source (a module imported twice): not a clash."""
    return (old.__qualname__ == new.__qualname__ and old.__module__ == new.__module__)


def _check_protocol(kind: str, name: str, cls: type) -> None:
    """A plug-in class must meet the protocol: say what is missing, in one line."""
    from . import plugins
    from .attention.base import Attention, FeatureMap

    where = f"{kind} {name!r} ({cls.__qualname__ if isinstance(cls, type) else cls!r}, {plugins.source_of(cls)})"
    base = Attention if kind == "attention" else FeatureMap
    if not isinstance(cls, type) or not issubclass(cls, base):
        raise plugins.PluginError(f"{where} must be a class deriving from attnbench.attention.base.{base.__name__}")
    missing: list[str] = []
    if kind == "attention":
        impls = tuple(getattr(cls, "impls", ()) or ())
        if "reference" not in impls:
            missing.append("'reference' in impls (the paper's plain math, the tests' ground truth)")
        for impl in impls:
            if not callable(getattr(cls, f"forward_{impl}", None)):
                missing.append(f"method forward_{impl}(q, k, v) for impl {impl!r}")
        if getattr(cls, "cpu_impl", None) not in impls:
            missing.append(f"cpu_impl (what impl='auto' runs on a CPU) must be one of {list(impls)}, "
                           f"got {getattr(cls, 'cpu_impl', None)!r}")
        if not (getattr(cls, "bidirectional", False) or getattr(cls, "causal_form", False)):
            missing.append("a form: bidirectional or causal_form must be True")
        params = inspect.signature(cls.__init__).parameters
        has_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
        absent = [a for a in PROTOCOL_ARGS if a not in params and not has_kw]
        if absent:
            missing.append(f"__init__ keyword arguments {', '.join(absent)}")
    else:
        symmetric = cls.phi is not FeatureMap.phi
        sided = cls.phi_q is not FeatureMap.phi_q and cls.phi_k is not FeatureMap.phi_k
        if not (symmetric or sided):
            missing.append("method phi(x) (or both phi_q(q) and phi_k(k))")
        params = inspect.signature(cls.__init__).parameters
        has_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
        absent = [a for a in ("heads", "head_dim", "causal") if a not in params and not has_kw]
        if absent:
            missing.append(f"__init__ keyword arguments {', '.join(absent)}")
    if missing:
        raise plugins.PluginError(f"{where} does not meet the protocol: missing {'; '.join(missing)}")


def _unregister(kind: str, name: str) -> None:
    (_ATTENTIONS if kind == "attention" else _FEATURE_MAPS).pop(name, None)


def _entries():
    """``(kind, name, class)`` of everything registered."""
    return [("attention", n, c) for n, c in _ATTENTIONS.items()] + \
           [("feature map", n, c) for n, c in _FEATURE_MAPS.items()]


def register_attention(cls: T) -> T:
    """Class decorator: register an :class:`attnbench.attention.base.Attention` subclass under ``cls.name``."""
    return _register(_ATTENTIONS, "attention", cls)


def register_feature_map(cls: T) -> T:
    """Class decorator: register a :class:`attnbench.attention.feature_map.FeatureMap` under ``cls.name``.

    A plug-in's feature map without an attention of the same name becomes one (:func:`_derive_feature_map_attentions`)."""
    return _register(_FEATURE_MAPS, "feature map", cls)


def _derive_feature_map_attentions(map_names: list[str], plugin) -> None:
    """A plug-in's feature map ``m`` with no attention of its name becomes the attention ``m``: the map plus the
    shared linear-attention op (:class:`~attnbench.attention.base.FeatureMapAttention`: bidirectional, causal,
    blocked, recomputing backward), with the map's options as its options."""
    from . import plugins
    from .attention.base import FeatureMapAttention

    for name in map_names:
        if name in _ATTENTIONS:
            continue
        fmap = _FEATURE_MAPS[name]
        map_opts = options_of(fmap)

        def __init__(self, *, heads, head_dim, causal=False, impl="auto", **options):
            FeatureMapAttention.__init__(self, heads=heads, head_dim=head_dim, causal=causal, impl=impl)
            self.feature_map = self.make_feature_map(**options)

        params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        params += [inspect.Parameter(a, inspect.Parameter.KEYWORD_ONLY, default=d) for a, d in
                   (("heads", inspect.Parameter.empty), ("head_dim", inspect.Parameter.empty), ("causal", False),
                    ("impl", "auto"))]
        params += [inspect.Parameter(o, inspect.Parameter.KEYWORD_ONLY, default=d) for o, d in map_opts.items()]
        __init__.__signature__ = inspect.Signature(params)  # options_of reads the map's options from here
        cls = type(f"{fmap.__name__}Attention", (FeatureMapAttention,), {
            "__init__": __init__, "__module__": fmap.__module__, "__qualname__": f"{fmap.__qualname__}Attention",
            "__doc__": f"Linear attention with the plug-in feature map {name!r} (Katharopoulos et al. 2020, Eq. 6; "
                       f"causal, Eq. 9).",
            "name": name, "paper": getattr(fmap, "paper", ""), "feature_map_cls": fmap})
        plugins._LOADING.append(plugin)
        try:
            _register(_ATTENTIONS, "attention", cls)
        finally:
            plugins._LOADING.pop()


_BUILTINS_LOADED = False
_LOADING_ENV = False


def _ensure_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        from . import attention  # noqa: F401  (importing the package registers every mechanism)

        _BUILTINS_LOADED = True


def _ensure_loaded() -> None:
    """The built-ins, then the plug-ins of ``ATTNBENCH_PLUGINS`` and the installed entry points
    (:mod:`attnbench.plugins`): every process that looks a name up sees the same mechanisms."""
    global _LOADING_ENV
    _ensure_builtins()
    if _LOADING_ENV:  # a plug-in that looks names up while it loads
        return
    from . import plugins

    _LOADING_ENV = True
    try:
        plugins._load_env()
    finally:
        _LOADING_ENV = False


def names() -> list[str]:
    """Registered attention names (built-ins and plug-ins), sorted."""
    _ensure_loaded()
    return sorted(_ATTENTIONS)


def feature_map_names() -> list[str]:
    """Registered feature-map names (built-ins and plug-ins), sorted."""
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


def _check_options(kind: str, name: str, cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` validated by the one validator (:func:`attnbench.spec.check_options`): names and value types."""
    from .spec import check_options

    return check_options(f"{kind} {name!r}", options, options_of(cls))


def build(name: str, *, heads: int, head_dim: int, causal: bool = False, impl: str = "auto", **options: Any):
    """Build the attention ``name`` for ``heads`` heads of size ``head_dim``.

    ``forward(q, k, v)`` then takes ``[B, H, N, D]`` tensors. ``impl`` is ``"auto"`` (resolved from the input's
    device, see ``Attention.resolve_impl``) or one of the mechanism's ``impls``. Unknown names fail with the
    closest matches; unknown options, bad sizes, an unknown impl and a causal request to a bidirectional-only
    mechanism fail with a message that names the argument.
    """
    cls = get_attention(name)
    options = _check_options("attention", name, cls, options)
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
    options = _check_options("feature map", name, cls, options)
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
    not that format), tried by ``attnbench ingest`` after the store's own formats; ``load_preset``: ``(name or
    .toml path) -> preset``, for another suite's preset that names one of this suite's (``vision = "tiny"``, see
    :func:`attnbench.presets.load`), so that suite need not import this one.
    A suite's ``__init__`` must stay cheap to import (no torch): every CLI invocation discovers all suites.
    """

    name: str
    help: str
    run: Optional[Callable[..., Any]] = None
    evaluate: Optional[Callable[..., Any]] = None
    view: Any = None
    data: dict[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    ingest: Optional[Callable[..., Optional[str]]] = None
    load_preset: Optional[Callable[[str], Any]] = None


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
