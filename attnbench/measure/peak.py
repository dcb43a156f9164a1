"""Peak memory of a training run: CUDA ``max_memory_allocated`` above the start, or on a CPU the process's peak
RSS above its RSS at the start (a process-level measure that includes the allocator's caching)."""

from __future__ import annotations

from typing import Optional


def _glibc():
    """glibc, or None where the C library is another (the malloc calls below are then no-ops)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


def malloc_trim() -> None:
    """glibc ``malloc_trim(0)``: hand freed heap back to the OS, so a baseline is what is live (no-op elsewhere)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP_BYTES = 64 << 20


def keep_freed_memory() -> None:
    """Let glibc's malloc keep up to 64 MiB of freed memory in the process (no-op elsewhere). A training step
    frees and makes again the same tensors every step; by default glibc maps blocks over its dynamic threshold
    (from 128 KiB) afresh and gives a freed heap top back to the kernel, so the next step page-faults them in
    again: 700-1,800 faults and 2-5% of a recall-tiny step on the CPU (benchmarks/README.md). Blocks under
    32 MiB now come from the heap and up to 64 MiB of free heap top is kept. Changes no number a step computes
    (torch aligns every block the same way); :class:`PeakMeter` trims before its baseline, so a peak stays the
    memory the run itself added."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES // 2)
        libc.mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)


class PeakMeter:
    """Started on construction; :meth:`read` -> ``(peak bytes above the start, or None when unavailable or below
    the measurement's resolution, and how it was measured)``."""

    def __init__(self, device) -> None:
        import torch

        self.device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self._base = torch.cuda.memory_allocated(device)
            return
        from attnbench.measure.memory import PeakRSS

        malloc_trim()
        self._rss: Optional[PeakRSS] = PeakRSS() if PeakRSS.available() else None
        if self._rss is not None:
            self._rss.reset()

    def read(self) -> tuple[Optional[int], str]:
        import torch

        if self.device.type == "cuda":
            return (torch.cuda.max_memory_allocated(self.device) - self._base,
                    "CUDA max_memory_allocated above the allocation at the start")
        if self._rss is None:
            return None, "unavailable (no /proc/self/status)"
        how = "VmHWM reset via clear_refs" if self._rss.resettable else "VmHWM, no reset"
        method = (f"CPU: peak RSS of the rank-0 process during the run minus its RSS at the start after "
                  f"malloc_trim ({how}; process-level, includes allocator caching)")
        peak, why = self._rss.measured()  # a rise below one page is not a measurement of 0 bytes
        return (peak, method) if peak is not None else (None, f"{method}; {why}")
