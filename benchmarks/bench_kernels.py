"""The blocked NaLa map's CPU speed (attnbench.ops.nala_map) and a GPU compile check of the kernels without a GPU.

    python benchmarks/bench_kernels.py [--n 16384] [--repeats 9] [--threads 2]       # NaLa blocked vs reference
    python benchmarks/bench_kernels.py --compile-check [--arch 80,90] [--quick]     # every Triton kernel config

NaLa (fp32, B = 1, H = 4, d = 64): ``nala_feature_map_blocked`` (PyTorch on cache-sized row blocks, in place, hand-
written backward) against ``nala_feature_map_reference`` (the plain map of Eqs. 6, 7, 11-13), forward and
forward+backward, query and key side. Outputs are first checked against the reference (max abs error <= 1e-4
relative), then the forms are timed round-robin (one call of each per round, so load from other processes hits
both alike) and the median of the rounds is reported with the ratio reference / blocked, per side and for the
whole map (query + key). Target: >= 1.5x forward. (The unfused key map is cheap -- one power with a scalar
exponent -- and its time varies 2x with the allocator's state, so the key side's ratio spreads widest.)

Compile check (``attnbench.checks.aot``, also ``attnbench check --aot``): every configuration the kernels'
entry points can launch, in float32, float16 and bfloat16, and flash-linear-attention's chunk kernels at the LM
presets' head sizes, compiled for a CUDA target (default sm_90; ``--arch 80,90``) through ptxas without a GPU;
a table of shared memory, registers and spilled bytes; exits 1 if any configuration fails to compile or does not
fit (shared memory, register file).
"""

from __future__ import annotations

import argparse
import os
import sys

TARGET = 1.5


def bench_nala(n: int, repeats: int, threads: int) -> int:
    import torch

    from attnbench.measure.timing import round_robin
    from attnbench.kernels import nala_feature_map_reference
    from attnbench.ops.nala_map import nala_feature_map_blocked

    if threads:
        torch.set_num_threads(threads)
    x = torch.randn(1, 4, n, 64, generator=torch.Generator().manual_seed(0))  # [B, H, N, d]
    g = torch.randn(1, 4, n, 128, generator=torch.Generator().manual_seed(1))  # [B, H, N, 2d]
    ok = True
    print(f"NaLa map, fp32, B=1 H=4 N={n} d=64, {torch.get_num_threads()} threads, median of {repeats} rounds")
    for is_query in (True, False):
        side = "query" if is_query else "key"
        ref = nala_feature_map_reference(x, is_query=is_query)
        err = (nala_feature_map_blocked(x, is_query=is_query) - ref).abs().max().item()
        if err > 1e-4 * (ref.abs().max().item() + 1):
            print(f"  {side}: blocked form disagrees with the reference (max abs error {err:.2e}); not timed")
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
            t = round_robin({"reference": wrap(nala_feature_map_reference), "blocked": wrap(nala_feature_map_blocked)},
                            repeats)
            ratio = t["reference"] / t["blocked"]
            flag = "" if mode != "fwd" else ("  ok" if ratio >= TARGET else f"  BELOW TARGET {TARGET}x")
            print(f"  {side:5s} {mode:8s} reference/blocked = {ratio:5.2f}x{flag}")
            ok &= mode != "fwd" or ratio >= TARGET

    def both(f):  # the whole map as an attention uses it: query side and key side
        def run():
            with torch.no_grad():
                f(x, is_query=True)
                f(x, is_query=False)
        return run

    t = round_robin({"reference": both(nala_feature_map_reference), "blocked": both(nala_feature_map_blocked)}, repeats)
    ratio = t["reference"] / t["blocked"]
    flag = "  ok" if ratio >= TARGET else f"  BELOW TARGET {TARGET}x"
    print(f"  q + k fwd      reference/blocked = {ratio:5.2f}x{flag}")
    return 0 if ok and ratio >= TARGET else 1


# ----------------------------------------------------------------------------------------------- compile check


def compile_check(archs: list[int], quick: bool, only: str = "", fla: bool = True, verbose: bool = False) -> int:
    """``attnbench.checks.aot`` for each arch: the table, and 1 if any configuration fails."""
    os.environ.pop("TRITON_INTERPRET", None)  # the real compiler, before triton is imported
    from attnbench.checks import aot

    failed = 0
    for arch in archs:
        results = aot.check(arch, quick=quick, fla=fla, only=only, progress=aot.log_progress)
        failed += aot.print_table(results, arch, verbose=verbose)
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16384, help="sequence length of the NaLa timing")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2, help="torch threads (0: torch's default)")
    p.add_argument("--compile-check", action="store_true", help="compile every kernel for a GPU target instead")
    p.add_argument("--arch", default="90", help="compile check: compute capabilities, comma-separated "
                   "(90 = H100, the README's GPU; 80 = A100; any sm number)")
    p.add_argument("--quick", action="store_true", help="compile check: one config per kernel and dtype")
    p.add_argument("--only", default="", help="compile check: configs whose 'group kernel dtype shape' has all "
                   "these words")
    p.add_argument("--no-fla", action="store_true", help="compile check: skip flash-linear-attention's kernels")
    p.add_argument("--verbose", action="store_true", help="compile check: one row per config")
    a = p.parse_args(argv)
    if not a.compile_check:   # the compile check measures no speed (and needs no torch threads)
        import torch

        from attnbench.results.provenance import machine, machine_line

        if a.threads:
            torch.set_num_threads(a.threads)
        print(machine_line(machine()))
    if a.compile_check:
        try:
            archs = [int(x) for x in a.arch.split(",") if x.strip()]
        except ValueError:
            p.error(f"--arch takes compute capabilities like 80 or 80,90; got {a.arch!r}")
        return compile_check(archs, a.quick, a.only, fla=not a.no_fla, verbose=a.verbose)
    return bench_nala(a.n, a.repeats, a.threads)


if __name__ == "__main__":
    sys.exit(main())
