"""A measured point as the store holds it and an export writes it: :class:`Measurement`, its statuses, its
identity (:func:`point_hash`) and the JSONL format of exports and committed results."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable

from attnbench.api import plugins
from attnbench.results import provenance

STATUSES = ("ok", "oom", "timeout", "incorrect", "failed", "interrupted", "unsupported", "skipped")


# A point with one of these is done: a re-run skips it unless forced. 'failed' and 'interrupted' are retried.
FINISHED = ("ok", "oom", "timeout", "incorrect", "unsupported", "skipped")


def point_hash(*, suite: str, setting: str, task: str, attention: str, options: dict, params: dict,
               dtype: str | None, device: str) -> str:
    """The identity of a measured point (what resume compares). A point whose attention or options name a
    plug-in's mechanism also carries the hash of the plug-in's source (:func:`attnbench.api.plugins.identity`), so
    editing the plug-in reruns the point; built-ins add nothing (their identities never change). A plug-in named
    only in ``params`` counts too (a suite whose cell is a mix of mechanisms, e.g. MixA's per-layer specs)."""

    point = {"suite": suite, "setting": setting, "task": task, "attention": attention, "options": options,
             "params": params, "dtype": dtype, "device": device}
    used = plugins.identity(attention, {"options": options, "params": params})
    if used:
        point["plugins"] = used
    return provenance.config_hash(point)


def plugin_provenance(attention: str, options: dict | None, params: dict | None = None) -> dict[str, str]:
    """``{"plugin:<file or module>": "sha256:<hash>"}`` for the plug-ins a record's mechanism comes from."""
    return plugins.provenance(attention, {"options": options, "params": params})


def seeded_params(params: dict, seed: int | None) -> dict:
    """The params a point's identity hashes: a cell is (spec, task, seed), so the seed is part of it. The training
    suites put it in ``params`` themselves (``params["seed"]``, seed 0 included: their identities predate seeds as
    cells); a record that does not gets ``seed`` added here when it is set and not 0, so a seed-0 point keeps the
    identity it had before seeds were cells (committed results and users' stores still match)."""
    if seed in (None, 0) or "seed" in params:
        return params
    return {**params, "seed": seed}


@dataclasses.dataclass
class Measurement:
    """One measured point with its provenance. ``params`` are the point's inputs, ``metrics`` its results."""
    suite: str
    task: str
    setting: str
    attention: str
    status: str
    device: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    impl: str | None = None
    dtype: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    config_hash: str = ""
    seed: int | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    packages: dict[str, str] = dataclasses.field(default_factory=dict)
    device_name: str | None = None
    error: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    source: str = "attnbench"
    run_id: str | None = None
    id: int | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"measurement status must be one of {STATUSES}, got {self.status!r}")
        if not self.config_hash:
            self.config_hash = point_hash(suite=self.suite, setting=self.setting, task=self.task,
                                          attention=self.attention, options=self.options,
                                          params=seeded_params(self.params, self.seed), dtype=self.dtype,
                                          device=self.device)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown measurement field(s) {sorted(unknown)}")
        return cls(**d)

    def flat(self) -> dict[str, Any]:
        """One flat row (CSV): ``params.*`` and ``metrics.*`` spread into columns, other dicts as JSON."""
        d = self.to_dict()
        params, metrics = d.pop("params"), d.pop("metrics")
        for key in ("options", "packages"):
            d[key] = provenance.canonical_json(d[key])
        d.update({f"params.{k}": v for k, v in params.items()})
        d.update({f"metrics.{k}": v for k, v in metrics.items()})
        return d


def write_jsonl(records: Iterable[Measurement], path: str | os.PathLike) -> int:
    """Write records one JSON object a line (atomically: temp file then rename); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = 0
    with tmp.open("w") as f:
        for m in records:
            f.write(json.dumps(m.to_dict(), sort_keys=True) + "\n")
            n += 1
    tmp.replace(path)
    return n


def read_jsonl(path: str | os.PathLike) -> list[Measurement]:
    """The records of a ``.jsonl`` export; a line that is not a record is a ValueError naming ``path:line``."""
    out = []
    with Path(path).open(encoding="utf-8", errors="strict") as f:
        i = 0
        try:
            for i, line in enumerate(f, 1):
                if line.strip():
                    out.append(Measurement.from_dict(json.loads(line)))
        except (ValueError, TypeError) as e:  # (UnicodeDecodeError is a ValueError)
            raise ValueError(f"{path}:{i + (1 if isinstance(e, UnicodeDecodeError) else 0)}: not a measurement "
                             f"record: {e}") from e
    return out
