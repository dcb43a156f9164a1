"""Readers of data file formats that more than one suite reads, each with errors that name the file.

- Python pickles are read with :class:`SafeUnpickler` only: it loads numpy arrays and Python 2 byte strings and
  refuses every other global, so a data file cannot run code when it is read (``pickle.load`` on a downloaded
  file would run whatever the file names).
- Torch files (model weights, checkpoints) are read with ``torch.load(..., weights_only=True)``:
  :func:`refused_global` names the object such a file holds beyond tensors and plain values, for the error.
- CIFAR's python release (``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``,
  ``cifar-100-python/{train,test,meta}``): :func:`read_cifar_batch` and :func:`read_cifar_meta`.

A malformed file is a :class:`attnbench.core.errors.DataError` of one line: the path, then what is wrong.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from attnbench.core.errors import DataError, PathLike

#: The globals a data pickle may name (numpy arrays, Python 2 byte strings); nothing else is loaded.
PICKLE_ALLOWED = frozenset({("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                            ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
                            ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")})


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that loads only the globals of :data:`PICKLE_ALLOWED` (data, never code)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in PICKLE_ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")


def refused_global(error: BaseException) -> str | None:
    """The global (``argparse.Namespace``) a ``torch.load(..., weights_only=True)`` refused, else None (the file
    is not readable at all: truncated, not a torch file)."""
    import re

    m = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
    return m.group(1) if m else None


def load_pickle(path: PathLike, what: str) -> dict[str, Any]:
    """The dict a data pickle holds (Python 2 pickles: byte strings as bytes, keys decoded to ``str``), read with
    :class:`SafeUnpickler`. ``what`` names the format in the error (``"CIFAR-10"``)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            obj = SafeUnpickler(f, encoding="bytes").load()
    except EOFError:
        raise DataError(f"not a {what} python pickle (truncated: ended early)", path=path) from None
    except Exception as e:  # noqa: BLE001  (any failure of the unpickler means: not this format)
        msg = str(e).splitlines()[0] if str(e) else ""
        raise DataError(f"not a {what} python pickle ({type(e).__name__}: {msg})", path=path) from None
    if not isinstance(obj, dict):
        raise DataError(f"not a {what} python pickle (expected a dict, found {type(obj).__name__})", path=path)
    return {(k.decode("latin1") if isinstance(k, bytes) else str(k)): v for k, v in obj.items()}


def _require(d: dict, keys: Sequence[str], path: Path, what: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise DataError(f"not a {what} python pickle (missing key(s) {missing}; has {sorted(d)[:8]})", path=path)


def read_cifar_batch(path: PathLike, *, which: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python pickle (a CIFAR-10 batch, CIFAR-100 ``train`` / ``test``) -> (images ``uint8 [n, 32, 32,
    3]``, labels ``int64 [n]``; CIFAR-100: the fine labels)."""
    path = Path(path)
    what = f"CIFAR-{which}"
    label_key = "labels" if which == 10 else "fine_labels"
    d = load_pickle(path, what)
    _require(d, ["data", label_key], path, what)
    data = d["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        found = f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"not a {what} python pickle ('data' must be uint8 [n, 3072], found {found})", path=path)
    try:
        labels = np.asarray(d[label_key], dtype=np.int64)
    except (TypeError, ValueError) as e:
        raise DataError(f"not a {what} python pickle ('{label_key}' is not a list of ints: {e})", path=path) from None
    if labels.shape != (len(data),):
        raise DataError(f"not a {what} python pickle ({labels.size} '{label_key}' for {len(data)} images)",
                        path=path)
    bad = np.flatnonzero((labels < 0) | (labels >= which))
    if bad.size:
        raise DataError(f"label {labels[bad[0]]} of image {bad[0]} is outside 0..{which - 1}", path=path)
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # [n, 32, 32, 3] (planes R, G, B, row-major)
    return np.ascontiguousarray(images), labels


def read_cifar_meta(path: PathLike, *, which: int = 10) -> list[str]:
    """``batches.meta`` (CIFAR-10) or ``meta`` (CIFAR-100) -> the class names, in label order."""
    path = Path(path)
    what = f"CIFAR-{which}"
    key = "label_names" if which == 10 else "fine_label_names"
    d = load_pickle(path, what)
    _require(d, [key], path, what)
    names = d[key]
    if not isinstance(names, (list, tuple)) or len(names) != which:
        n = len(names) if isinstance(names, (list, tuple)) else type(names).__name__
        raise DataError(f"not a {what} meta pickle ('{key}' must list {which} names, found {n})", path=path)
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names]
