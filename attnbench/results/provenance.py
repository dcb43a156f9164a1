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
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parents[1]
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
def file_id(path: str | os.PathLike) -> str:
    """``name@sha256[:12]`` of a file (a teacher, a pretrained checkpoint): what a cell that starts from it records
    and hashes, so another file under the same name is another cell."""
    path = Path(path)
    return f"{path.name}@{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"


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


def in_history(commit: str | None, path: str | None = None) -> bool:
    """Whether ``commit`` is HEAD or an ancestor of it in the repository holding the attnbench sources."""
    if not commit:
        return False
    try:
        return subprocess.run(["git", "-C", path or str(PACKAGE_DIR), "merge-base", "--is-ancestor", commit, "HEAD"],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


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


# ISA extensions that decide CPU kernel speed (reported when /proc/cpuinfo lists them)
ISA_FLAGS = ("avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile", "avx2", "fma",
             "asimd", "sve")


@functools.lru_cache(maxsize=None)
def cpu_flags() -> tuple[str, ...]:
    """The ISA extensions of :data:`ISA_FLAGS` that ``/proc/cpuinfo`` lists for the first CPU (empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key = line.split(":", 1)[0].strip().lower()
            if key in ("flags", "features"):
                have = set(line.split(":", 1)[1].split())
                return tuple(f for f in ISA_FLAGS if f in have)
    except OSError:
        pass
    return ()


def matmul_gflops(*, n: int = 1024, seconds: float = 0.3, dtype: str = "float32") -> float:
    """Achieved GFLOP/s of an ``n``×``n`` matmul in ``dtype`` on the CPU with torch's current thread count: the
    median of calls repeated for about ``seconds`` (after one warm-up call). A yardstick of the machine, measured
    in the same process as the benchmark it labels."""
    import time

    import torch

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(getattr(torch, dtype))
    b = torch.randn(n, n, generator=gen).to(getattr(torch, dtype))
    out = torch.empty(n, n, dtype=a.dtype)
    torch.mm(a, b, out=out)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 2 * n**3 / times[len(times) // 2] / 1e9


_MEASURED: dict[str, Any] | None = None   # the last machine() measured in this process (environment() records it)


def machine(*, measure: bool = True, threads: int | None = None) -> dict[str, Any]:
    """The machine a benchmark runs on: CPU model, cores, torch's ISA level
    (``torch.backends.cpu.get_cpu_capability()``) and the ISA flags of ``/proc/cpuinfo``, torch threads, and
    (``measure``) a measured fp32 matmul GFLOP/s (:func:`matmul_gflops`, ~0.3 s) with ``threads`` torch threads
    (default: torch's current setting). Printed by every benchmark; once measured, :func:`environment` records it
    with every run this process starts."""
    global _MEASURED
    import torch

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        info: dict[str, Any] = {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "isa": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags": list(cpu_flags()),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        }
        if measure:
            info["matmul_fp32_gflops"] = round(matmul_gflops(), 1)
            _MEASURED = info
    finally:
        torch.set_num_threads(old)
    return info


def machine_line(info: dict[str, Any] | None = None) -> str:
    """One line for the top of a benchmark's output (``info``: :func:`machine`'s, measured now if None)."""
    info = machine() if info is None else info
    flags = ",".join(info.get("cpu_flags") or []) or "no flags listed"
    line = (f"machine: {info.get('cpu')} · {info.get('cores')} cores · ISA {info.get('isa')} ({flags}) · "
            f"torch {info.get('torch')}, {info.get('torch_threads')} thread(s)")
    if info.get("matmul_fp32_gflops") is not None:
        line += f" · fp32 matmul 1024² {info['matmul_fp32_gflops']:.0f} GFLOP/s (measured now)"
    return line


def device_name(device: str) -> str:
    """A human name for ``device``: the CPU model, or the CUDA device's name."""
    if device.startswith("cuda"):
        try:
            import torch

            return torch.cuda.get_device_name(torch.device(device))
        except Exception:  # noqa: BLE001 - a name is only a label
            return device
    return cpu_name()


def thread_counts() -> dict[str, int]:
    """This process's torch thread counts now, ``{"threads": intra-op, "interop_threads": inter-op}``: stored
    with every result (:meth:`attnbench.results.store.Run.record`), since a result's speed, and the order of a parallel
    reduction (so its last bits), depend on them. The runner sets them once per run; no op changes them."""
    import torch

    return {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()}


def environment(device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """The environment block stored with a run (and copied into every record); ``host["machine"]`` is the
    :func:`machine` this process measured last, if it measured one."""
    g = git_info()
    host: dict[str, Any] = {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": threads}
    if _MEASURED is not None:
        host["machine"] = dict(_MEASURED)
    return {
        "git_commit": g["commit"],
        "git_dirty": g["dirty"],
        "packages": package_versions(),
        "device": device,
        "device_name": device_name(device),
        "host": host,
    }


# An absolute path inside a string: a leading "/" not preceded by a word character, a dot or a slash.
_ABS_PATH = re.compile(r"(?<![\w./])/[^\s:'\",;=]+")


def portable(value: Any, root: Path) -> Any:
    """``value`` (a record's metrics or params, any JSON value) with every absolute path made machine-free: a path
    inside ``root`` (the project) relative to it, any other as ``.../<parent>/<name>`` (at most its last two parts,
    which name the cell's files), so a committed record names no machine's folders."""
    if isinstance(value, dict):
        return {k: portable(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v, root) for v in value]
    if not isinstance(value, str) or "/" not in value:
        return value
    root_text = str(root.resolve())

    def one(m: re.Match) -> str:
        path = m.group(0)
        if path == root_text or path.startswith(root_text + "/"):
            return os.path.relpath(path, root_text)
        return ".../" + "/".join([q for q in path.split("/") if q][-2:])

    return _ABS_PATH.sub(one, value)
