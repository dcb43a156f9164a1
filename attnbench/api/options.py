"""The one option validator of every spec and mechanism: option names with a did-you-mean, value types against
the defaults."""

from __future__ import annotations

import difflib
import numbers
from typing import Any, Mapping

from attnbench.core.errors import AttnbenchError


def _coerce(what: str, key: str, value: Any, default: Any) -> Any:
    """``value`` checked against the type of the default (a None default or value: anything goes; an int is
    accepted for a float and becomes one; a bool is never an int)."""
    if default is None or value is None:
        return value
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = {bool: lambda: isinstance(value, bool),
          int: lambda: isinstance(value, numbers.Integral) and not isinstance(value, bool),
          float: lambda: real,
          str: lambda: isinstance(value, str)}.get(type(default))
    if ok is None:  # tuples, lists, ...: left to the constructor
        return value
    if not ok():
        raise AttnbenchError(f"{what}: option {key}={value!r} must be a {type(default).__name__} "
                             f"(default {default!r})")
    return float(value) if isinstance(default, float) else value


def check_options(what: str, options: Mapping[str, Any], allowed: Mapping[str, Any]) -> dict[str, Any]:
    """The one option validator: every key of ``options`` must be in ``allowed`` (``{option: default}``; the error
    names the unknown keys with the closest allowed ones and lists what is accepted), every value must have its
    default's type. Returns the options with ints made floats where the default is a float. ``what`` names the
    thing in the error (``attention 'nala'``)."""
    bad = [k for k in options if k not in allowed]
    if bad:
        hints = []
        for k in bad:
            close = difflib.get_close_matches(k, list(allowed), n=1, cutoff=0.5)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        accepted = ", ".join(f"{k}={v!r}" for k, v in allowed.items()) or "none"
        raise AttnbenchError(f"{what} got unknown option(s) {', '.join(hints)}; it accepts: {accepted}")
    return {k: _coerce(what, k, v, allowed[k]) for k, v in options.items()}
