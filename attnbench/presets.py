"""Typed TOML presets, shared by the suites: TOML data loaded into dataclasses, every key checked.

An unknown key (with a did-you-mean), a missing required key or a value of the wrong type is a
:class:`PresetError` naming the file and the key's path (``where``); a value a dataclass's ``__post_init__``
rejects is reported the same way. Embedded presets are ``presets/*.toml`` package data of a suite; a path to any
``.toml`` file works too.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import AttnbenchError, UnknownNameError


class PresetError(AttnbenchError):
    """A preset that does not load: unknown key, missing key, wrong type, bad value."""


def check_keys(table: dict, allowed: typing.Iterable[str], where: str) -> None:
    """Every key of ``table`` must be in ``allowed``; the error names the key and the closest allowed one."""
    allowed = list(allowed)
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PresetError(f"{where}: unknown key {key!r}{hint}; known keys: {', '.join(allowed)}")


def coerce(tp: Any, value: Any, where: str) -> Any:
    """``value`` as type ``tp`` (int, float, str, bool, Any, list/dict of those, unions, nested dataclasses);
    an int is accepted for a float, a bool never for an int."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(a, value, where)
            except PresetError as e:
                errors.append(str(e))
        raise PresetError(errors[0] if errors else f"{where}: bad value {value!r}")
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise PresetError(f"{where}: expected a list, got {value!r}")
        (item,) = args or (Any,)
        return [coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:  # tuple[T, ...] or tuple[T1, T2]: a TOML array
        if not isinstance(value, list):
            raise PresetError(f"{where}: expected a list, got {value!r}")
        items = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(items) != len(value):
            raise PresetError(f"{where}: expected {len(items)} values, got {value!r}")
        return tuple(coerce(t, v, f"{where}[{i}]") for i, (t, v) in enumerate(zip(items, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise PresetError(f"{where}: expected a table, got {value!r}")
        _, vt = args or (Any, Any)
        return {str(k): coerce(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(tp, type) and isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    raise PresetError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def build(cls: type, table: Any, where: str, *, skip: tuple[str, ...] = ()) -> Any:
    """Dataclass ``cls`` from TOML table ``table`` (fields in ``skip`` are set by the caller, not the file)."""
    if not isinstance(table, dict):
        raise PresetError(f"{where}: expected a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    check_keys(table, fields, where)
    for name, f in fields.items():
        if name not in table and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PresetError(f"{where}: missing required key {name!r}")
    kwargs = {k: coerce(hints[k], v, f"{where}: key {k!r}") for k, v in table.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:  # __post_init__'s checks (PresetError is a ValueError)
        raise PresetError(f"{where}: {e}") from None


HEADER = ("name", "description", "source", "setting")


def check_top_level(data: dict, file: str, *, tables: tuple[str, ...], required: tuple[str, ...],
                    strings: tuple[str, ...] = ()) -> None:
    """The top level of a suite preset: only the common header (name, description, source, setting, all strings)
    and the suite's ``tables``; the ``required`` keys present; ``strings`` (beyond the header) strings."""
    where = f"{file}: top level"
    check_keys(data, HEADER + tables, where)
    for k in required:
        if k not in data:
            raise PresetError(f"{where}: missing key {k!r}")
    for k in HEADER + strings:
        if k in data and not isinstance(data[k], str):
            raise PresetError(f"{where}: key {k!r} must be a string")


def preset_names(package: str) -> list[str]:
    """The embedded presets of ``package`` (its ``presets/*.toml``)."""
    folder = resources.files(package) / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def read_preset(package: str, name_or_path: str | Path, *, kind: str) -> tuple[dict, str]:
    """``(parsed TOML, where)`` for an embedded preset of ``package`` by name, or a ``.toml`` file by path.

    An unknown name is an :class:`UnknownNameError` with a did-you-mean (``kind`` names the suite in it); a
    missing file or invalid TOML is a :class:`PresetError`.
    """
    p = Path(name_or_path)
    if p.suffix == ".toml":
        if not p.is_file():
            raise PresetError(f"preset file {str(p)!r} does not exist")
        text, where = p.read_text(), str(p)
    else:
        res = resources.files(package) / "presets" / f"{name_or_path}.toml"
        if not res.is_file():
            known = preset_names(package)
            close = difflib.get_close_matches(str(name_or_path), known, n=2, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UnknownNameError(f"unknown {kind} preset {str(name_or_path)!r}{hint} (embedded: "
                                   f"{', '.join(known)}; or give a path to a .toml file)")
        text, where = res.read_text(), f"presets/{name_or_path}.toml"
    try:
        return tomllib.loads(text), where
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{where}: not valid TOML: {e}") from None


__all__ = ["PresetError", "build", "check_keys", "check_top_level", "coerce", "preset_names", "read_preset"]
