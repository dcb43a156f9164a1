"""The errors attnbench raises for bad input. Torch-free, so the CLI can import them without loading torch."""

from __future__ import annotations


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
