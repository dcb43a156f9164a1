"""Shared plumbing of the kernels: the guarded triton import, device checks, block sizes.

Kernels are written for CUDA GPUs and run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set
before triton is imported). Without triton this module still imports: ``HAS_TRITON`` is False, ``jit`` returns the
plain function and every kernel entry point raises a clear error instead of launching.
"""

from __future__ import annotations

import os

import torch

try:  # triton is optional (the `gpu`/`dev` extras); the references and CPU paths work without it
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False


def jit(fn):
    """``triton.jit`` when triton is installed, else the undecorated function (never launched)."""
    return triton.jit(fn) if HAS_TRITON else fn


def interpreting() -> bool:
    """True when Triton's interpreter is on (kernels then run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernels_available(device: torch.device | str | None = None) -> bool:
    """Whether the Triton kernels can run: triton imports and either a CUDA device or the interpreter is there.

    With ``device`` given, answer for tensors on that device (CPU tensors need the interpreter, CUDA tensors a GPU).
    """
    if not HAS_TRITON:
        return False
    if device is None:
        return torch.cuda.is_available() or interpreting()
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available()
    return device.type == "cpu" and interpreting()


_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_launchable(fn_name: str, **tensors: torch.Tensor) -> None:
    """Raise a clear error if the named tensors cannot go to a Triton kernel (no triton, wrong device, dtype)."""
    if not HAS_TRITON:
        raise RuntimeError(f"{fn_name}: triton is not installed (pip install 'attnbench[gpu]'); "
                           "use the *_reference function or the PyTorch op instead")
    first = next(iter(tensors.values()))
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn_name}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != first.device:
            raise ValueError(f"{fn_name}: {name} is on {t.device} but the other inputs are on {first.device}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{fn_name}: {name} has dtype {t.dtype}; kernels take float32, float16 or bfloat16")
    if not kernels_available(first.device):
        where = "set TRITON_INTERPRET=1 before importing triton" if first.device.type == "cpu" else "needs CUDA"
        raise RuntimeError(f"{fn_name}: cannot run a Triton kernel on {first.device} ({where})")


def check_shape(fn_name: str, name: str, t: torch.Tensor, shape: tuple, what: str) -> None:
    """Raise ``ValueError`` naming ``name`` if ``t.shape != shape`` (``what`` spells the expected layout)."""
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{fn_name}: {name} must be {what} = {list(shape)}, got {list(t.shape)}")


def pow2(n: int, lo: int = 16) -> int:
    """Smallest power of two >= max(n, lo): tl.arange needs powers of two, tl.dot needs blocks >= 16."""
    return max(lo, 1 << max(0, int(n) - 1).bit_length())


LOWP_DTYPES = (torch.bfloat16,)  # dtypes whose tiles stay in that dtype as tl.dot operands


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision for tiles upcast to float32: exact ("ieee") for float32 inputs; "tf32" for
    float16 inputs (a float16-like mantissa with float32's range, so unnormalised scores and states cannot
    overflow). bfloat16 tiles are dotted in bfloat16 (see ``LOWP_DTYPES``), where the precision does not apply.
    ("tf32x3" would be near-exact too, but ptxas then spills heavily.) The interpreter computes every dot in
    float32."""
    return "ieee" if dtype == torch.float32 else "tf32"
