"""Registries of attentions and feature maps: register, build, names, did-you-mean.

Adding a built-in mechanism is one file in :mod:`attnbench.attention` plus its line in :data:`BUILTIN_ATTENTIONS`
(and :data:`BUILTIN_FEATURE_MAPS` for a feature map); the registry-wide tests then cover it. A built-in's module is
imported on first use, so listing names imports no mechanism (and no torch). Plug-ins register with the
:func:`register_attention` / :func:`register_feature_map` decorators (:mod:`attnbench.api.plugins`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
from typing import Any, Callable, Optional, TypeVar

from attnbench.api.options import check_options
from attnbench.core.errors import AttnbenchError, UnknownNameError

T = TypeVar("T", bound=type)


class PluginError(AttnbenchError):
    """A plug-in that cannot be loaded or registered (one line; the traceback with ``ATTNBENCH_TRACEBACK=1``)."""


@dataclasses.dataclass(frozen=True)
class Plugin:
    """One loaded plug-in: ``source`` is what loads it again in another process (an absolute file path or a module
    name), ``module`` the name it is imported as, ``sha256`` the hash of its source text."""

    source: str
    module: str
    sha256: str
    kind: str  # "file", "module" or "entry point"

    @property
    def short_hash(self) -> str:
        return self.sha256[:12]

    def describe(self) -> str:
        return f"{self.source} (sha256 {self.short_hash})"


_BY_MODULE: dict[str, Plugin] = {}         # module name -> plug-in (classes find their plug-in by __module__)
_LOADING: list[Plugin] = []                # the plug-ins being imported now (innermost last)
_REGISTERED: dict[tuple[str, str], Plugin] = {}   # (kind, name) -> the plug-in that registered it


# --- where a registered class comes from: the plug-in bookkeeping --------------------------------------------------
def plugin_of_class(cls: type) -> Optional[Plugin]:
    """The plug-in a class comes from: the one being imported now, or the one whose module defines it."""
    if _LOADING:
        return _LOADING[-1]
    mod = getattr(cls, "__module__", "") or ""
    while mod:
        if mod in _BY_MODULE:
            return _BY_MODULE[mod]
        mod = mod.rpartition(".")[0]
    return None


def source_of(cls: type, kind: str = "", name: str = "") -> str:
    """Where a registered class comes from, for messages: a plug-in's source, else the built-in's module."""
    p = _REGISTERED.get((kind, name)) if kind else None
    if p is None:
        p = plugin_of_class(cls) if not _is_builtin(cls) else None
    if p is not None:
        return f"plug-in {p.source}"
    mod = getattr(cls, "__module__", "?")
    return f"built-in {mod}" if _is_builtin(cls) else f"module {mod}"


def _is_builtin(cls: type) -> bool:
    mod = getattr(cls, "__module__", "") or ""
    return mod == "attnbench" or mod.startswith("attnbench.")


def note_registered(kind: str, name: str, cls: type) -> None:
    p = None if _is_builtin(cls) and not _LOADING else plugin_of_class(cls)
    if p is not None:
        _REGISTERED[(kind, name)] = p


def plugin_for(kind: str, name: str) -> Optional[Plugin]:
    """The plug-in that registered the attention or feature map ``name`` (None: a built-in)."""
    return _REGISTERED.get((kind, name))


# --- the registries ---------------------------------------------------------------------------------------------

# name -> "module:class" of every built-in, imported on first use.
BUILTIN_ATTENTIONS = {
    "cosformer": "attnbench.attention.cosformer:CosformerAttention",
    "flatten": "attnbench.attention.flatten:FlattenAttention",
    "hedgehog": "attnbench.attention.hedgehog:HedgehogAttention",
    "laplacian": "attnbench.attention.laplacian:LaplacianAttention",
    "linear": "attnbench.attention.linear:LinearAttention",
    "linformer": "attnbench.attention.linformer:LinformerAttention",
    "mirrorla": "attnbench.attention.mirrorla:MirrorLAAttention",
    "nala": "attnbench.attention.nala:NaLaAttention",
    "nystromformer": "attnbench.attention.nystromformer:NystromformerAttention",
    "performer": "attnbench.attention.performer:PerformerAttention",
    "polaformer": "attnbench.attention.polaformer:PolaAttention",
    "relu_linear": "attnbench.attention.relu_linear:ReluLinearAttention",
    "relu_quadratic": "attnbench.attention.relu_quadratic:ReluQuadraticAttention",
    "skyformer": "attnbench.attention.skyformer:SkyformerAttention",
    "softmax": "attnbench.attention.softmax:SoftmaxAttention",
    "stella": "attnbench.attention.stella:SteLLAAttention",
}
BUILTIN_FEATURE_MAPS = {
    "elu": "attnbench.attention.linear:EluFeatureMap",
    "focused": "attnbench.attention.flatten:FocusedFeatureMap",
    "hedgehog": "attnbench.attention.hedgehog:HedgehogFeatureMap",
    "mirrorla": "attnbench.attention.mirrorla:MirrorFeatureMap",
    "nala": "attnbench.attention.nala:NaLaFeatureMap",
    "performer": "attnbench.attention.performer:PerformerFeatureMap",
    "relu": "attnbench.attention.relu_linear:ReluFeatureMap",
    "silu": "attnbench.attention.silu:SiluFeatureMap",
}

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
        raise PluginError(f"{getattr(cls, '__name__', cls)} ({source_of(cls)}) must set a class "
                                  f"attribute `name` (a non-empty str) to be registered as a {kind}")
    if not _is_builtin(cls) or _LOADING:
        _check_protocol(kind, name, cls)
    old = table.get(name)
    if old is not None and old is not cls and not _same_definition(old, cls):
        raise PluginError(f"{kind} {name!r} of {source_of(cls)} clashes with the {kind} of the same "
                                  f"name from {source_of(old, kind, name)}; rename one of them")
    table[name] = cls
    note_registered(kind, name, cls)
    return cls


def _same_definition(old: type, new: type) -> bool:
    """The same class defined again by the same source (a module imported twice): not a clash."""
    return (old.__qualname__ == new.__qualname__ and old.__module__ == new.__module__)


def _check_protocol(kind: str, name: str, cls: type) -> None:
    """A plug-in class must meet the protocol: say what is missing, in one line."""
    from attnbench.attention.base import Attention, FeatureMap

    where = f"{kind} {name!r} ({cls.__qualname__ if isinstance(cls, type) else cls!r}, {source_of(cls)})"
    base = Attention if kind == "attention" else FeatureMap
    if not isinstance(cls, type) or not issubclass(cls, base):
        raise PluginError(f"{where} must be a class deriving from attnbench.attention.base.{base.__name__}")
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
        raise PluginError(f"{where} does not meet the protocol: missing {'; '.join(missing)}")


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
    from attnbench.attention.base import FeatureMapAttention

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
        _LOADING.append(plugin)
        try:
            _register(_ATTENTIONS, "attention", cls)
        finally:
            _LOADING.pop()


_LOADING_ENV = False


def _load_builtin(kind: str, name: str) -> None:
    """Import the built-in ``name`` of ``kind`` and register its class (once)."""
    table, builtins = ((_ATTENTIONS, BUILTIN_ATTENTIONS) if kind == "attention"
                       else (_FEATURE_MAPS, BUILTIN_FEATURE_MAPS))
    if name not in table:
        module, _, qualname = builtins[name].partition(":")
        _register(table, kind, getattr(importlib.import_module(module), qualname))


def _ensure_builtins() -> None:
    """Every built-in imported and registered (a plug-in's name is checked against them all)."""
    for name in BUILTIN_ATTENTIONS:
        _load_builtin("attention", name)
    for name in BUILTIN_FEATURE_MAPS:
        _load_builtin("feature map", name)


def _ensure_loaded() -> None:
    """The built-ins, then the plug-ins of ``ATTNBENCH_PLUGINS`` and the installed entry points."""
    _ensure_builtins()
    _ensure_plugins()


# Called before every look-up: :mod:`attnbench.api.plugins` installs the loader of ``ATTNBENCH_PLUGINS`` and the
# installed entry points here, so every process that looks a name up sees the same mechanisms (the registry does
# not import the plug-in loader, which imports it).
LOOKUP_HOOKS: list[Callable[[], None]] = []


def _ensure_plugins() -> None:
    global _LOADING_ENV
    if _LOADING_ENV:  # a plug-in that looks names up while it loads
        return
    _LOADING_ENV = True
    try:
        for hook in LOOKUP_HOOKS:
            hook()
    finally:
        _LOADING_ENV = False


def names() -> list[str]:
    """Registered attention names (built-ins and plug-ins), sorted; imports no built-in."""
    _ensure_plugins()
    return sorted(set(BUILTIN_ATTENTIONS) | set(_ATTENTIONS))


def feature_map_names() -> list[str]:
    """Registered feature-map names (built-ins and plug-ins), sorted; imports no built-in."""
    _ensure_plugins()
    return sorted(set(BUILTIN_FEATURE_MAPS) | set(_FEATURE_MAPS))


def _get(kind: str, name: str) -> type:
    _ensure_plugins()
    table, builtins = ((_ATTENTIONS, BUILTIN_ATTENTIONS) if kind == "attention"
                       else (_FEATURE_MAPS, BUILTIN_FEATURE_MAPS))
    if name not in table and name in builtins:
        _load_builtin(kind, name)
    if name not in table:
        raise _unknown(kind, name, {**dict.fromkeys(builtins), **table})
    return table[name]


def get_attention(name: str) -> type:
    return _get("attention", name)


def get_feature_map(name: str) -> type:
    return _get("feature map", name)


def options_of(cls: type) -> dict[str, Any]:
    """The build options a mechanism declares (keyword arguments beyond the protocol), with defaults."""
    out: dict[str, Any] = {}
    for p in inspect.signature(cls.__init__).parameters.values():
        if p.name == "self" or p.name in PROTOCOL_ARGS or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        out[p.name] = p.default if p.default is not inspect.Parameter.empty else None
    return out


def _check_options(kind: str, name: str, cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` validated by the one validator (:func:`attnbench.api.options.check_options`): names and value
    types."""
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
