"""The registry of suites: what each suite plugs into the core (CLI, report, store), found by importing every
sub-package of :mod:`attnbench.suites`, each of which registers itself. The core names no suite."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable, Optional

from attnbench.api.registry import _unknown


@dataclasses.dataclass(frozen=True)
class Suite:
    """What a suite plugs into the core. The core (CLI, report, store) reaches a suite only through this record.

    ``run``: the typer command function of ``attnbench run <name>``; ``evaluate``: that of ``attnbench eval
    <name>`` (scoring a trained artifact, e.g. a language model by lm-eval); ``view``: an :class:`attnbench.views.tables.View`
    (``table`` / ``plot`` / markdown export; None: the generic view); ``data``: ``attnbench data <command>``
    functions; ``ingest``: ``(path, store) -> message | None`` for a results file format of the suite's own (None:
    not that format), tried by ``attnbench ingest`` after the store's own formats; ``load_preset``: ``(name or
    .toml path) -> preset``, for another suite's preset that names one of this suite's (``vision = "tiny"``, see
    :func:`attnbench.engine.presets.load`), so that suite need not import this one; ``top_level``: its ``run`` is the
    command ``attnbench <name>`` rather than ``attnbench run <name>`` (the doctor).
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
    top_level: bool = False


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
