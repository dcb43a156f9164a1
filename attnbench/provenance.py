"""Provenance of a result: git commit, package versions, host and device, a canonical config hash.

Every record in the store carries these (see DESIGN.md, "Every result record carries"). Nothing here imports
torch at module level, so the store and the report can be used without it.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent
# Packages whose versions change numbers; recorded with every result (absent ones are left out).
TRACKED_PACKAGES = ("attnbench", "torch", "numpy", "triton", "flash-linear-attention", "torchvision")


def now() -> str:
    """UTC timestamp, ISO 8601 with seconds (sorts as text)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: equal configs give equal strings (and hashes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(obj: Any) -> str:
    """16 hex digits of sha256 over :func:`canonical_json` — the identity of a measured point."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def git_info(path: str | None = None) -> dict[str, Any]:
    """``{"commit": sha or None, "dirty": bool or None}`` of the repository holding the attnbench sources."""
    where = path or str(PACKAGE_DIR)
    try:
        sha = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip() or None
        if sha is None:
            return {"commit": None, "dirty": None}
        status = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=20).stdout
        return {"commit": sha, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


@functools.lru_cache(maxsize=None)
def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: str) -> str:
    """A human name for ``device``: the CPU model, or the CUDA device's name."""
    if device.startswith("cuda"):
        try:
            import torch

            return torch.cuda.get_device_name(torch.device(device))
        except Exception:  # noqa: BLE001 - a name is only a label
            return device
    return cpu_name()


def environment(device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """The environment block stored with a run (and copied into every record)."""
    g = git_info()
    return {
        "git_commit": g["commit"],
        "git_dirty": g["dirty"],
        "packages": package_versions(),
        "device": device,
        "device_name": device_name(device),
        "host": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "threads": threads,
        },
    }
