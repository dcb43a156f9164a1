"""The machine the doctor runs on: its versions, what they cannot do (one line each, before any work), and the
peak the achieved TFLOP/s are a share of."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from typing import Any, Optional

import torch
from packaging.version import Version

from attnbench.engine.smoke import GPU_PEAK_BF16
from attnbench.ops.delta import FLA_GATED_OPS, fla_gated_backward_refusal, fla_tilelang_usable
from attnbench.results import provenance

# Dense peaks from the vendors' data sheets (SXM parts), FLOP/s; fp32 without TF32 (torch's default for matmul).
GPU_PEAK = {name: {"bf16": peak, "fp16": peak} for name, peak in GPU_PEAK_BF16.items()}
GPU_PEAK["H100"]["fp32"] = 67e12
GPU_PEAK["A100"]["fp32"] = 19.5e12
GPU_PEAK["H200"] = dict(GPU_PEAK["H100"])   # the same compute as the H100 SXM, more and faster memory


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver() -> Optional[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def describe(device: torch.device) -> dict[str, Any]:
    """Versions and, on CUDA, the GPU: what the doctor prints first and stores with its run."""
    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda, "triton": _version("triton"),
        "flash-linear-attention": _version("flash-linear-attention"), "fla-core": _version("fla-core"),
        "tilelang": _version("tilelang"), "tilelang_usable": fla_tilelang_usable(), "device": device.type,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, capability=list(torch.cuda.get_device_capability(device)),
                   gpu_memory_gib=round(props.total_memory / 2 ** 30, 1), driver=_driver())
    else:
        env["machine"] = provenance.machine()
    return env


def lines(env: dict[str, Any]) -> list[str]:
    """The machine first, as every run prints it."""
    versions = " · ".join(f"{k} {env[k]}" for k in ("python", "torch", "triton", "flash-linear-attention",
                                                       "tilelang") if env.get(k))
    if env["device"] == "cuda":
        cap = env["capability"]
        return [f"machine: {env['gpu']} (sm_{cap[0]}{cap[1]}, {env['gpu_memory_gib']} GiB) · driver "
                f"{env.get('driver') or 'unknown'} · CUDA {env.get('cuda_runtime')}", f"versions: {versions}"]
    return [provenance.machine_line(env["machine"]), f"versions: {versions}"]


def limitations(env: dict[str, Any], device: torch.device) -> list[str]:
    """What this machine's versions cannot do, one line each with the remedy (empty: nothing known)."""
    out = []
    numpy = _version("numpy") or "0"
    if (os.environ.get("TRITON_INTERPRET") == "1" and env.get("triton")
            and Version(env["triton"]) < Version("3.7") and Version(numpy) >= Version("2.4")):
        out.append(f"Triton {env['triton']}'s interpreter cannot run attnbench's kernels with NumPy {numpy} (every "
                   "kernel loop fails: triton-lang/triton#9171, fixed in Triton 3.7); pip install 'numpy<2.4' for "
                   "the interpreter, compiled kernels are not affected")
    if env.get("triton") is None:
        out.append("no triton: attnbench's Triton kernels and torch.compile on CUDA cannot run; "
                   "pip install 'attnbench[gpu]'")
    if env.get("flash-linear-attention") is None:
        out.append("no flash-linear-attention: the delta-rule LM presets and FLA's chunk kernels cannot run on "
                   "CUDA; pip install 'attnbench[gpu]'")
    if device.type == "cuda":
        if tuple(env["capability"]) < (8, 0):
            out.append(f"sm_{env['capability'][0]}{env['capability'][1]} has no bf16: the bf16 presets (lm 340m, "
                       "recall zoology and mad, vision cifar10 and imagenet) cannot run; set precision = \"fp16\"")
        for mixer, op in FLA_GATED_OPS.items():
            refusal = fla_gated_backward_refusal(device, op=op, capability=tuple(env["capability"]),
                                                 triton_version=env.get("triton") or "0",
                                                 tilelang=env.get("tilelang_usable", bool(env.get("tilelang"))))
            if refusal:
                out.append(f"{mixer}: {refusal} (presets: lm 340m's {mixer} row, recall zoology and mad with it)")
    return out


def peak_flops(env: dict[str, Any], dtype: str) -> tuple[Optional[float], str]:
    """The peak the achieved FLOP/s are a share of, and what it is: the data sheet's dense peak of a known GPU in
    ``dtype``, or on the CPU the fp32 matmul GFLOP/s measured now."""
    if env["device"] == "cuda":
        for name, peaks in GPU_PEAK.items():
            if name in env["gpu"] and dtype in peaks:
                return peaks[dtype], f"{name} {dtype} dense peak {peaks[dtype] / 1e12:.0f} TFLOP/s (data sheet)"
        return None, f"no data-sheet peak known for {env['gpu']}"
    gflops = (env.get("machine") or {}).get("matmul_fp32_gflops")
    return ((gflops * 1e9, f"fp32 matmul 1024² measured now, {gflops:.0f} GFLOP/s") if gflops else
            (None, "no matmul measured"))


