"""Command lines handed on: a relaunch under torchrun, a launcher's jobs and ``show``'s replay pass the user's
own command line on without the options that only the first process may act on."""

from __future__ import annotations

from typing import Sequence


def strip_options(argv: Sequence[str], names: dict[str, bool]) -> list[str]:
    """``argv`` without the options ``names`` (name -> takes a value), spelled ``--opt v`` or ``--opt=v``."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in names:
            skip = names[name] and "=" not in a
            continue
        out.append(a)
    return out
