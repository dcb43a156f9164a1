"""The CPU performance targets of issue 3, as ratios measured in one run (fp32, B = 1, H = 4, d = 64).

    python benchmarks/perf_targets.py [--quick]

1. bidirectional forward at N = 16384 vs the two core matmuls alone at the same shapes (phi_k^T v, phi_q S);
2. causal chunked vs bidirectional at N = 16384, and chunked vs the token-by-token recurrence at N = 4096;
3. every linear mechanism vs softmax (SDPA) at N = 16384; laplacian (64 landmarks) vs linear at 16384;
4. nala bidirectional peak memory at N = 65536 vs the bytes of its inputs and output (child process, VmHWM).

A timing is only taken after the mechanism's fast form agreed with its reference at a small shape (fp32,
N = 7 and 129, under the tolerance policy of ``attnbench.checks.tolerance``). A failed gate is reported, that timing
(and the ratios built on it) is skipped, the rest runs, and the script exits 1 at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time

import torch

import attnbench
from attnbench.checks.verify import verify
from attnbench.results.provenance import machine_line
from attnbench.ops import linear_attention_chunked, linear_attention_recurrent

B, H, D = 1, 4, 64
LINEAR = ["linear", "relu_linear", "stella", "flatten", "nala", "mirrorla", "polaformer"]
TARGET_1 = {"linear": 1.3, "relu_linear": 1.3, "stella": 1.3, "flatten": 1.3, "nala": 2.0, "mirrorla": 2.0,
            "polaformer": 2.0}


def median_time(fn, reps: int = 7, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


GATE_FAILURES: list[str] = []


def gate(name: str, causal: bool) -> bool:
    """Whether ``name``'s CPU fast form agrees with its reference (fp32, N = 7 and 129); a failure is printed and
    recorded in GATE_FAILURES, and the caller skips that timing."""
    for n in (7, 129):
        r = verify(name, causal=causal, impl=attnbench.get_attention(name).cpu_impl, seq_len=n,
                   dtype=torch.float32)
        if not r.ok:
            msg = f"correctness gate failed for {name} (causal={causal}, N={n}): {r.status} {r.detail}"
            print(f"   FAIL {msg}; not timed")
            GATE_FAILURES.append(msg)
            return False
    return True


def inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=g) for _ in range(3))


def feature_size(name: str) -> int:
    return {"nala": 2 * D, "polaformer": 2 * D}.get(name, D)


def two_matmuls(n: int, m: int):
    g = torch.Generator().manual_seed(1)
    fq, fk, v = torch.rand(B, H, n, m, generator=g), torch.rand(B, H, n, m, generator=g), torch.randn(B, H, n, D)
    return lambda: fq @ (fk.transpose(-1, -2) @ v)


def _peak_child(name: str, n: int, queue) -> None:
    def hwm() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    torch.set_num_threads(2)
    attn = attnbench.build(name, heads=H, head_dim=D)
    q, k, v = inputs(256)
    with torch.no_grad():
        attn(q, k, v)                                        # warm the allocator and code paths
        q, k, v = inputs(n)
        with open("/proc/self/clear_refs", "w") as f:    # reset the high-water mark to the current RSS
            f.write("5")
        base = hwm()                                     # the inputs exist
        out = attn(q, k, v)
        peak = hwm()
    io = 4 * out.numel() * out.element_size()            # q, k, v and the output
    queue.put({"extra": peak - base, "io": io, "total": 3 * out.numel() * 4 + (peak - base)})


def peak_memory(name: str, n: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=_peak_child, args=(name, n, queue))
    p.start()
    p.join()
    return queue.get(timeout=5)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="N = 4096 instead of 16384 (a smoke run)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(machine_line())  # the machine: CPU, ISA, threads, measured fp32 matmul GFLOP/s
    n = 4096 if args.quick else 16384
    figures: dict = {"N": n}
    with torch.no_grad():
        print(f"1. bidirectional forward / two core matmuls, N={n} (target <= 1.3x; nala, mirrorla, polaformer <= 2x)")
        q, k, v = inputs(n)
        t_lin = None
        for name in LINEAR:
            if not gate(name, False):
                continue
            attn = attnbench.build(name, heads=H, head_dim=D)
            t = median_time(lambda: attn(q, k, v))
            t_mm = median_time(two_matmuls(n, feature_size(name)))
            ratio = t / t_mm
            figures[f"t1/{name}"] = ratio
            t_lin = t if name == "linear" else t_lin
            figures[f"time/{name}"] = t
            mark = "ok " if ratio <= TARGET_1[name] else "MISS"
            print(f"   {mark} {name:12s} {ratio:5.2f}x  (target {TARGET_1[name]}x)")

        print(f"2. causal chunked / bidirectional at N={n} (target <= 2.5x); chunked vs recurrence at N=4096 (>= 20x)")
        for name in ("linear", "nala"):
            if f"time/{name}" not in figures or not gate(name, True):
                continue
            causal = attnbench.build(name, heads=H, head_dim=D, causal=True)
            ratio = median_time(lambda: causal(q, k, v)) / figures[f"time/{name}"]
            figures[f"t2/{name}"] = ratio
            print(f"   {'ok ' if ratio <= 2.5 else 'MISS'} {name:12s} causal/bidir {ratio:5.2f}x")
        fq, fk, v4 = (torch.rand(B, H, 4096, D) for _ in range(3))
        t_chunk = median_time(lambda: linear_attention_chunked(fq, fk, v4))
        t_rec = median_time(lambda: linear_attention_recurrent(fq, fk, v4), reps=2, warmup=0)
        figures["t2/recurrence_speedup"] = t_rec / t_chunk
        print(f"   {'ok ' if t_rec / t_chunk >= 20 else 'MISS'} chunked is {t_rec / t_chunk:.0f}x faster than the recurrence")

        print(f"3. softmax (SDPA) / linear mechanism at N={n} (target >= 20x); laplacian / linear (<= 3x)")
        soft = attnbench.build("softmax", heads=H, head_dim=D)
        t_soft = median_time(lambda: soft(q, k, v), reps=3, warmup=1)
        for name in LINEAR:
            if f"time/{name}" not in figures:
                continue
            speedup = t_soft / figures[f"time/{name}"]
            figures[f"t3/{name}"] = speedup
            print(f"   {'ok ' if speedup >= 20 else 'MISS'} {name:12s} {speedup:6.1f}x faster than softmax")
        if t_lin is not None and gate("laplacian", False):
            lap = attnbench.build("laplacian", heads=H, head_dim=D, landmarks=64)
            ratio = median_time(lambda: lap(q, k, v), reps=5) / t_lin
            figures["t3/laplacian_vs_linear"] = ratio
            print(f"   {'ok ' if ratio <= 3 else 'MISS'} laplacian(64 landmarks) / linear {ratio:.2f}x")

    n_mem = 16384 if args.quick else 65536
    mem = peak_memory("nala", n_mem)
    ratio = mem["total"] / mem["io"]
    figures["t4/nala_peak_over_io"] = ratio
    print(f"4. {'ok ' if ratio <= 2 else 'MISS'} nala bidirectional at N={n_mem}: peak {mem['total'] / 2**20:.0f} MiB "
          f"(inputs + {mem['extra'] / 2**20:.0f} MiB allocated by the call) = {ratio:.2f}x the "
          f"{mem['io'] / 2**20:.0f} MiB of inputs and output (target <= 2x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**figures, "gate_failures": GATE_FAILURES}, f, indent=2)
    if GATE_FAILURES:
        print(f"{len(GATE_FAILURES)} correctness gate(s) failed; those timings were skipped:")
        for msg in GATE_FAILURES:
            print(f"   {msg}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
