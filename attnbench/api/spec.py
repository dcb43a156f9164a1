"""A spec: a registered attention or feature map plus its build options, parsed and validated once.

Command-line syntax (``--attn``): specs separated by commas, options after the name separated by colons::

    nala                      the mechanism with its defaults (plus a suite preset's options for it)
    nala:lam=2:tau=0.5        options; values are read as int, float, true/false, none, else a string
    softmax,nala:lam=2        two specs

This module is the one grammar (:func:`split_spec`, :func:`parse_value`) and the one option validator
(:func:`check_options`: option names with a did-you-mean, value types against the defaults) of every spec:
attentions and feature maps (:class:`Spec`), the registry's ``build`` and the composite specs a suite makes of
them (the LM's ``LAYER+MAP:key=value`` variants). Validation happens in :meth:`Spec.make` / :func:`parse_specs`
and :meth:`Spec.check_builds` (a trial build at the run's real sizes, which catches values the mechanism's
constructor refuses): both before any data is generated or any cell starts. Downstream code gets :class:`Spec`
objects, never bare strings to re-check. ``label`` (``nala:lam=2``) names a spec in tables; ``options`` (merged
preset + command-line options) are recorded with every result.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping, Optional

from attnbench.api import registry
from attnbench.api.options import check_options
from attnbench.core.errors import AttnbenchError

SPEC_SYNTAX = "name[:key=value[:key=value...]] (e.g. nala:lam=2)"
#: What a :class:`Spec` names: a registered attention or a registered feature map.
KINDS = ("attention", "feature map")


def parse_value(text: str) -> Any:
    """A command-line option value: ``true``/``false`` -> bool, ``none``/``null`` -> None, else int, float or the
    string itself."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def split_spec(text: str, *, what: str = "attention spec", syntax: str = SPEC_SYNTAX) -> tuple[str, dict[str, Any]]:
    """``"head:key=value:..."`` -> ``("head", {key: parsed value})``: the grammar every spec shares (the head is a
    name, or a suite's composite such as the LM's ``LAYER+MAP``). A part that is not ``key=value`` or an option
    given twice is an error naming ``what`` and the expected ``syntax``."""
    head, *parts = [p.strip() for p in text.strip().split(":")]
    if not head:
        raise AttnbenchError(f"{what} {text!r}: empty name; expected {syntax}")
    options: dict[str, Any] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise AttnbenchError(f"{what} {text!r}: {part!r} is not key=value; expected {syntax}")
        if key in options:
            raise AttnbenchError(f"{what} {text!r}: option {key!r} given twice")
        options[key] = parse_value(value.strip())
    return head, options


def label_of(name: str, options: Mapping[str, Any]) -> str:
    """``name`` or ``name:key=value:...`` with the options sorted (a spec's label; also a stored record's)."""
    return ":".join([name, *(f"{k}={v}" for k, v in sorted(options.items()))])


def _class_of(kind: str, name: str) -> type:
    if kind == "attention":
        return registry.get_attention(name)
    if kind == "feature map":
        return registry.get_feature_map(name)
    raise ValueError(f"spec kind must be one of {', '.join(KINDS)}, got {kind!r}")


@dataclasses.dataclass(frozen=True)
class Spec:
    """A registered attention or feature map (``kind``) ``name`` and the ``options`` it is built with (validated,
    sorted by key)."""

    name: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    kind: str = "attention"

    @classmethod
    def make(cls, name: str, options: Optional[Mapping[str, Any]] = None, *, kind: str = "attention") -> "Spec":
        """Validate ``name`` (did-you-mean) and ``options`` (known keys, value types)."""
        allowed = registry.options_of(_class_of(kind, name))
        out = check_options(f"{kind} {name!r}", dict(options or {}), allowed)
        return cls(name, dict(sorted(out.items())), kind)

    @classmethod
    def parse(cls, text: str, *, kind: str = "attention") -> "Spec":
        """``"nala:lam=2"`` -> ``Spec("nala", {"lam": 2.0})`` (validated)."""
        name, options = split_spec(text, what=f"{kind} spec")
        return cls.make(name, options, kind=kind)

    @property
    def label(self) -> str:
        """``name`` or ``name:key=value:...`` (the command-line spelling; parses back to this spec)."""
        return label_of(self.name, self.options)

    def with_defaults(self, defaults: Optional[Mapping[str, Any]]) -> "Spec":
        """This spec over ``defaults`` (e.g. a preset's options for this mechanism): explicit options win."""
        if not defaults:
            return self
        return Spec.make(self.name, {**defaults, **self.options}, kind=self.kind)

    def build(self, *, heads: int, head_dim: int, seq_len: Optional[int] = None, causal: bool = False,
              impl: str = "auto"):
        """The module: an attention (``build_for_length`` when ``seq_len`` is known: length-derived options) or a
        feature map (``impl`` and ``seq_len`` do not apply)."""
        if self.kind == "feature map":
            return registry.build_feature_map(self.name, heads=heads, head_dim=head_dim, causal=causal,
                                              **self.options)
        if seq_len is None:
            return registry.build(self.name, heads=heads, head_dim=head_dim, causal=causal, impl=impl,
                                  **self.options)
        return registry.build_for_length(self.name, seq_len=seq_len, heads=heads, head_dim=head_dim, causal=causal,
                                         impl=impl, **self.options)

    def check_builds(self, *, heads: int, head_dim: int, seq_len: Optional[int] = None, causal: bool = False) -> None:
        """Build once at the run's sizes, so a value the mechanism refuses fails before any work starts."""
        try:
            self.build(heads=heads, head_dim=head_dim, seq_len=seq_len, causal=causal)
        except AttnbenchError as e:
            raise AttnbenchError(f"--attn {self.label}: {e}") from None
        except (TypeError, ValueError) as e:
            raise AttnbenchError(f"--attn {self.label}: the mechanism refuses these options: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "options": dict(self.options)}


#: The name the suites use for an attention's spec: the same type.
AttentionSpec = Spec


def parse_spec(text: str, *, kind: str = "attention") -> Spec:
    """``"nala:lam=2"`` -> ``Spec("nala", {"lam": 2.0})`` (validated)."""
    return Spec.parse(text, kind=kind)


def parse_specs(text: Optional[str], *, required: bool = True) -> list[Spec]:
    """A comma-separated ``--attn`` value -> specs. An empty list (``--attn ,``) is an error when ``required``;
    a spec given twice is an error (its cells would be one)."""
    items = [t for t in (text or "").split(",") if t.strip()]
    if not items:
        if required or text is not None:
            raise AttnbenchError(f"--attn {text!r} names no attention; give one or more {SPEC_SYNTAX}, "
                                 f"comma-separated (`attnbench list` shows the names)")
        return []
    specs = [parse_spec(t) for t in items]
    check_distinct([s.label for s in specs], "--attn names {} more than once")
    return specs


def check_distinct(labels: Iterable[str], message: str) -> None:
    """Labels given more than once are an error (``message`` with ``{}`` for them): their cells would be one."""
    labels = list(labels)
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise AttnbenchError(message.format(", ".join(dup)))


def as_specs(items: Iterable[str | Spec]) -> list[Spec]:
    """Library callers may pass names or specs; names are parsed (and so validated) here."""
    return [i if isinstance(i, Spec) else parse_spec(i) for i in items]
