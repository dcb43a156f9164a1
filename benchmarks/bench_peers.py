"""attnbench beside the pip peers that implement the same math, as ratios measured in one run.

    pip install -e '.[peers]'             # performer-pytorch, nystrom-attention, linformer
    python benchmarks/bench_peers.py [--n 4096 16384] [--repeats 7] [--threads 2]

fp32, B = 1, H = 4, d = 64, forward and forward + backward. Per pair, the peer's parameters are transplanted into
attnbench's mechanism (or the other way round), the outputs are checked to agree under the tolerance policy
(:mod:`attnbench.checks.tolerance`: attnbench's error against the peer in float64 at most 4x the peer's own float32
error, plus the float32 floor), and only then both are timed, interleaved round by round; the ratio is
peer / attnbench (above 1: attnbench is faster).

- ``linear`` causal (ELU+1) vs FLA's ``naive_chunk_linear_attn`` (normalised, the same ELU+1 features computed in
  the timed call, [B, T, H, D] layout prepared outside it);
- ``linear`` bidirectional and causal vs fast-transformers' ``LinearAttention`` / ``CausalLinearAttention``
  (its C++ causal kernel) -- only if fast-transformers is already installed (its build takes ~25 minutes);
- ``performer`` vs performer-pytorch's ``FastAttention`` (same projection matrix; its feature eps of 1e-4, a
  bias of its own, set to 0 for the comparison);
- ``nystromformer`` vs nystrom-attention's ``NystromAttention`` layer (its q/k/v and output projections and its
  kernel-33 residual convolution around attnbench's core, weights shared, landmarks 256, 6 pinv iterations; its
  pseudo-inverse's initial scale, a max over the whole batch and all heads, taken per matrix as attnbench does,
  or the gradients differ by more than the tolerance);
- ``linformer`` vs linformer's ``LinformerSelfAttention`` layer (projections shared, k = 256).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch
import torch.nn.functional as F
from torch import nn

import attnbench
from attnbench.measure.timing import round_robin
from attnbench.checks.verify import agreement
from attnbench.results.provenance import machine, machine_line

B, H, D = 1, 4, 64
FAILED: list[str] = []


def qkv(n: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, n, D, generator=g, dtype=torch.float64).to(dtype) for _ in range(3)]


def tokens(n: int, dtype=torch.float32):
    return [torch.randn(B, n, H * D, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)]


# --- the pairs: (label, attnbench callable, peer callable, inputs), built for float32 or float64 -------------------

def fla_pair(n: int, dtype):
    from fla.ops.linear_attn.naive import naive_chunk_linear_attn

    ours = attnbench.build("linear", heads=H, head_dim=D, causal=True).to(dtype)

    def peer(q, k, v):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))                  # [B, T, H, D]
        o = naive_chunk_linear_attn(F.elu(qt) + 1, F.elu(kt) + 1, vt, scale=1.0, normalize=True)
        return o.transpose(1, 2)
    return ours, peer, qkv(n, dtype)


def fast_transformers_pairs(n: int, dtype):
    from fast_transformers.attention import CausalLinearAttention, LinearAttention
    from fast_transformers.masking import LengthMask, TriangularCausalMask

    out = []
    for causal, cls in ((False, LinearAttention), (True, CausalLinearAttention)):
        ours = attnbench.build("linear", heads=H, head_dim=D, causal=causal).to(dtype)
        ft = cls(D, eps=1e-12)
        mask = TriangularCausalMask(n) if causal else None

        def peer(q, k, v, ft=ft, mask=mask):
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))              # [B, N, H, D]
            lengths = LengthMask(torch.full((B,), n, dtype=torch.long), max_len=n)
            return ft(qt, kt, vt, mask, lengths, lengths).transpose(1, 2)
        out.append((f"linear {'causal' if causal else 'bidir'} vs fast-transformers {cls.__name__}", ours, peer,
                    qkv(n, dtype)))
    return out


def performer_pair(n: int, dtype, m: int = 128):
    import performer_pytorch.performer_pytorch as pp

    ours = attnbench.build("performer", heads=H, head_dim=D, features=m).to(dtype)
    fa = pp.FastAttention(dim_heads=D, nb_features=m).to(dtype)
    fa.projection_matrix.copy_(ours.feature_map.projection.to(dtype))     # [m, D], the same random features
    kernel = pp.softmax_kernel

    def peer(q, k, v):
        pp.softmax_kernel = lambda *a, **kw: kernel(*a, **{**kw, "eps": 0.0})  # its +1e-4 feature bias off
        try:
            return fa(q, k, v)
        finally:
            pp.softmax_kernel = kernel
    return ours, peer, qkv(n, dtype)


class _Layer(nn.Module):
    """A peer layer's own projections around an attnbench core: ``x -> (q, k, v) -> core -> out``."""

    def __init__(self, qkv_fn, core, out_fn):
        super().__init__()
        self.qkv_fn, self.core, self.out_fn = qkv_fn, core, out_fn

    def forward(self, x):
        q, k, v = (t.reshape(B, -1, H, D).transpose(1, 2) for t in self.qkv_fn(x))   # [B, H, N, D]
        return self.out_fn(self.core(q, k, v).transpose(1, 2).reshape(B, -1, H * D))


def _per_matrix_pinv(x, iters=6):
    """nystrom-attention's ``moore_penrose_iter_pinv`` with its initial scale taken per matrix instead of over
    the whole batch and all heads (attnbench's choice, which keeps heads independent); otherwise its code."""
    abs_x = torch.abs(x)
    col, row = abs_x.sum(dim=-1), abs_x.sum(dim=-2)
    z = x.transpose(-1, -2) / (col.amax(-1) * row.amax(-1))[..., None, None]
    eye = torch.eye(x.shape[-1], device=x.device, dtype=x.dtype)[None]
    for _ in range(iters):
        xz = x @ z
        z = 0.25 * z @ (13 * eye - (xz @ (15 * eye - (xz @ (7 * eye - xz)))))
    return z


def nystrom_pair(n: int, dtype, m: int = 256):
    import nystrom_attention.nystrom_attention as na
    from nystrom_attention import NystromAttention

    na.moore_penrose_iter_pinv = _per_matrix_pinv  # the same pinv initialisation on both sides (see above)
    torch.manual_seed(0)
    peer = NystromAttention(dim=H * D, dim_head=D, heads=H, num_landmarks=m, pinv_iterations=6).to(dtype)
    core = attnbench.build("nystromformer", heads=H, head_dim=D, landmarks=m, pinv_iters=6, conv_kernel=33)
    core = core.to(dtype)
    with torch.no_grad():
        core.conv_weight.copy_(peer.res_conv.weight)                          # [H, 1, 33, 1]
    ours = _Layer(lambda x: peer.to_qkv(x).chunk(3, dim=-1), core, peer.to_out)
    return ours, peer, tokens(n, dtype)


def linformer_pair(n: int, dtype, kdim: int = 256):
    from linformer import LinformerSelfAttention

    torch.manual_seed(0)
    peer = LinformerSelfAttention(dim=H * D, seq_len=n, k=kdim, heads=H).to(dtype)
    core = attnbench.build("linformer", heads=H, head_dim=D, seq_len=n, proj_dim=kdim).to(dtype)
    with torch.no_grad():
        core.E.copy_(peer.proj_k.T)                                           # [k, N]
        core.F.copy_(peer.proj_v.T)
    ours = _Layer(lambda x: (peer.to_q(x), peer.to_k(x), peer.to_v(x)), core, peer.to_out)
    return ours, peer, tokens(n, dtype)


def pairs(n: int):
    """``(label, builder)`` for every peer installed; a missing one is named."""
    have = {name: importlib.util.find_spec(name) is not None for name in
            ("fla", "fast_transformers", "performer_pytorch", "nystrom_attention", "linformer")}
    out = []
    if have["fla"]:
        out.append(("linear causal vs FLA naive_chunk_linear_attn", lambda dt: fla_pair(n, dt)))
    if have["fast_transformers"]:
        for i in range(2):
            out.append((f"fast-transformers {i}", lambda dt, i=i: fast_transformers_pairs(n, dt)[i][1:]))
    else:
        print("   (fast-transformers is not installed: its ELU+1 and C++ causal kernel are not compared; "
              "pip install pytorch-fast-transformers builds it in ~25 minutes)")
    for mod, label, fn in (("performer_pytorch", "performer vs performer-pytorch FastAttention", performer_pair),
                           ("nystrom_attention", "nystromformer layer vs nystrom-attention NystromAttention",
                            nystrom_pair),
                           ("linformer", "linformer layer vs linformer LinformerSelfAttention", linformer_pair)):
        if have[mod]:
            out.append((label, lambda dt, fn=fn: fn(n, dt)))
        else:
            print(f"   ({mod} is not installed: pip install -e '.[peers]')")
    return out


def agree(label: str, build, mode: str) -> bool:
    """attnbench (fp32) against the peer in fp64, ruled by the peer's own fp32 error (the tolerance policy)."""
    ours, peer, _ = build(torch.float32)
    _, peer64, x64 = build(torch.float64)
    weight = torch.randn(x64[0].shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    a = agreement(ours, peer, x64, dtype=torch.float32, weight=weight if mode == "fwd+bwd" else None,
                  reference64=peer64)
    if not a.ok:
        FAILED.append(f"{label} {mode}: {a.describe()}")
        print(f"   FAIL outputs disagree: {FAILED[-1]}; not timed")
    return a.ok


def timed(fn, xs, mode):
    if mode == "fwd":
        def run():
            with torch.no_grad():
                fn(*xs)
        return run
    leaves = [x.detach().requires_grad_() for x in xs]
    params = [p for p in (fn.parameters() if isinstance(fn, nn.Module) else []) if p.requires_grad]
    out_shape = fn(*leaves).shape
    g = torch.randn(out_shape, generator=torch.Generator().manual_seed(3))

    def run():
        torch.autograd.grad(fn(*leaves), leaves + params, g)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="fwd,fwd+bwd")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_line(machine()))
    print(f"fp32, B={B} H={H} d={D}, {torch.get_num_threads()} threads, median of {args.repeats} interleaved "
          f"rounds; ratio = peer time / attnbench time (above 1: attnbench faster)")
    for n in args.n:
        for mode in args.modes.split(","):
            print(f"N={n} {mode}")
            for label, build in pairs(n):
                if not agree(label, build, mode):
                    continue
                ours, peer, xs = build(torch.float32)
                t = round_robin({"ours": timed(ours, xs, mode), "peer": timed(peer, xs, mode)}, args.repeats)
                print(f"   {label:58s} {t['peer'] / t['ours']:5.2f}x")
    if FAILED:
        print(f"{len(FAILED)} comparison(s) disagreed; not timed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
