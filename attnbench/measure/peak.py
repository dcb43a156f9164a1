"""Peak memory of a training run: CUDA ``max_memory_allocated`` above the start, or on a CPU the process's peak
RSS above its RSS at the start (a process-level measure that includes the allocator's caching)."""

from __future__ import annotations

from typing import Optional


def malloc_trim() -> None:
    """glibc ``malloc_trim(0)``: hand freed heap back to the OS, so a baseline is what is live (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
