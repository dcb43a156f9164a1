"""What every claims check is made of: the :class:`ClaimCheck` record, the :class:`Context` a cell gets, the
:class:`Result` it returns, and :class:`Skip`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional

from ..criteria import Criterion, Statistic


@dataclasses.dataclass
class Context:
    """What one cell of a check gets. ``spec``: the mechanism (None for a check without one); ``settings``: the
    check's defaults updated with the caller's (the tests make them small); ``teacher``: the trained model for
    ``real`` inputs (None: real inputs are unavailable); ``figure``: where to write the PNG (None: no figure)."""

    spec: Any
    input: str
    seed: int
    settings: dict[str, Any]
    teacher: Any = None
    figure: Optional[Path] = None


@dataclasses.dataclass
class Result:
    criterion: Criterion
    statistic: Statistic
    source: str  # the input, in words (distribution and sizes, or the model and images)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)  # the numbers behind the statistic
    figure: Optional[str] = None

    @property
    def verdict(self) -> str:
        return self.criterion.verdict(self.statistic)

    def metrics(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "statistic": self.statistic.to_dict(), "criterion": self.criterion.to_dict(),
                "source": self.source, "figure": self.figure, **self.details}


class Skip(Exception):
    """The cell cannot be measured honestly (e.g. no trained model for real inputs): recorded as ``skipped``."""


@dataclasses.dataclass(frozen=True)
class ClaimCheck:
    name: str
    paper: str  # where the argument is made (section, theorem, equation, figure)
    claim: str  # the argument, one sentence
    defaults: tuple[str, ...]  # mechanism specs included without --attn
    inputs: tuple[str, ...]  # "synthetic", "real", ...
    run: Callable[[Context], Result]
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    accepts: Callable[[Any], bool] = lambda spec: True  # may --attn add this mechanism?

    def context(self, spec, input: str, *, seed: int = 0, teacher=None, figure: Optional[Path] = None,
                **settings) -> Context:
        unknown = sorted(set(settings) - set(self.settings))
        if unknown:
            raise TypeError(f"check {self.name}: unknown setting(s) {unknown} (known: {sorted(self.settings)})")
        return Context(spec, input, seed, {**self.settings, **settings}, teacher, figure)

    def measure(self, spec, input: str, **kw) -> Result:
        """Run the check once (the tests' entry point; the runner goes through the sweep)."""
        return self.run(self.context(spec, input, **kw))
