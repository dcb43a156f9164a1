"""How much each form slows down when another busy process shares the CPUs, at each torch thread count,
measured in one run.

    python benchmarks/bench_contention.py [--n 16384] [--rounds 7] [--threads 1 2] [--busy-threads 1]

A busy child process (``--busy-threads`` threads of a pure spin loop) runs for the whole benchmark and is paused
and resumed (SIGSTOP / SIGCONT) round by round: every round times each form at each thread count once with the
machine quiet and once with the busy process running, so states, counts and forms are interleaved. Per form and
count the slowdown is median(contended) / median(quiet); the target (issue 16) is that attnbench's blocked path
degrades no worse than the plain PyTorch form of the same math at the same count. The ops never adapt their
thread count to the load (issue 24): the count is a run's parameter, and this study is what to choose it by on
a shared machine. The forms compared:

- linear bidirectional: attnbench (features block by block) vs the plain form (ELU+1 on the whole sequence,
  then ``phi(q) (phi(k)^T v)``);
- linear causal: attnbench vs FLA's ``naive_chunk_linear_attn`` (the same ELU+1 features), if FLA is installed.

Outputs are compared before any timing (max abs difference <= 1e-4). fp32, B = 1, H = 4, d = 64, forward.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import attnbench
from attnbench.ops import linear_attn as la
from attnbench.results.provenance import machine, machine_line

B, H, D = 1, 4, 64
SPIN = "import threading\ndef spin():\n    while True: pass\n" \
       "ts = [threading.Thread(target=spin) for _ in range({n})]\n[t.start() for t in ts]\n[t.join() for t in ts]"


def spin_process(threads: int) -> subprocess.Popen:
    # threads of pure Python spin; with the GIL only one runs at a time, so use one process per thread
    return [subprocess.Popen([sys.executable, "-c", SPIN.format(n=1)]) for _ in range(threads)]


def forms(n: int):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
    bidir = attnbench.build("linear", heads=H, head_dim=D)
    causal = attnbench.build("linear", heads=H, head_dim=D, causal=True)
    out = {
        "linear bidir, attnbench": lambda: bidir(q, k, v),
        "linear bidir, plain PyTorch": lambda: la.linear_attention_bidirectional(F.elu(q) + 1, F.elu(k) + 1, v),
        "linear causal, attnbench": lambda: causal(q, k, v),
    }
    try:
        from fla.ops.linear_attn.naive import naive_chunk_linear_attn
    except ImportError:
        print("   (FLA is not installed: the causal comparison is attnbench alone)")
        return out, [("linear bidir, attnbench", "linear bidir, plain PyTorch")]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    out["linear causal, FLA naive_chunk"] = lambda: naive_chunk_linear_attn(
        F.elu(qt) + 1, F.elu(kt) + 1, vt, scale=1.0, normalize=True).transpose(1, 2)
    return out, [("linear bidir, attnbench", "linear bidir, plain PyTorch"),
                 ("linear causal, attnbench", "linear causal, FLA naive_chunk")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts to compare")
    ap.add_argument("--busy-threads", type=int, default=1, help="spinning processes competing for the CPUs")
    args = ap.parse_args(argv)
    if any(t < 1 for t in args.threads):
        ap.error(f"--threads: every count must be >= 1, got {args.threads}")
    torch.set_num_threads(max(args.threads))
    print(machine_line(machine()))
    fns, pairs = forms(args.n)
    with torch.no_grad():
        for ours, plain in pairs:
            err = (fns[ours]() - fns[plain]()).abs().max().item()
            if err > 1e-4:
                print(f"FAILED: {ours} and {plain} differ by {err:.2e}; not timing")
                return 1
        for fn in fns.values():
            fn()
        busy = spin_process(args.busy_threads)
        times = {(name, t, state): [] for name in fns for t in args.threads for state in ("quiet", "busy")}
        try:
            for _ in range(args.rounds):
                for state, sig in (("busy", signal.SIGCONT), ("quiet", signal.SIGSTOP)):
                    for p in busy:
                        os.kill(p.pid, sig)
                    time.sleep(0.2)  # let the scheduler settle into the new state
                    for t in args.threads:
                        torch.set_num_threads(t)
                        for name, fn in fns.items():
                            t0 = time.perf_counter()
                            fn()
                            times[(name, t, state)].append(time.perf_counter() - t0)
        finally:
            for p in busy:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
    med = {key: statistics.median(ts) for key, ts in times.items()}
    print(f"fp32, B={B} H={H} N={args.n} d={D}, forward, {args.busy_threads} busy process(es), median of "
          f"{args.rounds} interleaved rounds")
    ref = med[(pairs[0][0], max(args.threads), "quiet")]
    for t in args.threads:
        for name in fns:
            slow = med[(name, t, "busy")] / med[(name, t, "quiet")]
            rel = med[(name, t, "busy")] / ref
            print(f"   {t} thread(s)  {name:34s} slowdown busy/quiet {slow:5.2f}x   busy time {rel:.2f}x the quiet "
                  f"bidir attnbench time at {max(args.threads)} thread(s)")
    ok = True
    for t in args.threads:
        for ours, plain in pairs:
            s_ours = med[(ours, t, "busy")] / med[(ours, t, "quiet")]
            s_plain = med[(plain, t, "busy")] / med[(plain, t, "quiet")]
            verdict = "ok" if s_ours <= s_plain * 1.1 else "MISS"
            ok &= verdict == "ok"
            print(f"   {verdict:4s} {t} thread(s): {ours} degrades {s_ours:.2f}x vs {s_plain:.2f}x for {plain}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
