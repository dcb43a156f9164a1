"""Memory of one call, two meters.

- :class:`TensorMemory` — the primary figure: the peak bytes of tensor storages alive at once during a call,
  counting the storages created inside it (above the inputs and parameters), op by op through a
  ``TorchDispatchMode``. It does not depend on the allocator or the CPU: the same on any machine.
- :class:`PeakRSS` — the secondary, process-level figure on the CPU: ``VmHWM`` from ``/proc/self/status``, reset
  to the current RSS through ``/proc/self/clear_refs``. An RSS rise below one page is *below its resolution*
  (the allocator served the call from memory it already held, as glibc does for small N after the gate's
  warm-up): recorded as None with the reason, never as 0. On CUDA, ``torch.cuda.max_memory_allocated``
  (:func:`timed_first_call` picks the meter by device). Meant for a fresh child process
  (:func:`attnbench.measure.isolation.run_in_child`) so that the process figure is the call's own.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MEM_METHOD_CPU = "child-process peak RSS (VmHWM after clear_refs reset) minus RSS after inputs"
MEM_METHOD_CPU_NORESET = "child-process peak RSS (VmHWM, no reset available) minus RSS after inputs"
MEM_METHOD_CUDA = "torch.cuda.max_memory_allocated minus allocated after inputs"
TENSOR_MEM_METHOD = ("peak bytes of tensor storages alive at once during the call, created by its ops (inputs and "
                     "parameters not counted; scratch inside a single kernel not seen)")


def _proc_status_kb(*keys: str) -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                out[k] = int(v.split()[0])
    return out


class TensorMemory(TorchDispatchMode):
    """Peak bytes of tensor storages alive at once inside the ``with`` block, counting only storages the block's
    ops create (not its inputs, parameters, or anything that existed before), in bytes.

    Every op that runs under the mode (forward, and the backward the autograd engine runs for it) is seen at the
    aten level: an output whose storage is none of the op's inputs' storages is a new allocation of
    ``storage.nbytes()``; it stops counting when the storage is freed (a weakref finalizer on the storage). Views
    share their base's storage and are not counted twice. Scratch memory a single kernel allocates and frees
    inside itself is not seen. Deterministic and allocator-independent: the same on any CPU.

    After the block: ``peak`` (the figure), ``live`` (bytes still alive at exit: outputs, gradients),
    ``allocated`` (total bytes created), ``count`` (storages created).
    """

    method = TENSOR_MEM_METHOD

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.allocated = 0
        self.count = 0
        self._finalizers: dict[int, weakref.finalize] = {}

    def _free(self, key: int, nbytes: int) -> None:
        if self._finalizers.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            key = _storage_key(t)
            if key is None or key in inputs or key in self._finalizers:
                continue
            storage = t.untyped_storage()
            nbytes = storage.nbytes()
            self._finalizers[key] = weakref.finalize(storage, self._free, key, nbytes)
            self.live += nbytes
            self.allocated += nbytes
            self.count += 1
            self.peak = max(self.peak, self.live)
        return out

    def __exit__(self, *exc):
        for f in list(self._finalizers.values()):  # what outlives the block is no longer this block's business
            f.detach()
        self._finalizers.clear()
        return super().__exit__(*exc)


def _tensors(tree) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # tensors without a storage (sparse, nested, functional)
        return None


def tensor_peak(fn: Callable[[], Any]) -> TensorMemory:
    """Run ``fn()`` once under :class:`TensorMemory`; returns the meter (``.peak`` in bytes)."""
    with TensorMemory() as meter:
        fn()
    return meter


def _trim_allocator() -> None:
    """Give the C allocator's cached free memory back to the OS where it can (glibc ``malloc_trim``), so an RSS
    rise reflects the call rather than the cache's state; a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRSS:
    """Peak resident set size of this process since :meth:`reset`, in bytes, on Linux.

    ``reset()`` writes ``5`` to ``/proc/self/clear_refs`` (resets ``VmHWM`` to the current RSS) and records the
    current RSS as the baseline; ``peak()`` is ``VmHWM - baseline``. Where the reset is not allowed, ``VmHWM`` is
    read as is (``resettable`` False): still right for a fresh child whose earlier peak was below the run's.
    :meth:`measured` gives the figure with its resolution applied: below one page it is None, with the reason.
    """

    resolution = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __init__(self) -> None:
        self.baseline = 0
        self.resettable = True

    @staticmethod
    def available() -> bool:
        return os.path.exists("/proc/self/status")

    def reset(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.resettable = False
        self.baseline = _proc_status_kb("VmRSS")["VmRSS"] * 1024

    def peak(self) -> int:
        return _proc_status_kb("VmHWM")["VmHWM"] * 1024 - self.baseline

    @property
    def method(self) -> str:
        return MEM_METHOD_CPU if self.resettable else MEM_METHOD_CPU_NORESET

    def measured(self) -> tuple[int | None, str | None]:
        """``(bytes, None)``, or ``(None, why)`` when the rise is below the resolution (one page)."""
        peak = self.peak()
        if peak < self.resolution:
            return None, (f"below resolution: the RSS rose by {max(peak, 0)} B, less than one page "
                          f"({self.resolution} B): the allocator served the call from memory it already held")
        return peak, None


def timed_first_call(step: Callable[[], Any], cuda: bool) -> tuple[float, dict[str, Any]]:
    """Run ``step()`` once: its wall time and the process-level memory figure of the call (peak CUDA
    allocation on a GPU, else :class:`PeakRSS` where ``/proc`` exists), as record metrics."""
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        return first, {"peak_cuda_allocated_bytes": int(torch.cuda.max_memory_allocated() - base),
                       "mem_method": MEM_METHOD_CUDA}
    if PeakRSS.available():
        _trim_allocator()
        rss = PeakRSS()
        rss.reset()
        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        peak, note = rss.measured()
        mem = {"peak_rss_bytes": peak, "mem_method": rss.method, "rss_resolution_bytes": rss.resolution}
        if note:
            mem["rss_note"] = note
        return first, mem
    t0 = time.perf_counter()  # no /proc (not Linux)
    step()
    first = time.perf_counter() - t0
    return first, {"peak_rss_bytes": None, "rss_note": "not measured (no /proc/self/status on this system)"}
