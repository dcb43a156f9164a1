"""The claims checks: one :class:`ClaimCheck` per paper argument, in one module per paper.

A check measures one statistic for one mechanism (an attention spec) on one input (``synthetic`` draws of a stated
distribution, or ``real`` queries and keys of a trained model), under a :class:`~..criteria.Criterion` built from
its settings before any input is drawn, and returns a :class:`Result` (statistic, criterion, verdict, the numbers
behind it and a figure). ``CHECKS`` lists them in the order of the table.

Importing this package is light; :func:`checks` imports the checks (and torch).
"""

from __future__ import annotations

from .base import ClaimCheck, Context, Result, Skip  # noqa: F401  (the checks' vocabulary, for the runner)


def _all() -> list[ClaimCheck]:
    from . import adala, laplacian, memory, mirrorla, nala, stella  # torch: imported when the checks are asked for

    return [*nala.CHECKS, *mirrorla.CHECKS, *laplacian.CHECKS, *stella.CHECKS, *memory.CHECKS, *adala.CHECKS]


def checks() -> dict[str, ClaimCheck]:
    return {c.name: c for c in _all()}
