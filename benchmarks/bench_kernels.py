"""attnbench.kernels: CPU speed of the fused NaLa map, and a GPU compile check that needs no GPU.

    python benchmarks/bench_kernels.py [--n 16384] [--repeats 9] [--threads 2]       # NaLa fused vs reference
    python benchmarks/bench_kernels.py --compile-check [--arch 80] [--quick]        # every Triton kernel config

NaLa (fp32, B = 1, H = 4, d = 64): ``nala_feature_map_fused`` (PyTorch on cache-sized row blocks, in place, hand-
written backward) against ``nala_feature_map_reference`` (the plain map of Eqs. 6, 7, 11-13), forward and
forward+backward, query and key side. Outputs are first checked against the reference (max abs error <= 1e-4
relative), then the forms are timed round-robin (one call of each per round, so load from other processes hits
both alike) and the median of the rounds is reported with the ratio reference / fused, per side and for the
whole map (query + key). Target: >= 1.5x forward. (The unfused key map is cheap -- one power with a scalar
exponent -- and its time varies 2x with the allocator's state, so the key side's ratio spreads widest.)

Compile check: compiles each Triton kernel at the tile sizes the entry points choose, for a CUDA target
(default sm_80), through ptxas (shipped with triton), without a GPU, and reports shared memory, registers and
spilled bytes (ptxas -v) per config ("warn" on any spill); exits 1 if a config needs more shared memory than the
target has or spills more than 4 KiB.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

TARGET = 1.5


def bench_nala(n: int, repeats: int, threads: int) -> int:
    import torch

    from attnbench.bench import round_robin
    from attnbench.kernels import nala_feature_map_fused, nala_feature_map_reference

    if threads:
        torch.set_num_threads(threads)
    x = torch.randn(1, 4, n, 64, generator=torch.Generator().manual_seed(0))  # [B, H, N, d]
    g = torch.randn(1, 4, n, 128, generator=torch.Generator().manual_seed(1))  # [B, H, N, 2d]
    ok = True
    print(f"NaLa map, fp32, B=1 H=4 N={n} d=64, {torch.get_num_threads()} threads, median of {repeats} rounds")
    for is_query in (True, False):
        side = "query" if is_query else "key"
        ref = nala_feature_map_reference(x, is_query=is_query)
        err = (nala_feature_map_fused(x, is_query=is_query) - ref).abs().max().item()
        if err > 1e-4 * (ref.abs().max().item() + 1):
            print(f"  {side}: fused form disagrees with the reference (max abs error {err:.2e}); not timed")
            ok = False
            continue

        def fwd(f):
            def run():
                with torch.no_grad():
                    f(x, is_query=is_query)
            return run

        def fwd_bwd(f):
            def run():
                xr = x.detach().requires_grad_()
                torch.autograd.grad(f(xr, is_query=is_query), xr, g)
            return run

        for mode, wrap in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
            t = round_robin({"reference": wrap(nala_feature_map_reference), "fused": wrap(nala_feature_map_fused)},
                            repeats)
            ratio = t["reference"] / t["fused"]
            flag = "" if mode != "fwd" else ("  ok" if ratio >= TARGET else f"  BELOW TARGET {TARGET}x")
            print(f"  {side:5s} {mode:8s} reference/fused = {ratio:5.2f}x{flag}")
            ok &= mode != "fwd" or ratio >= TARGET

    def both(f):  # the whole map as an attention uses it: query side and key side
        def run():
            with torch.no_grad():
                f(x, is_query=True)
                f(x, is_query=False)
        return run

    t = round_robin({"reference": both(nala_feature_map_reference), "fused": both(nala_feature_map_fused)}, repeats)
    ratio = t["reference"] / t["fused"]
    flag = "  ok" if ratio >= TARGET else f"  BELOW TARGET {TARGET}x"
    print(f"  q + k fwd      reference/fused = {ratio:5.2f}x{flag}")
    return 0 if ok and ratio >= TARGET else 1


# ----------------------------------------------------------------------------------------------- compile check


def _configs(quick: bool):
    """(label, jit function, constexprs, pointer dtype, int args, float args, launch options) of every kernel
    at the tile sizes the entry points pick."""
    import torch

    import attnbench.kernels.laplace as lp
    import attnbench.kernels.linear_attn as la
    import attnbench.kernels.nala as nl
    from attnbench.kernels._util import LOWP_DTYPES, dot_precision, pow2

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    shapes = [(64, 64, 64), (256, 128, 64)] if quick else [(32, 32, 64), (64, 64, 64), (128, 64, 64),
                                                          (128, 128, 64), (256, 64, 64), (256, 128, 64)]
    ints = ("N", "M", "D", "offset")
    for dname, dt in dtypes.items():
        prec = dot_precision(dt)
        for M, D, chunk in shapes:
            fv, qk = la._tiles(M, D, chunk, dt)
            opts = dict(num_warps=fv["num_warps"], num_stages=fv["num_stages"])
            common = dict(PREC=prec, NORMALIZE=True, LOWP=dt in LOWP_DTYPES)
            tag = f"{dname} M={M} D={D}"
            tv, tq = f"BT={fv['BT']} BV={fv['BV']}", f"BT={qk['BT']} BK={qk['BK']}"
            yield (f"linear fwd {tag} {tv}", la._fwd_kernel, dict(BT=fv["BT"], BM=fv["BM"], BV=fv["BV"], HAS_S0=True,
                   HAS_Z0=True, **common), dname, ints, ("eps",), opts)
            yield (f"linear dq  {tag} {tq}", la._bwd_dq_kernel, dict(BT=qk["BT"], BK=qk["BK"], BD=qk["BD"],
                   HAS_S0=True, HAS_Z0=True, **common), dname, ints, (), opts)
            yield (f"linear dk  {tag} {tq}", la._bwd_dk_kernel, dict(BT=qk["BT"], BK=qk["BK"], BD=qk["BD"],
                   HAS_DST=True, HAS_DZT=True, **common), dname, ints, (), opts)
            yield (f"linear dv  {tag} {tv}", la._bwd_dv_kernel, dict(BT=fv["BT"], BM=fv["BM"], BV=fv["BV"],
                   HAS_DST=True, **common), dname, ints, (), opts)
        for D in (64,) if quick else (32, 64, 128):
            BR, warps = nl._rows_per_program(D)
            for q in (True, False):
                for label, fn in (("fwd", nl._nala_fwd_kernel), ("bwd", nl._nala_bwd_kernel)):
                    yield (f"nala {label} {dname} D={D} query={q}", fn, dict(BR=BR, BD=pow2(D, 1), IS_QUERY=q),
                           dname, ("R", "D"), ("lam", "tau", "eps"), dict(num_warps=warps))
        for label, fn in (("fwd", lp._l1_fwd_kernel), ("bwd x", lp._l1_bwd_x_kernel), ("bwd y", lp._l1_bwd_y_kernel)):
            yield (f"l1 {label} {dname}", fn, dict(BN=lp._L1_BN, BM=lp._L1_BM, BC=lp._L1_BC), dname,
                   ("N", "Mm", "d"), (), {})
        for m in (32, 128):
            cfg = lp._ns_tiles(m)
            yield (f"ns step {dname} m={m}", lp._ns_step_kernel, dict(BR=cfg["BR"], BM=cfg["BM"], BK=cfg["BK"],
                   PREC=prec), dname, ("m",), (), dict(num_warps=cfg["num_warps"]))


SPILL_BAD = 4096  # bytes of register spill (stores + loads) that fail the check; any spill at all is a "warn"
FP32_BUFFERS = ("r", "dden", "s0", "z0", "sT", "zT", "dsT", "dzT", "ds0", "dz0")  # states and per-token scalars


def compile_check(arch: int, quick: bool, only: str = "") -> int:
    os.environ.pop("TRITON_INTERPRET", None)  # compile for real, before triton is imported
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    smem_limit = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}.get(arch, 99 * 1024)
    target = GPUTarget("cuda", arch, 32)
    bad = 0
    print(f"compile check for sm_{arch} (shared memory limit {smem_limit // 1024} KiB)")
    for label, fn, consts, dname, ints, floats, opts in _configs(quick):
        if only and not all(word in label for word in only.split()):
            continue
        sig = {}
        for name in fn.arg_names:
            sig[name] = ("constexpr" if name in consts else "i32" if name in ints else "fp32" if name in floats
                         else "*fp32" if name in FP32_BUFFERS else f"*{dname}")
        try:
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target, options=opts)
        except Exception as e:  # noqa: BLE001 - report every failing config, then fail
            print(f"  FAIL {label}: {type(e).__name__}: {str(e)[:300]}")
            bad += 1
            continue
        with tempfile.NamedTemporaryFile(suffix=".ptx", mode="w") as f:
            f.write(k.asm["ptx"])
            f.flush()
            info = subprocess.run([ptxas, f"-arch=sm_{arch}", "-v", f.name, "-o", os.devnull], capture_output=True,
                                  text=True).stderr
        regs = int(re.search(r"Used (\d+) registers", info).group(1))
        spill = sum(int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", info))
        smem = k.metadata.shared
        verdict = "BAD " if smem > smem_limit or spill > SPILL_BAD else "warn" if spill else "ok  "
        bad += verdict == "BAD "
        print(f"  {verdict} {label:52s} warps={opts.get('num_warps', 4)} shared={smem // 1024:4d} KiB "
              f"regs={regs:3d} spill={spill} B")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16384, help="sequence length of the NaLa timing")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2, help="torch threads (0: torch's default)")
    p.add_argument("--compile-check", action="store_true", help="compile every kernel for a GPU target instead")
    p.add_argument("--arch", type=int, default=80, help="compute capability of the compile check (80 = A100)")
    p.add_argument("--quick", action="store_true", help="compile check: fewer configs")
    p.add_argument("--only", default="", help="compile check: configs whose label has all these words")
    a = p.parse_args(argv)
    if not a.compile_check:   # the compile check measures no speed (and needs no torch threads)
        import torch

        from attnbench.provenance import machine, machine_line

        if a.threads:
            torch.set_num_threads(a.threads)
        print(machine_line(machine()))
    if a.compile_check:
        return compile_check(a.arch, a.quick, a.only)
    return bench_nala(a.n, a.repeats, a.threads)


if __name__ == "__main__":
    sys.exit(main())
