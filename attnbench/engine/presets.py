"""Typed TOML presets, shared by the suites: TOML data loaded into dataclasses, every key checked.

A suite declares its preset as a frozen dataclass deriving from :class:`SuitePreset` (the header every preset
has: ``name``, ``description``, ``source``, ``setting``; the ``key`` results are recorded under; the identity
hash) and loads it with :func:`load`: the file is found (an embedded preset by name, or a ``.toml`` path), the
top level checked, every table read into the dataclass of its field, a key naming another preset resolved by the
one rule of :func:`resolve_reference`, and the suite's own layout read by its ``read`` hook.

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
from typing import Any, Callable, ClassVar, Mapping, Optional, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from attnbench.api import suites as suite_registry
from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.results import provenance


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


def parse_seq(value: int | str) -> int:
    """A sequence length as presets and ``--seq`` write it: ``4096``, ``"4096"``, ``"4k"`` (= 4096), ``"1m"``
    (= 1048576) -> int."""
    if isinstance(value, bool):
        raise ValueError(f"not a sequence length: {value!r}")
    if isinstance(value, int):
        n = value
    else:
        s = str(value).strip().lower()
        mult = {"k": 1024, "m": 1024 * 1024}.get(s[-1:], 1)
        body = s[:-1] if mult > 1 else s
        try:
            n = int(float(body) * mult) if "." in body else int(body) * mult
        except ValueError:
            raise ValueError(f"not a sequence length: {value!r} (expected e.g. 4096 or '4k')") from None
    if n < 1:
        raise ValueError(f"sequence length must be positive, got {value!r}")
    return n


#: The keys every suite preset may have at its top level (the fields of :class:`SuitePreset`).
HEADER = ("name", "description", "source", "setting")


def preset_names(package: str) -> list[str]:
    """The embedded presets of ``package`` (its ``presets/*.toml``)."""
    folder = resources.files(package) / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def _locate(package: str, name_or_path: str | Path, kind: str) -> tuple[str, str, Path]:
    """``(TOML text, where, folder)`` of an embedded preset by name or a ``.toml`` file by path; ``folder`` is
    where the preset's own references to other ``.toml`` files are relative to."""
    p = Path(name_or_path)
    if p.suffix == ".toml":
        if not p.is_file():
            raise PresetError(f"preset file {str(p)!r} does not exist")
        return p.read_text(), str(p), p.resolve().parent
    folder = resources.files(package) / "presets"
    res = folder / f"{name_or_path}.toml"
    if not res.is_file():
        known = preset_names(package)
        close = difflib.get_close_matches(str(name_or_path), known, n=2, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownNameError(f"unknown {kind} preset {str(name_or_path)!r}{hint} (embedded: "
                               f"{', '.join(known)}; or give a path to a .toml file)")
    return res.read_text(), f"presets/{name_or_path}.toml", Path(str(folder))


def _parse(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{where}: not valid TOML: {e}") from None


def read_preset(package: str, name_or_path: str | Path, *, kind: str) -> tuple[dict, str]:
    """``(parsed TOML, where)`` for an embedded preset of ``package`` by name, or a ``.toml`` file by path.

    An unknown name is an :class:`UnknownNameError` with a did-you-mean (``kind`` names the suite in it); a
    missing file or invalid TOML is a :class:`PresetError`.
    """
    text, where, _ = _locate(package, name_or_path, kind)
    return _parse(text, where), where


def resolve_reference(value: str, folder: Path) -> str:
    """The one rule for a preset key that names another preset (``vision = "tiny"``, ``vision = "my.toml"``): a
    value ending in ``.toml`` is a file, relative to the folder of the naming preset's file (an embedded preset's:
    the suite's ``presets/``); any other value is the name of a built-in preset of the suite the key names."""
    if not value.endswith(".toml"):
        return value
    p = Path(value)
    return str(p if p.is_absolute() else folder / p)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SuitePreset:
    """The header of every suite preset. ``path``: where it was loaded from (set by :func:`load`, not a key of the
    file). A suite's preset derives from this (a frozen dataclass), sets ``suite`` (the prefix of its default
    ``key``) and defines ``identity()``: what a cell trains besides the attention, hashed into its identity."""

    suite: ClassVar[str] = ""

    name: str
    description: str = ""
    source: str = ""
    setting: str = ""
    path: str = dataclasses.field(default="", metadata={"from_file": False})

    @property
    def key(self) -> str:
        """The setting results are recorded under (``<suite>/<name>`` unless the file says otherwise)."""
        return self.setting or f"{self.suite}/{self.name}"

    def identity(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} has no identity()")

    def identity_hash(self) -> str:
        return provenance.config_hash(self.identity())


P = TypeVar("P", bound=SuitePreset)


def load_suite_preset(suite: str, name_or_path: str | Path) -> Any:
    """Suite ``suite``'s preset ``name_or_path``, through the loader the suite registered (so the suite asking for
    it never imports the other)."""

    loader = suite_registry.get_suite(suite).load_preset
    if loader is None:
        raise PresetError(f"suite {suite!r} registers no load_preset, so its presets cannot be named")
    return loader(str(name_or_path))


def load(cls: type[P], package: str, name_or_path: str | Path, *, kind: str, own: tuple[str, ...] = (),
         read: Optional[Callable[[dict, str], dict[str, Any]]] = None,
         references: Optional[Mapping[str, str]] = None) -> P:
    """The preset ``cls`` of suite ``package``: an embedded preset by name or a ``.toml`` file by path.

    Every field of ``cls`` (the header's and the suite's; not those with ``metadata={"from_file": False}``) is
    the top-level key of its name: a table is read into the field's dataclass (``where``: ``FILE: [table]``), a
    value coerced to the field's type; a field without a default is a required key. ``references`` maps a key
    that names another suite's preset to that suite's name: the value is resolved by :func:`resolve_reference`,
    loaded by the suite's registered ``load_preset`` (so no suite imports another), and the field holds it.
    ``own``: top-level keys the suite lays out its own way, read by ``read(data, where)`` into field values.
    Unknown keys and values ``cls`` refuses are :class:`PresetError` s naming the file and the key.
    """
    text, file, folder = _locate(package, name_or_path, kind)
    data = _parse(text, file)
    where = f"{file}: top level"
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.metadata.get("from_file", True)}
    header = [k for k in HEADER if k in fields]
    check_keys(data, [*header, *(k for k in fields if k not in header and k not in own), *own], where)
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for k, f in fields.items():
        if k in own:
            continue
        if k not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PresetError(f"{where}: missing key {k!r}")
            continue
        value = data[k]
        if references and k in references:
            if not isinstance(value, str):
                raise PresetError(f"{where}: key {k!r} must be a string (a preset name or a .toml path)")
            try:
                kwargs[k] = load_suite_preset(references[k], resolve_reference(value, folder))
            except (PresetError, ValueError) as e:
                raise PresetError(f"{file}: {k} = {value!r}: {e}") from None
        else:
            kwargs[k] = coerce(hints[k], value, f"{file}: [{k}]" if isinstance(value, dict) else f"{where}: key {k!r}")
    if read is not None:
        kwargs.update(read(data, file))
    try:
        return cls(**kwargs, path=file)
    except (TypeError, ValueError) as e:  # the preset's own checks (PresetError is a ValueError)
        raise PresetError(f"{file}: {e}") from None


__all__ = ["PresetError", "SuitePreset", "build", "check_keys", "coerce", "load", "preset_names", "read_preset",
           "resolve_reference"]
