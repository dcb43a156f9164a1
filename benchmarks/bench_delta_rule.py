"""CPU speed of attnbench's chunked delta rule against flash-linear-attention's naive PyTorch chunkwise forms.

    python benchmarks/bench_delta_rule.py [--n 4096] [--repeats 9] [--threads 2] [--chunk-size 64]
    python -m benchmarks.bench_delta_rule ...

fp32, B = 1, H = 4, d = 64 by default, forward only (no autograd graph). First the outputs and final states are
checked under the tolerance policy (``attnbench.checks.tolerance``: attnbench's fp32 error against the fp64 recurrence
within a multiple of FLA's own fp32 error), then every form is timed round-robin (one call of
each per round, so load from other processes hits all of them alike), and the median of the rounds is reported
with the ratio FLA / attnbench. Timings are ratios measured in one run, never bare seconds.

- DeltaNet: ``attnbench.ops.delta.delta_rule_chunked`` vs ``fla.ops.delta_rule.naive.delta_rule_chunkwise``
  (head-first ``[B, H, T, D]`` like attnbench; no initial state, N a multiple of its chunk) at FLA's default
  chunk (32) and at attnbench's chunk.
- Gated DeltaNet: the same with a log-space gate vs ``fla.ops.gated_delta_rule.naive.naive_chunk_gated_delta_rule``
  (``[B, T, H, D]``: converted once, outside the timed call).

Targets: attnbench >= 3x faster than FLA's ``delta_rule_chunkwise`` at its default chunk (the delta-rule op's
issue), and >= 1.5x on an AVX2-only CPU (issue 16, where it measured 0.83x).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from attnbench.measure.timing import round_robin
from attnbench.results.provenance import machine, machine_line
from attnbench.ops.delta import delta_rule_chunked, delta_rule_recurrent
from attnbench.checks.tolerance import compare

TARGET = 3.0
TARGET_AVX2 = 1.5


def make_inputs(B: int, H: int, N: int, D: int, seed: int = 0):
    """Stable inputs: L2-normalised q and k, beta in (0, 1), log-gates in (-inf, 0)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, N, D, generator=gen), dim=-1)           # [B, H, N, D]
    k = F.normalize(torch.randn(B, H, N, D, generator=gen), dim=-1)           # [B, H, N, D]
    v = torch.randn(B, H, N, D, generator=gen)                                # [B, H, N, D]
    beta = torch.rand(B, H, N, generator=gen)                                 # [B, H, N]
    g = F.logsigmoid(torch.randn(B, H, N, generator=gen) + 3.0)               # [B, H, N]
    return q, k, v, beta, g


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--n", type=int, default=4096, help="sequence length (a multiple of both chunk sizes)")
    ap.add_argument("--chunk-size", type=int, default=64, help="attnbench's chunk (default 64, its default)")
    ap.add_argument("--fla-chunk-size", type=int, default=32, help="FLA delta_rule_chunkwise's chunk (its default)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the project's CPUs have 2)")
    ap.add_argument("--no-gated", action="store_true", help="skip the Gated DeltaNet comparison")
    args = ap.parse_args(argv)

    try:
        from fla.ops.delta_rule.naive import delta_rule_chunkwise
    except ImportError as e:
        print(f"flash-linear-attention is needed for this comparison (pip install flash-linear-attention): {e}")
        return 2
    try:
        from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule
    except ImportError:
        naive_chunk_gated_delta_rule = None

    torch.set_num_threads(args.threads)
    info = machine()
    print(machine_line(info))
    B, H, N, D = args.batch, args.heads, args.n, args.head_dim
    for c in (args.chunk_size, args.fla_chunk_size):
        if N % c:
            ap.error(f"--n {N} must be a multiple of the chunk sizes (FLA's delta_rule_chunkwise asserts it), got {c}")
    q, k, v, beta, g = make_inputs(B, H, N, D)
    print(f"delta rule, fp32, B={B} H={H} N={N} d={D}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} interleaved rounds")

    ours = lambda: delta_rule_chunked(q, k, v, beta, output_final_state=True, chunk_size=args.chunk_size)  # noqa: E731
    fla_default = lambda: delta_rule_chunkwise(q, k, v, beta, chunk_size=args.fla_chunk_size)  # noqa: E731
    fla_same = lambda: delta_rule_chunkwise(q, k, v, beta, chunk_size=args.chunk_size)  # noqa: E731
    fns = {f"attnbench delta_rule_chunked (C={args.chunk_size})": ours,
           f"fla delta_rule_chunkwise (C={args.fla_chunk_size})": fla_default}
    if args.fla_chunk_size != args.chunk_size:
        fns[f"fla delta_rule_chunkwise (C={args.chunk_size})"] = fla_same
    gated = not args.no_gated and naive_chunk_gated_delta_rule is not None
    if gated:
        qt, kt, vt, bt, gt = (x.transpose(1, 2).contiguous() for x in (q, k, v, beta, g))  # [B, T, H, ...]
        fns[f"attnbench delta_rule_chunked gated (C={args.chunk_size})"] = (
            lambda: delta_rule_chunked(q, k, v, beta, g, output_final_state=True, chunk_size=args.chunk_size))
        fns["fla naive_chunk_gated_delta_rule (C=64)"] = (
            lambda: naive_chunk_gated_delta_rule(qt, kt, vt, gt, bt, chunk_size=64, output_final_state=True))

    ok = True
    with torch.no_grad():
        # correctness gate, no timing unless it passes: attnbench's fp32 output and final state against the fp64
        # recurrence (computed once per gating), within a multiple of FLA's own fp32 error (the tolerance policy)
        exact = {}

        def gate(label, ours_out, fla_out, gated_check):
            nonlocal ok
            if gated_check not in exact:
                exact[gated_check] = delta_rule_recurrent(q.double(), k.double(), v.double(), beta.double(),
                                                          g.double() if gated_check else None,
                                                          output_final_state=True)
            a = compare(list(ours_out), list(fla_out), list(exact[gated_check]), names=["output", "final state"],
                        dtype=torch.float32)
            print(f"  check {label}: {'ok' if a.ok else 'FAILED'} ({a.describe()})")
            ok &= a.ok
        o_s = ours()
        for name, fn in list(fns.items())[1:]:
            if "gated" not in name:
                gate(f"vs {name}", o_s, fn(), False)
        if gated:
            names = list(fns)
            o_ref, s_ref = fns[names[-1]]()
            gate(f"gated vs {names[-1]}", fns[names[-2]](), (o_ref.transpose(1, 2), s_ref), True)
        if not ok:
            print("FAILED: outside the tolerance policy; not timing")
            return 1
        med = round_robin(fns, args.repeats)

    names = list(fns)
    width = max(map(len, names))
    base = med[names[0]]
    for name in names:
        print(f"  {name:<{width}}  {med[name] * 1e3:9.2f} ms   {med[name] / base:5.2f}x attnbench")
    ratio = med[names[1]] / base
    verdict = "meets" if ratio >= TARGET else "MISSES"
    avx2 = not any(f.startswith("avx512") for f in info.get("cpu_flags") or [])
    extra = (f"; {'meets' if ratio >= TARGET_AVX2 else 'MISSES'} the {TARGET_AVX2}x target for an AVX2-only CPU"
             if avx2 else "")
    print(f"DeltaNet: attnbench is {ratio:.2f}x faster than FLA delta_rule_chunkwise at its default chunk "
          f"({verdict} the {TARGET:.0f}x target{extra})")
    if args.fla_chunk_size != args.chunk_size:
        print(f"DeltaNet: {med[names[2]] / base:.2f}x faster than delta_rule_chunkwise at the same chunk "
              f"({args.chunk_size})")
    if gated:
        print(f"Gated DeltaNet: attnbench is {med[names[-1]] / med[names[-2]]:.2f}x faster than FLA "
              f"naive_chunk_gated_delta_rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
