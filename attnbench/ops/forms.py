"""What the recurrent ops (the delta rules, gated linear attention) share: the names of their forms, how ``impl``
resolves on a device, and the dtype they compute in."""

from __future__ import annotations

import difflib

import torch

from attnbench.core.protocol import UnknownNameError, UnsupportedError

#: a token-by-token reference, the exact chunked PyTorch form, FLA's Triton chunk kernels, and the device's pick
IMPLS = ("auto", "recurrent", "torch", "fla")


def resolve_impl(op: str, device: torch.device | str, impl: str = "auto") -> str:
    """The concrete form ``impl`` names on ``device`` for ``op`` (its name, for messages): ``"auto"`` is ``"fla"``
    on CUDA and ``"torch"`` elsewhere. Raises :class:`UnknownNameError` for an unknown name and
    :class:`UnsupportedError` for ``"fla"`` off CUDA (FLA's chunk kernels need a GPU; nothing falls back
    silently)."""
    if not isinstance(impl, str) or impl not in IMPLS:
        close = difflib.get_close_matches(str(impl), IMPLS, n=2, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownNameError(f"{op}: unknown impl {impl!r}{hint} (choose from {', '.join(IMPLS)})")
    dev = torch.device(device)
    if impl == "auto":
        return "fla" if dev.type == "cuda" else "torch"
    if impl == "fla" and dev.type != "cuda":
        raise UnsupportedError(
            f"{op}: impl='fla' needs a CUDA device (FLA's chunk kernels do not run on {dev.type!r}); "
            f"use impl='torch' (exact chunked PyTorch form) or impl='recurrent' (token-by-token reference)")
    return impl


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 inputs compute in float64, anything else in float32 (FLA's kernels accumulate in fp32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32
