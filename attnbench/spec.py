"""An attention spec: a registered name plus build options, parsed and validated once where a run starts.

Command-line syntax (``--attn``): specs separated by commas, options after the name separated by colons::

    nala                      the mechanism with its defaults (plus a suite preset's options for it)
    nala:lam=2:tau=0.5        options; values are read as int, float, true/false, none, else a string
    softmax,nala:lam=2        two specs

Validation happens in :func:`parse_specs` (names, option names, value types against the mechanism's defaults)
and :meth:`AttentionSpec.check_builds` (a trial build at the run's real sizes, which catches values the
mechanism's constructor refuses): both before any data is generated or any cell starts. Downstream code gets
:class:`AttentionSpec` objects, never bare strings to re-check. ``label`` (``nala:lam=2``) names a spec in
tables; ``options`` (merged preset + command-line options) are recorded with every result.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Iterable, Mapping, Optional

from . import registry
from .errors import AttnbenchError

SPEC_SYNTAX = "name[:key=value[:key=value...]] (e.g. nala:lam=2)"


def _parse_value(text: str) -> Any:
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


def _coerce(name: str, key: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of the mechanism's default (None default: anything goes)."""
    if default is None or value is None:
        return value
    ok = {bool: lambda v: isinstance(v, bool),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          str: lambda v: isinstance(v, str)}.get(type(default))
    if ok is None:  # tuples, lists, ...: left to the constructor
        return value
    if not ok(value):
        raise AttnbenchError(f"attention {name!r}: option {key}={value!r} must be a {type(default).__name__} "
                             f"(default {default!r})")
    return float(value) if isinstance(default, float) else value


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """A registered attention ``name`` and the ``options`` it is built with (validated)."""

    name: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def make(cls, name: str, options: Optional[Mapping[str, Any]] = None) -> "AttentionSpec":
        """Validate ``name`` (did-you-mean) and ``options`` (known keys, value types)."""
        attn_cls = registry.get_attention(name)
        allowed = registry.options_of(attn_cls)
        out: dict[str, Any] = {}
        for key, value in dict(options or {}).items():
            if key not in allowed:
                close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.5)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                accepted = ", ".join(f"{k}={v!r}" for k, v in allowed.items()) or "none"
                raise AttnbenchError(f"attention {name!r} has no option {key!r}{hint} (it accepts: {accepted})")
            out[key] = _coerce(name, key, value, allowed[key])
        return cls(name, dict(sorted(out.items())))

    @property
    def label(self) -> str:
        """``name`` or ``name:key=value:...`` (the command-line spelling; parses back to this spec)."""
        return ":".join([self.name, *(f"{k}={v}" for k, v in self.options.items())])

    def with_defaults(self, defaults: Optional[Mapping[str, Any]]) -> "AttentionSpec":
        """This spec over ``defaults`` (e.g. a preset's options for this mechanism): explicit options win."""
        if not defaults:
            return self
        return AttentionSpec.make(self.name, {**defaults, **self.options})

    def build(self, *, heads: int, head_dim: int, seq_len: Optional[int] = None, causal: bool = False,
              impl: str = "auto"):
        """The attention module (``build_for_length`` when ``seq_len`` is known: length-derived options)."""
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


def parse_spec(text: str) -> AttentionSpec:
    """``"nala:lam=2"`` -> ``AttentionSpec("nala", {"lam": 2.0})`` (validated)."""
    parts = [p.strip() for p in text.strip().split(":")]
    name, options = parts[0], {}
    if not name:
        raise AttnbenchError(f"empty attention name in {text!r}; expected {SPEC_SYNTAX}")
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise AttnbenchError(f"attention spec {text!r}: {part!r} is not key=value; expected {SPEC_SYNTAX}")
        if key.strip() in options:
            raise AttnbenchError(f"attention spec {text!r}: option {key.strip()!r} given twice")
        options[key.strip()] = _parse_value(value.strip())
    return AttentionSpec.make(name, options)


def parse_specs(text: Optional[str], *, required: bool = True) -> list[AttentionSpec]:
    """A comma-separated ``--attn`` value -> specs. An empty list (``--attn ,``) is an error when ``required``;
    a spec given twice is an error (its cells would be one)."""
    items = [t for t in (text or "").split(",") if t.strip()]
    if not items:
        if required or text is not None:
            raise AttnbenchError(f"--attn {text!r} names no attention; give one or more {SPEC_SYNTAX}, "
                                 f"comma-separated (`attnbench list` shows the names)")
        return []
    specs = [parse_spec(t) for t in items]
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise AttnbenchError(f"--attn names {', '.join(dup)} more than once")
    return specs


def as_specs(items: Iterable[str | AttentionSpec]) -> list[AttentionSpec]:
    """Library callers may pass names or specs; names are parsed (and so validated) here."""
    return [i if isinstance(i, AttentionSpec) else parse_spec(i) for i in items]
