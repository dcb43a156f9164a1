"""The errors attnbench raises for bad input. Torch-free, so the CLI can import them without loading torch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


class AttnbenchError(ValueError):
    """Base class of the errors attnbench raises for bad input (a ValueError, so callers can catch either)."""


class UnknownNameError(AttnbenchError, KeyError):
    """An attention, feature map, suite or preset name that is not registered."""

    def __str__(self) -> str:  # KeyError would otherwise print the message in quotes
        return str(self.args[0]) if self.args else ""


class ShapeError(AttnbenchError):
    """A tensor whose rank, size or dtype does not match the protocol."""


class UnsupportedError(AttnbenchError):
    """A request the mechanism cannot honour (e.g. causal for a bidirectional-only mechanism)."""


class DataError(AttnbenchError):
    """A data file or folder that does not match its format. The message is one line: the path (and, for text
    formats, the line number), then what is wrong."""

    def __init__(self, message: str, *, path: Optional[PathLike] = None, line: Optional[int] = None):
        where = ""
        if path is not None:
            where = f"{path}" + (f", line {line}" if line is not None else "") + ": "
        super().__init__(where + message)
        self.path = None if path is None else Path(path)
        self.line = line


class DataMissingError(DataError, FileNotFoundError):
    """A data folder or file that is not there; the message names it and the layout expected (or how to make it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# Messages of the allocators' out-of-memory failures (torch CPU/CUDA, glibc, the C++ runtime).
OOM_MARKERS = ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory",
               "std::bad_alloc", "failed to allocate")


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory failure (``MemoryError``, torch's ``OutOfMemoryError``, or a
    ``RuntimeError`` with an allocator's message). Torch-free: matched by class name and message."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(m in msg for m in OOM_MARKERS)
