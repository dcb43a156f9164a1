"""Issue 16: every mechanism's CPU fast path against its physical limit, as ratios measured in one run.

    python benchmarks/bench_fast_paths.py [--n 4096 16384] [--repeats 7] [--threads 2] [--only nala,linear]

fp32, B = 1, H = 4, d = 64, bidirectional, forward and forward + backward. Each mechanism's time is divided by
the time of its two bare core matmuls on precomputed features of the same size, ``fq @ (fk^T v)`` (M = 64 or
128 features; PolaFormer's two query streams of 2d features each against half the values are the same flops as
one), forward and forward + backward (gradients of q, k, v and every parameter; of fq, fk, v for the matmuls).
Performer (at m = 64 features, linear's feature count) and LaplacianFormer (64 landmarks) are divided by linear's
time. Each pair is timed interleaved (one call of each per round), the median of the rounds gives the ratio.

Targets (issue 16): linear, relu_linear, stella <= 1.5x their bare matmuls; nala, mirrorla, polaformer, flatten,
hedgehog, cosformer <= 2.5x; performer <= 2x linear, with memory linear in N; laplacian <= 3x linear.

``--backward-gain``: forward + backward of every mechanism whose bidirectional training runs through the
recomputing backward (``ops.linear_attention_recomputed``), against the same mechanism with
``recompute_backward = False`` (autograd through the blocked op), interleaved; ratio = autograd ÷ recomputing.

No timing without a correctness check first, twice: the fast form against the quadratic reference at N = 7 and
129 (fp32, forward and gradients, :func:`attnbench.checks.verify.verify`), and at the timed shape against the plain
O(N) form (the reference feature maps on the whole sequence, then the associative product; quadratic reference
for laplacian at N <= 4096) under the tolerance policy: fp32 fast vs fp32 plain vs fp64 plain, with the gradients
(q, k, v and every parameter) when timing forward + backward. A failed check is printed and that timing skipped;
the script then exits 1.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.nn.functional as F

import attnbench
from attnbench.measure.memory import TensorMemory
from attnbench.measure.timing import round_robin
from attnbench.checks.verify import agreement, verify
from attnbench.ops import linear_attn as la
from attnbench.results.provenance import machine, machine_line

B, H, D = 1, 4, 64
TARGETS = {"linear": 1.5, "relu_linear": 1.5, "stella": 1.5, "nala": 2.5, "mirrorla": 2.5, "polaformer": 2.5,
           "flatten": 2.5, "hedgehog": 2.5, "cosformer": 2.5}
FEATURES = {"nala": 2 * D, "polaformer": 2 * D, "hedgehog": 2 * D, "cosformer": 2 * D}
VS_LINEAR = {"performer": 2.0, "laplacian": 3.0}
OPTIONS = {"performer": {"features": D}, "laplacian": {"landmarks": 64}}
FAILED: list[str] = []


def build(name: str, n: int):
    opts = dict(OPTIONS.get(name, {}))
    if name == "cosformer":
        opts["max_len"] = n
    torch.manual_seed(0)
    return attnbench.build(name, heads=H, head_dim=D, **opts)


def plain(attn):
    """The plain O(N) form of ``attn`` (bidirectional): reference feature maps on the whole sequence, then the
    associative product; None where there is none (laplacian: its quadratic reference, small N only)."""
    name = attn.name
    if isinstance(attn, attnbench.attention.base.FeatureMapAttention):
        fmap = attn.feature_map
        return lambda q, k, v: la.linear_attention_bidirectional(fmap.phi_q_reference(q), fmap.phi_k_reference(k),
                                                                 v, eps=attn.eps)
    if name == "stella":
        return lambda q, k, v: F.relu(q) @ (F.relu(k).transpose(-1, -2) @ v) / attn._scale(q.shape[-2], q)
    if name == "polaformer":
        def pola(q, k, v):
            s, p = attn._params(q.dtype)
            q_sim, q_opp = attn.query_streams(q, s, p, False)
            kf = attn.key_features(k, s, p, False)
            v1, v2 = v.chunk(2, dim=-1)
            return torch.cat([la.linear_attention_bidirectional(q_sim, kf, v1, eps=attn.eps),
                              la.linear_attention_bidirectional(q_opp, kf, v2, eps=attn.eps)], -1)
        return pola
    if name == "performer":
        from attnbench.attention.performer import _stable_features

        def perf(q, k, v):
            fq, fk, s = _stable_features(attn.feature_map, q, k)
            return la.linear_attention_bidirectional(fq, fk * torch.exp(s - s.amax(-2, keepdim=True)), v)
        return perf
    return None


def inputs(n: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(dtype) for _ in range(3)]


def checked(name: str, n: int, mode: str) -> bool:
    """Both correctness checks of the module docstring; prints and records a failure."""
    for small in (7, 129):
        r = verify(name, causal=False, impl="torch", seq_len=small, dtype=torch.float32)
        if not r.ok:
            FAILED.append(f"{name} N={small}: {r.status} {r.detail}")
            print(f"   FAIL {FAILED[-1]}; not timed")
            return False
    attn32 = build(name, n)
    attn64 = copy.deepcopy(attn32).double()
    ref32, ref64 = plain(attn32), plain(attn64)
    if ref32 is None:
        if n > 4096:
            return True  # checked at small N above (and at 4096 when that is timed too)
        ref32, ref64 = attn32.reference, attn64.reference
    weight = torch.randn(B, H, n, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    grad = mode == "fwd+bwd"
    trained = [p for p in attn32.parameters() if p.requires_grad]  # parameter gradients are held too
    a = agreement(attn32, ref32, inputs(n, torch.float64), dtype=torch.float32, weight=weight if grad else None,
                  params=trained, reference64=ref64, params64=[p for p in attn64.parameters() if p.requires_grad],
                  names=["output", "grad q", "grad k", "grad v"] + [f"grad {pn}" for pn, p in attn32.named_parameters()
                                                                    if p.requires_grad])
    if not a.ok:
        FAILED.append(f"{name} N={n} {mode}: {a.describe()}")
        print(f"   FAIL {FAILED[-1]}; not timed")
    return a.ok


def timed(fn_fwd, args, mode: str, params=()):
    """A callable running ``fn_fwd(*args)`` (no autograd) or its forward + backward into args and params."""
    if mode == "fwd":
        def run():
            with torch.no_grad():
                fn_fwd(*args)
        return run
    leaves = [t.detach().requires_grad_() for t in args]
    g = torch.randn(B, H, args[0].shape[-2], D, generator=torch.Generator().manual_seed(3))

    def run():
        out = fn_fwd(*leaves)
        torch.autograd.grad(out, leaves + list(params), g)
    return run


def bare(n: int, m: int, mode: str):
    gen = torch.Generator().manual_seed(1)
    fq, fk = torch.rand(B, H, n, m, generator=gen), torch.rand(B, H, n, m, generator=gen)
    v = torch.randn(B, H, n, D, generator=gen)
    return timed(lambda a, b, c: a @ (b.transpose(-1, -2) @ c), [fq, fk, v], mode)


def mech(name: str, n: int, mode: str):
    attn = build(name, n)
    return timed(attn, inputs(n), mode, [p for p in attn.parameters() if p.requires_grad])


def backward_gain(names, ns, repeats: int) -> None:
    """``--backward-gain`` of the module docstring (both forms checked against the reference first)."""
    print("forward + backward, autograd through the blocked op ÷ the recomputing backward (higher is better)")
    for n in ns:
        for name in names:
            attn = build(name, n)
            if not hasattr(attn, "recompute_backward") or (hasattr(attn, "feature_map")
                                                            and attn.feature_map.block_functions(n) is None):
                continue
            if not checked(name, n, "fwd+bwd"):
                continue
            plain_attn = build(name, n)
            plain_attn.recompute_backward = False
            x = inputs(n)
            params = lambda a: [p for p in a.parameters() if p.requires_grad]  # noqa: E731
            t = round_robin({"recomputed": timed(attn, x, "fwd+bwd", params(attn)),
                             "autograd": timed(plain_attn, x, "fwd+bwd", params(plain_attn))}, repeats)
            print(f"   N={n:6d} {name:12s} {t['autograd'] / t['recomputed']:5.2f}x  "
                  f"({t['recomputed'] * 1e3:.1f} ms vs {t['autograd'] * 1e3:.1f} ms)")


def performer_memory(n: int) -> int:
    """Bytes of tensors created by a performer forward beyond its output
    (:class:`attnbench.measure.memory.TensorMemory`)."""
    attn = build("performer", n)
    q, k, v = inputs(n)
    with torch.no_grad(), TensorMemory() as mem:
        out = attn(q, k, v)
    return mem.peak - out.numel() * out.element_size()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated mechanisms (default: every target)")
    ap.add_argument("--modes", default="fwd,fwd+bwd")
    ap.add_argument("--backward-gain", action="store_true",
                    help="recomputing backward vs autograd through the blocked op, instead of the ratios")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_line(machine()))
    names = [s for s in args.only.split(",") if s] or [*TARGETS, *VS_LINEAR]
    if args.backward_gain:
        backward_gain(names, args.n, args.repeats)
        return 1 if FAILED else 0
    modes = args.modes.split(",")
    print(f"fp32, B={B} H={H} d={D}, bidirectional, {torch.get_num_threads()} threads, median of {args.repeats} "
          f"interleaved rounds; ratio = mechanism / reference (lower is better)")
    rows = []
    for n in args.n:
        for mode in modes:
            print(f"N={n} {mode}")
            for name in names:
                if not checked(name, n, mode):
                    continue
                if name in TARGETS:
                    m = FEATURES.get(name, D)
                    t = round_robin({"mech": mech(name, n, mode), "bare": bare(n, m, mode)}, args.repeats)
                    versus, target = f"its bare matmuls (M={m})", TARGETS[name]
                    ratio = t["mech"] / t["bare"]
                else:
                    if not checked("linear", n, mode):
                        continue
                    t = round_robin({"mech": mech(name, n, mode), "linear": mech("linear", n, mode)}, args.repeats)
                    versus, target = "linear", VS_LINEAR[name]
                    ratio = t["mech"] / t["linear"]
                ok = ratio <= target
                rows.append((name, n, mode, ratio, target, ok))
                print(f"   {'ok  ' if ok else 'MISS'} {name:12s} {ratio:5.2f}x {versus}  (target <= {target}x)")
    if "performer" in names:
        mem = {n: performer_memory(n) for n in args.n}
        small, big = min(args.n), max(args.n)
        grow = mem[big] / max(mem[small], 1)
        ok = grow <= 1.05 * big / small
        verdict = "ok, at most linear" if ok else "MISS: superlinear"
        print("performer memory beyond the output (tensors created by a forward): "
              + ", ".join(f"N={n}: {mem[n] / 2**20:.1f} MiB" for n in args.n)
              + f" -> x{grow:.2f} for x{big / small:.0f} tokens ({verdict})")
    misses = [r for r in rows if not r[5]]
    print(f"{len(rows) - len(misses)} of {len(rows)} ratios within target" +
          ("" if not misses else "; missed: " + ", ".join(f"{r[0]} N={r[1]} {r[2]} {r[3]:.2f}x" for r in misses)))
    if FAILED:
        print(f"{len(FAILED)} correctness check(s) failed; those timings were skipped")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
