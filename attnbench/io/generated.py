"""Generated data directories written all at once: a killed generation never leaves a directory that looks done."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

COMPLETE = "COMPLETE"


def materialize(d: Path, fill: Callable[[Path], None], params: dict[str, Any]) -> bool:
    """Make directory ``d`` by ``fill(tmp)`` into a temporary sibling, with ``params.json`` (what made it) and a
    ``COMPLETE`` marker, then rename it into place. Returns False (and does nothing) when ``d`` is already
    complete. When another process completes ``d`` first, its copy is kept (it may be reading it)."""
    d = Path(d)
    if (d / COMPLETE).exists():
        return False
    tmp = d.with_name(f"{d.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.perf_counter()
    fill(tmp)
    (tmp / "params.json").write_text(json.dumps(params, indent=1) + "\n")
    (tmp / COMPLETE).write_text(f"generated in {time.perf_counter() - t0:.1f} s\n")
    for _ in range(2):
        try:
            os.replace(tmp, d)  # refused while d exists and is not empty
            break
        except OSError:
            if (d / COMPLETE).exists():
                shutil.rmtree(tmp, ignore_errors=True)
                break
            shutil.rmtree(d, ignore_errors=True)  # leftovers of an older, incomplete layout
    return True


__all__ = ["COMPLETE", "materialize"]
