"""The ahead-of-time compile check (``attnbench.kernels.aot``): kernels compiled for sm_80 (A100) and sm_90 (H100)
on the CPU, no GPU. A compile error, a shared-memory or a register-file overflow fails.

The compile runs in a subprocess: conftest turns on Triton's interpreter, under which ``triton.jit`` makes
interpreted functions that cannot be compiled. The quick subset: every kernel of ``kernels/`` once per arch
(sm_90 in bfloat16, sm_80 alternating float32 and float16) and one of FLA's chunk kernels at the 340M DeltaNet
preset with NaLa's doubled key width (K = 256), on both archs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton", reason="the compile check needs triton (pip install 'attnbench[gpu]')")

from attnbench.kernels import aot  # noqa: E402

OWN_KERNELS = {"_fwd_kernel", "_bwd_dq_kernel", "_bwd_dk_kernel", "_bwd_dv_kernel", "_nala_fwd_kernel",
               "_nala_bwd_kernel", "_l1_fwd_kernel", "_l1_bwd_x_kernel", "_l1_bwd_y_kernel", "_ns_step_kernel"}
FLA_KERNEL = "chunk_fwd_kernel_o"

FP16_ON_80 = {"_bwd_dq_kernel", "_bwd_dv_kernel", "_nala_bwd_kernel", "_l1_bwd_x_kernel", "_ns_step_kernel"}

_SCRIPT = """
import dataclasses, json, sys, warnings
warnings.simplefilter("ignore")
from attnbench.kernels import aot
FLA_KERNEL, FP16_ON_80 = %r, %r
out = {}
for arch in (80, 90):
    def pick(r, arch=arch):
        if r.group == "fla":
            return r.kernel == FLA_KERNEL
        if r.group == "linear_attn" and "unnorm no state" not in r.where:
            return False           # attnbench's own call (unnormalised, no state)
        if arch == 90:
            return r.dtype == "bf16"
        return r.dtype == ("fp16" if r.kernel in FP16_ON_80 else "fp32")
    rs = aot.check(arch, quick=True, select=pick, one_per_kernel=True)
    out[arch] = [dataclasses.asdict(r) for r in rs]
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def compiled():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _SCRIPT % (FLA_KERNEL, FP16_ON_80)], capture_output=True, text=True,
                         env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return {int(a): [aot.Result(**r) for r in rs] for a, rs in json.loads(res.stdout).items()}


@pytest.mark.parametrize("arch", [80, 90])
def test_every_kernel_compiles_and_fits(compiled, arch):
    rs = compiled[arch]
    bad = [f"{r.kernel} {r.dtype} {r.where}: {r.error}" for r in rs if r.status == "FAIL"]
    assert not bad, f"sm_{arch}: " + "; ".join(bad)
    assert {r.kernel for r in rs if r.group != "fla"} == OWN_KERNELS
    assert FLA_KERNEL in {r.kernel for r in rs if r.status in ("ok", "spill")}, "no config of FLA's kernel fits"
    for r in rs:
        if r.status in ("ok", "spill"):
            assert 0 < r.regs <= 255 and 0 <= r.shared <= aot.smem_limit(arch), r
    if arch == 90:
        assert {r.dtype for r in rs if r.group != "fla"} == {"bf16"}
    else:
        assert {r.dtype for r in rs if r.group != "fla"} == {"fp32", "fp16"}


def test_fla_kernel_near_the_h100_limit(compiled):
    """FLA's output kernel at K = 256 asks for most of an H100's shared memory: the limit is really checked."""
    r = next(r for r in compiled[90] if r.kernel == FLA_KERNEL and r.status in ("ok", "spill"))
    assert r.shared > aot.smem_limit(80) // 2


_LOG_80 = """ptxas info    : 52 bytes gmem, 24 bytes cmem[4]
ptxas info    : Compiling entry function '_nala_bwd_kernel' for 'sm_80'
ptxas info    : Function properties for _nala_bwd_kernel
    40 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 40 bytes cumulative stack size, 416 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compile time = 404.480 ms
"""
_LOG_90 = """ptxas info    : 52 bytes gmem
ptxas info    : Compiling entry function 'helper_a' for 'sm_90a'
ptxas info    : Function properties for helper_a
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers
ptxas info    : Compiling entry function 'chunk_fwd_kernel_o' for 'sm_90a'
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to the presence \
of Extern calls in the function 'chunk_fwd_kernel_o'.
ptxas info    : Function properties for chunk_fwd_kernel_o
    32 bytes stack frame, 120 bytes spill stores, 96 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 32 bytes cumulative stack size
ptxas info    : Compile time = 319.298 ms
"""


def test_ptxas_report_both_archs():
    assert aot.parse_ptxas(_LOG_80) == dict(regs=128, spill_stores=4, spill_loads=8, stack=40)
    assert aot.parse_ptxas(_LOG_90, "chunk_fwd_kernel_o") == dict(regs=168, spill_stores=120, spill_loads=96,
                                                                   stack=32)
    assert aot.parse_ptxas(_LOG_90, "helper_a")["regs"] == 12
    no_stack = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Used 40 registers\n"
    assert aot.parse_ptxas(no_stack) == dict(regs=40, spill_stores=0, spill_loads=0, stack=0)
    with pytest.raises(ValueError, match="entry functions"):
        aot.parse_ptxas(_LOG_90)                                  # two entries: which one?
    with pytest.raises(ValueError, match="no register count"):
        aot.parse_ptxas("ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas fatal : boom\n")
    with pytest.raises(ValueError, match="no entry function"):
        aot.parse_ptxas("ptxas fatal   : PTX with .target 'sm_90a' cannot be compiled for architecture 'sm_90'")


def test_limits_and_verdicts():
    assert aot.smem_limit(80) == 166912 and aot.smem_limit(90) == 232448 and aot.smem_limit(89) == 101376
    base = dict(group="g", kernel="k", where="", dtype="bf16", constexprs="", num_warps=8, num_stages=2,
                smem_limit=aot.smem_limit(80))
    assert aot.classify(aot.Result(**base, shared=166912, regs=200)).status == "ok"
    assert aot.classify(aot.Result(**base, shared=166913, regs=200)).status == "FAIL"
    assert aot.classify(aot.Result(**base, shared=0, regs=255, spill_stores=4)).status == "spill"
    too_many = dict(base, num_warps=16)                            # 512 threads x 255 registers > 64K
    assert aot.classify(aot.Result(**too_many, shared=0, regs=255)).status == "FAIL"
