"""The recall suite's data on disk: each task point generated once into a directory of its own and read back.

Layout of a point's directory (``<work>/data/<task>-<hash of task, parameters, sizes and seed>/``)::

    train.npz  val.npz  test.npz     # numpy archives, each with two int64 arrays [n, seq_len]:
                                     #   inputs   the token ids the model reads
                                     #   targets  the token to predict at each position, -100 where none is asked
    params.json                      # the task, its parameters, the split sizes and the data seed
    COMPLETE                         # written last: a directory without it is not used

The three splits are drawn with seeds ``seed``, ``seed + 1`` and ``seed + 2`` (distinct examples by
construction, as Zoology draws its train and test sets from different seeds). ``np.load(path)["inputs"]`` reads a
split anywhere; :func:`load_split` checks the shapes and the vocabulary.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from attnbench.core.errors import DataError
from attnbench.io.generated import COMPLETE, materialize
from attnbench.results import provenance

from .tasks import IGNORE, generate

SPLITS = ("train", "val", "test")


@dataclasses.dataclass(frozen=True)
class Split:
    inputs: np.ndarray      # [n, T] int64
    targets: np.ndarray     # [n, T] int64, IGNORE where nothing is asked

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def answers(self) -> int:
        """Positions that are asked (the accuracy's denominator)."""
        return int((self.targets != IGNORE).sum())


def point_dir(cache: Path, task: str, params: dict, sizes: dict, seed: int) -> Path:
    key = provenance.config_hash({"task": task, "params": params, "sizes": sizes, "seed": seed})
    return Path(cache) / f"{task}-{key}"


def ensure(cache: Path, task: str, params: dict, sizes: dict, seed: int) -> Path:
    """The directory of this point, generated first if it is not complete (``sizes``: examples per split)."""
    d = point_dir(cache, task, params, sizes, seed)

    def fill(tmp: Path) -> None:
        for i, split in enumerate(SPLITS):
            x, y = generate(task, sizes[split], params, seed + i, training=split == "train")
            np.savez(tmp / f"{split}.npz", inputs=x, targets=y)

    materialize(d, fill, {"task": task, "params": params, "sizes": sizes, "seed": seed})
    return d


def load_split(d: Path, split: str, vocab_size: int) -> Split:
    path = Path(d) / f"{split}.npz"
    if not (Path(d) / COMPLETE).exists():
        raise DataError(f"{d}: not a complete recall data directory (no {COMPLETE}); delete it to regenerate")
    try:
        with np.load(path) as f:
            x, y = np.asarray(f["inputs"], dtype=np.int64), np.asarray(f["targets"], dtype=np.int64)
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{path}: not a recall split (.npz with 'inputs' and 'targets'): {e}") from None
    if x.ndim != 2 or x.shape != y.shape:
        raise DataError(f"{path}: inputs {x.shape} and targets {y.shape} must be equal [n, seq_len] arrays")
    asked = y[y != IGNORE]
    if x.size and (x.min() < 0 or x.max() >= vocab_size or (asked.size and (asked.min() < 0
                                                                            or asked.max() >= vocab_size))):
        raise DataError(f"{path}: token ids outside the vocabulary [0, {vocab_size})")
    return Split(x, y)


__all__ = ["SPLITS", "Split", "ensure", "load_split", "point_dir"]
