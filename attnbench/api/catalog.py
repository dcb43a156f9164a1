"""What ``attnbench list`` shows for each mechanism, read from the built-ins' source text without importing them.

Importing the mechanisms imports torch (seconds), so the built-ins are read statically: their module is found
from :data:`attnbench.api.registry.BUILTIN_ATTENTIONS`, parsed with ``ast``, and the class attributes ``list``
shows (``paper``, ``bidirectional``, ``causal_form``, ``impls``) and the keyword options of ``__init__`` are
resolved through the class's bases, as Python would. Values must be literals or module-level names bound to
literals; a built-in that uses anything else is described from the live registry instead (``tests/test_cli.py``
holds the static reading equal to the live one for every built-in). Plug-ins are always described live.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import operator
from functools import lru_cache
from pathlib import Path
from typing import Any

from attnbench.api import plugins, registry

LISTED = {"paper": "paper", "bidirectional": "bidirectional", "causal": "causal_form", "impls": "impls"}


class _NotStatic(Exception):
    """A value the static reader cannot resolve (then the mechanism is described live)."""


def live(plugins_only: bool = False) -> list[dict[str, Any]]:
    """Every registered attention's description, JSON-ready (option defaults as their ``repr``); a plug-in's
    mechanism also names its plug-in (``plugin``: source and hash). ``plugins_only``: only the plug-ins'."""
    out = []
    for name in registry.names():
        p = plugins.plugin_for("attention", name)
        if plugins_only and p is None:
            continue
        out.append({**_jsonable(registry.describe(name)), **({"plugin": p.describe()} if p is not None else {})})
    return out


def builtins() -> list[dict[str, Any]]:
    """The built-in mechanisms' descriptions, as :func:`live` gives them, read from their source text."""
    out = []
    for name, target in sorted(registry.BUILTIN_ATTENTIONS.items()):
        module, _, cls = target.partition(":")
        try:
            out.append(_jsonable({"name": name, **_describe_static(module, cls)}))
        except _NotStatic:
            out.append(_jsonable(registry.describe(name)))
    return out


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "impls": list(d["impls"]), "options": {k: repr(v) for k, v in d["options"].items()}}


# --- the static reader ------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _module(name: str) -> tuple[ast.Module, dict[str, Any], dict[str, tuple[str, str]]]:
    """A module's tree, its module-level literal constants, and the names it imports (name -> (module, name))."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise _NotStatic(name)
    tree = ast.parse(Path(spec.origin).read_text())
    consts: dict[str, Any] = {}
    imported: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                imported[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            try:
                value = _value(node.value, consts)
            except _NotStatic:
                continue
            consts.update({t.id: value for t in targets if isinstance(t, ast.Name)})
    return tree, consts, imported


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
               ast.Pow: operator.pow}


def _value(node: ast.expr, consts: dict[str, Any], module: str = "") -> Any:
    """A literal, with module-level constants, ``math`` constants, arithmetic and ``Class.attribute`` (a class of
    ``module``) resolved."""
    if isinstance(node, ast.Name):
        if node.id in consts:
            return consts[node.id]
        raise _NotStatic(node.id)
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, (ast.Tuple, ast.List)):
        values = [_value(e, consts, module) for e in node.elts]
        return tuple(values) if isinstance(node, ast.Tuple) else values
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, consts, module)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_value(node.left, consts, module), _value(node.right, consts, module))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        if node.value.id == "math" and isinstance(getattr(math, node.attr, None), float):
            return getattr(math, node.attr)
        if module:
            return _attribute(_key(module, node.value.id), node.attr)
    raise _NotStatic(ast.unparse(node))


def _attribute(key: tuple[str, str], attr: str) -> Any:
    """The class attribute ``attr`` of the class ``key``, looked up along its method resolution order."""
    for mod, cls in _mro(key):
        for stmt in _class(mod, cls)[0].body:
            targets = (stmt.targets if isinstance(stmt, ast.Assign) else
                       [stmt.target] if isinstance(stmt, ast.AnnAssign) and stmt.value is not None else [])
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                return _value(stmt.value, _module(mod)[1], mod)
    raise _NotStatic(f"{key[1]}.{attr}")


@lru_cache(maxsize=None)
def _class(module: str, name: str) -> tuple[ast.ClassDef, str]:
    """The class statement of ``module.name`` (following ``from ... import`` within attnbench) and its module."""
    tree, _, imported = _module(module)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node, module
    if name in imported and imported[name][0].startswith("attnbench."):
        return _class(*imported[name])
    raise _NotStatic(f"{module}.{name}")


def _key(module: str, name: str) -> tuple[str, str]:
    """(defining module, class name) of the class ``name`` as seen from ``module``."""
    node, where = _class(module, name)
    return where, node.name


def _mro(key: tuple[str, str]) -> list[tuple[str, str]]:
    """The class's method resolution order (C3 linearisation), on (defining module, class name) keys."""
    node, where = _class(*key)
    imported = _module(where)[2]
    # bases outside attnbench (torch.nn.Module) declare none of the listed attributes: the walk stops there
    bases = [_key(where, b.id) for b in node.bases if isinstance(b, ast.Name) and b.id != "object"
             and imported.get(b.id, ("attnbench.",))[0].startswith("attnbench.")]
    seqs = [_mro(b) for b in bases] + [bases]
    out = [key]
    while any(seqs):
        head = next((s[0] for s in seqs if s and not any(s[0] in other[1:] for other in seqs)), None)
        if head is None:
            raise _NotStatic(f"no linearisation of {key[1]}")
        out.append(head)
        seqs = [[c for c in s if c != head] for s in seqs]
    return out


def _describe_static(module: str, name: str) -> dict[str, Any]:
    key = _key(module, name)
    init = next(((mod, stmt) for mod, cls in _mro(key) for stmt in _class(mod, cls)[0].body
                 if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__"), None)
    if init is None:
        raise _NotStatic(f"{name}.__init__")
    described = {k: _attribute(key, attr) for k, attr in LISTED.items()}
    return {**described, "impls": tuple(described["impls"]), "options": _options(init[1].args, _module(init[0])[1])}


def _options(args: ast.arguments, consts: dict[str, Any]) -> dict[str, Any]:
    """``__init__``'s parameters beyond the protocol's, with defaults (None where it has none), in order."""
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
    return {a.arg: None if d is None else _value(d, consts) for a, d in pairs
            if a.arg != "self" and a.arg not in registry.PROTOCOL_ARGS}
