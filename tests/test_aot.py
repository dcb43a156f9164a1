"""The ahead-of-time compile check (``attnbench.checks.aot``): kernels compiled for sm_80 (A100) and sm_90 (H100)
on the CPU, no GPU. A compile error, a shared-memory or a register-file overflow fails; so does a register spill
of attnbench's own kernels at these shapes (FLA's spills are reported, not failed: they are FLA's).

The compile runs in a subprocess: conftest turns on Triton's interpreter, under which ``triton.jit`` makes
interpreted functions that cannot be compiled. What it compiles, on both archs: every kernel of ``kernels/`` in
each dtype it accepts (float32, float16, bfloat16) at the quick check's shapes, attnbench's own call of the linear
attention (unnormalised, no state; with float32 / float16 at M = 256 also the kernels that split M over programs),
and FLA's output kernel ``chunk_fwd_kernel_o`` at the 340M DeltaNet preset with NaLa's doubled key width (K = 256)
and at the 340M Gated DeltaNet preset (K = 256, V = 512), each in the autotuner's order until a config fits without
spilling. About 37 compiles per arch (74 in all: about 100 s on the 2-core Xeon), once a test session.

The CLI (``attnbench check --aot``) is tested in this process: its option errors, and its exit code on a planted
failure (the check itself replaced; the real one cannot compile under the interpreter, which it says in one line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

triton = pytest.importorskip("triton", reason="the compile check needs triton (pip install 'attnbench[gpu]')")

from attnbench.checks import aot  # noqa: E402

OWN_KERNELS = {"_fwd_kernel", "_bwd_dq_kernel", "_bwd_dk_kernel", "_bwd_dv_kernel", "_nala_fwd_kernel",
               "_nala_bwd_kernel", "_l1_fwd_kernel", "_l1_bwd_x_kernel", "_l1_bwd_y_kernel", "_ns_step_kernel"}
SPLIT_KERNELS = {"_fwd_kernel", "_bwd_dv_kernel"}   # M = 256 upcast to float32: M split over programs
FLA_KERNEL = "chunk_fwd_kernel_o"
FLA_SHAPES = ("340m deltanet nala K=256 V=128", "340m gdn K=256 V=512")

_SCRIPT = """
import dataclasses, json, sys, time, warnings
warnings.simplefilter("ignore")
from attnbench.checks import aot
FLA_KERNEL = %r
out = {}
for arch in (80, 90):
    kept = set()
    def pick(r):
        if r.group == "fla":
            return r.kernel == FLA_KERNEL
        if r.group == "linear_attn" and "unnorm no state" not in r.where:
            return False           # attnbench's own call (unnormalised, no state)
        key = (r.kernel, r.dtype, "SPLIT=True" in r.constexprs)   # each kernel variant once per dtype
        if key in kept:
            return False
        kept.add(key)
        return True
    t0 = time.perf_counter()
    rs = aot.check(arch, quick=True, select=pick)
    out[arch] = dict(seconds=time.perf_counter() - t0, results=[dataclasses.asdict(r) for r in rs])
json.dump(out, sys.stdout)
"""


def _compile_both_archs() -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", _SCRIPT % FLA_KERNEL], capture_output=True, text=True, env=env,
                         timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    print(f"\ncompile check: sm_80 + sm_90, {time.perf_counter() - t0:.0f} s with the subprocess")
    return res.stdout


@pytest.fixture(scope="module")
def compiled(request, tmp_path_factory):
    """The compiles, once a test session: under pytest-xdist the workers that run these tests share one result
    (the session's temporary root and a lock) instead of each compiling for a minute and a half."""
    if not hasattr(request.config, "workerinput"):  # one process (xdist absent, off or not distributing)
        text = _compile_both_archs()
    else:
        from filelock import FileLock  # torch's own dependency

        shared = tmp_path_factory.getbasetemp().parent / "aot-compiled.json"  # this session's, not an earlier one's
        with FileLock(f"{shared}.lock"):
            if not shared.exists():
                shared.write_text(_compile_both_archs())
            text = shared.read_text()
    return {int(a): [aot.Result(**r) for r in d["results"]] for a, d in json.loads(text).items()}


@pytest.mark.parametrize("arch", [80, 90])
def test_every_kernel_compiles_and_fits_in_every_dtype(compiled, arch):
    rs = compiled[arch]
    bad = [f"{r.kernel} {r.dtype} {r.where}: {r.error}" for r in rs if r.status == "FAIL"]
    assert not bad, f"sm_{arch}: " + "; ".join(bad)
    own = [r for r in rs if r.group != "fla"]
    for dtype in ("fp32", "fp16", "bf16"):
        assert {r.kernel for r in own if r.dtype == dtype} == OWN_KERNELS, dtype
    for dtype in ("fp32", "fp16"):   # the split kernels are compiled too
        assert {r.kernel for r in own if r.dtype == dtype and "SPLIT=True" in r.constexprs} == SPLIT_KERNELS
    for r in rs:
        if r.status in ("ok", "spill"):
            assert 0 < r.regs <= 255 and 0 <= r.shared <= aot.smem_limit(arch), r
    spills = [f"{r.kernel} {r.dtype} {r.where} {r.constexprs}: {r.spill} B" for r in own if r.spill]
    assert not spills, f"sm_{arch}: attnbench's kernels spill: " + "; ".join(spills)


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("shape", FLA_SHAPES)
def test_fla_output_kernel_fits_deltanet_and_gated_deltanet(compiled, arch, shape):
    fits = [r for r in compiled[arch] if r.kernel == FLA_KERNEL and shape in r.where and r.status in ("ok", "spill")]
    assert fits, f"sm_{arch}: no config of FLA's {FLA_KERNEL} fits at {shape}"
    assert ("USE_G=True" in fits[0].constexprs) == ("gdn" in shape)   # the gated launch really is gated


def test_fla_kernel_near_the_h100_limit(compiled):
    """FLA's output kernel at K = 256 asks for most of an H100's shared memory: the limit is really checked."""
    r = next(r for r in compiled[90] if r.kernel == FLA_KERNEL and r.status in ("ok", "spill"))
    assert r.shared > aot.smem_limit(80) // 2


# ----------------------------------------------------------------------------------------------- the CLI


def _invoke(args: list[str]):
    """``attnbench ...`` in this process. The CLI drops TRITON_INTERPRET from the environment (its compile needs the
    real compiler): CliRunner's ``env`` restores the test session's value afterwards."""
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    before = os.environ.get("TRITON_INTERPRET")
    res = CliRunner().invoke(app, args, env={"TRITON_INTERPRET": before, "COLUMNS": "250"})
    assert os.environ.get("TRITON_INTERPRET") == before   # the other tests still run interpreted
    return res


@pytest.mark.parametrize("arch,needle", [("95", "--arch 95: not a GPU architecture this check knows"),
                                         ("eighty", "compute capabilities such as 80"),
                                         (" , ", "--arch is empty")])
def test_cli_bad_arch_is_one_line_exit_2(arch, needle):
    res = _invoke(["check", "--aot", "--arch", arch])
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [res.output.strip()], res.output
    assert res.output.startswith("error:") and needle in res.output, res.output


def test_cli_aot_refuses_interpret():
    res = _invoke(["check", "--aot", "--interpret", "--arch", "90"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == "error: --aot compiles for a real GPU; it cannot run under --interpret (drop one " \
                                 "of them)"


def test_cli_aot_says_when_the_kernels_are_interpreted(monkeypatch):
    """The kernels imported under the interpreter: the real check says so in one line instead of compiling. Whether
    this worker imported them interpreted depends on the tests before (a CLI check drops the interpreter), so the
    premise is planted: an interpreted stand-in for the kernel the check looks at."""
    from attnbench.kernels import linear_attn

    monkeypatch.setattr(linear_attn, "_fwd_kernel", object())
    res = _invoke(["check", "--aot", "--arch", "80", "--quick"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert lines[0].startswith("machine: ") and lines[1].startswith("compilers: triton "), res.output
    assert lines[-1].startswith("error: ") and "interpreter" in lines[-1] and "Traceback" not in res.output


@pytest.mark.parametrize("planted", [False, True])
def test_cli_aot_exit_code_follows_the_table(monkeypatch, planted):
    """A planted compile failure on one arch: its row in the table, the summary counts it, exit 1; else exit 0."""
    def fake_check(arch, quick=False, progress=None, **_):
        base = dict(group="linear_attn", kernel="_fwd_kernel", dtype="fp32", constexprs="BT=16", num_warps=8,
                    num_stages=1, smem_limit=aot.smem_limit(arch))
        rs = [aot.classify(aot.Result(where="fits", shared=1024, regs=100, **base))]
        if planted and arch == 90:
            rs.append(aot.Result(where="planted", status="FAIL", error="PTXASError: planted compile error", **base))
        for i, r in enumerate(rs):
            progress(i + 1, len(rs), r)
        return rs

    monkeypatch.setattr(aot, "check", fake_check)
    res = _invoke(["check", "--aot", "--arch", "80,90", "--quick"])
    assert res.exit_code == (1 if planted else 0), res.output
    assert "sm_80: 1 configs: 1 ok" in res.output and "Ahead-of-time compile for sm_90 (H100)" in res.output
    assert ("PTXASError: planted compile error" in res.output) == planted
    assert ("2 configs: 1 ok, 0 spill (max 0 B), 0 autotune configs skipped, 1 failed" in res.output) == planted


# ----------------------------------------------------------------------------------------------- parsing, verdicts


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
