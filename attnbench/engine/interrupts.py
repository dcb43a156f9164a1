"""Long runs stop cleanly: a SIGTERM (``kill``) behaves like Ctrl-C, so the runners record the work in flight as
``interrupted`` (finished results are already in the store) and a re-run resumes."""

from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within the block, SIGTERM raises KeyboardInterrupt (main thread only; elsewhere a no-op)."""
    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")
    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
