"""Whether a process of this host is still the one that started a run or took a lease (``/proc`` start times,
so a reused pid is told apart)."""

from __future__ import annotations

import os


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc/<pid>/stat``), else None:
    with the pid it identifies a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` of this host exists (and, if ``start`` is given and ``/proc`` is readable, is
    the same process that started then, not a later one that got the same pid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    except OSError:
        return False
    if start is not None:
        now = process_start(pid)
        if now is not None and now != start:
            return False
    return True
