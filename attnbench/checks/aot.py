"""Ahead-of-time compile check: every kernel configuration the code can launch, compiled for a real GPU, no GPU.

A kernel is compiled exactly as Triton would compile it at launch on the target GPU, with no GPU present:

1. *Capture.* The entry points' own Python code runs on ``meta`` tensors (shapes and dtypes, no data) while
   ``fn[grid](...)`` is intercepted: every launch the code makes is recorded with its arguments instead of
   running. Block sizes, constexpr flags and launch options therefore come from the wrappers themselves
   (``_tiles``, ``_rows_per_program``, ...), never from a copy of their logic. ``@triton.heuristics`` are
   applied and an ``@triton.autotune`` launch expands into every config the autotuner would try.
2. *Compile.* Each distinct launch goes through the kernel's own binder (argument specialisation: integer
   1s, 16-byte alignment) and ``triton.compile`` for ``GPUTarget("cuda", arch, 32)``: TTIR -> TTGIR -> LLVM ->
   PTX -> ptxas -> cubin, on the CPU.
3. *Measure.* Shared memory is Triton's ``metadata.shared`` (what the launch asks for). Registers and spills:
   Triton's ``n_regs`` / ``n_spills`` are read from the CUDA driver when a kernel is loaded, so they need a GPU;
   here they come from ptxas' own ``-v`` report of the very compilation that built the cubin (Triton's
   ``dump_ptxas_log``; parsed per entry function, any arch's layout).

A configuration fails if it does not compile, needs more shared memory than the target allows a block, or more
registers than the register file holds for its threads. For an autotuned kernel (FLA's) a config that does not
fit is skipped by the autotuner on the GPU too: the launch fails only if none of its configs fits. Its configs
are compiled in the autotuner's order until one fits without spilling (``all_configs=True``: all of them); the
table shows that one, or, when every config spills, the one that spills least (the autotuner may pick another on
the GPU: it times them). Spilling is reported, not failed. What this proves: the kernels compile for that GPU, fit
its shared memory and register file, and how much they spill; it says nothing about numbers (the interpreter
tests prove those in float32 and float16) or speed.

The full check compiles every tile the wrappers can choose (all feature / value / chunk sizes, three dtypes, the
constexpr flags attnbench launches and all of them on; every flag combination at the presets' shapes) and FLA
at every LM preset: about two thousand compiles per arch, which takes hours on two busy cores; ``quick`` takes
two preset shapes per kernel and dtype and FLA's DeltaNet, Gated DeltaNet, GLA and retention kernels at the 340M
presets (a few hundred compiles per arch, minutes).

    results = check(arch=90, quick=False, fla=True)      # list[Result]
    print_table(results, arch=90)                        # rich table; returns the number of failures

The capture of FLA's kernels makes FLA believe it runs on the target GPU (its hardware probes are patched and
its ``fla.ops`` modules re-imported for the duration): FLA chooses block sizes and autotune lists from the GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import re
import sys
import time
from typing import Callable, Iterable, Iterator

import torch

__all__ = ["Result", "check", "classify", "log_progress", "parse_archs", "parse_ptxas", "print_table", "smem_limit",
           "summary", "toolchain", "ARCH_NAMES"]

# Largest dynamic shared memory one block may use (cudaDevAttrMaxSharedMemoryPerBlockOptin), bytes: CUDA
# programming guide, "Compute capabilities" table. The same values as FLA's ``Backend`` (A100, H100, Ada).
_SMEM_OPTIN = {70: 96 * 1024, 72: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024,
               89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 103: 227 * 1024, 110: 227 * 1024,
               120: 99 * 1024, 121: 99 * 1024}
_REGISTER_FILE = 64 * 1024  # 32-bit registers per SM (every arch from sm_50); one block must fit in it
_SM_COUNT = {80: 108, 86: 84, 89: 128, 90: 132, 100: 148}   # FLA asks for it (grid sizes); A100, H100, ...
ARCH_NAMES = {80: "A100", 86: "RTX 3090 / A40", 89: "L40 / RTX 4090", 90: "H100", 100: "B200", 120: "RTX 5090"}

# Shapes. The linear-attention kernels take any feature size M and value size D up to 256 (padded to a power of
# two >= 16) and any power-of-two chunk size; chunks beyond 256 give no new tiles (the tile budget caps them).
_POW2_DIMS = (16, 32, 64, 128, 256)
_CHUNKS = (16, 32, 64, 128, 256)
_NALA_DIMS = tuple(1 << i for i in range(11))   # NaLa's map: D = 1 .. 1024 (its tile holds a whole row)
_NS_SIZES = (16, 32, 64, 128)                   # Newton-Schulz: m <= 128, padded to a power of two
# The head sizes of the shipped presets (suites/*/presets: d = 16 .. 256), each with a feature map of d or 2d
# (NaLa doubles): the shapes every constexpr combination is compiled at. The quick check: the commonest (M, D) and
# the widest (NaLa at d = 128: M = 256, where float32 and float16 split M over programs, see linear_attn._tiles).
_PRESET_LINEAR = ((32, 16), (64, 32), (64, 64), (128, 64), (128, 128), (256, 128))
_QUICK_LINEAR = ((128, 64), (256, 128))
# FLA's chunk kernels at the LM presets (suites/lm/presets/*.toml): (label, op, K, V) per head. The delta rules
# both with the baseline key width and with NaLa's key_width="double" (K = 2 head_dim); the 340m Gated DeltaNet
# with NaLa at key_width="double" (K = 512) is past FLA's limit of 256: the LM suite refuses it on CUDA before any
# work (suites/lm/train.py), so FLA only ever sees it at key_width="match" (K = 256). GLA (chunk_gla, a decay per
# key feature) and RetNet (chunk_simple_gla, one per head) at their presets' heads.
_FLA_SHAPES = (("340m deltanet", "delta", 128, 128), ("340m deltanet nala", "delta", 256, 128),
               ("340m gdn", "gated_delta", 256, 512), ("340m gdn nala, key_width=match", "gated_delta", 256, 512),
               ("340m gla", "gla", 128, 256), ("340m retnet", "simple_gla", 128, 256),
               ("tiny deltanet", "delta", 64, 64), ("tiny deltanet nala", "delta", 128, 64),
               ("tiny gdn", "gated_delta", 96, 192), ("tiny gdn nala", "gated_delta", 192, 192),
               ("tiny gla", "gla", 32, 64), ("tiny retnet", "simple_gla", 64, 128))
_QUICK_FLA = (("340m deltanet nala", "delta", 256, 128), ("340m gdn", "gated_delta", 256, 512),
              ("340m gla", "gla", 128, 256), ("340m retnet", "simple_gla", 128, 256))   # each LM op, at 340m
_FLA_T = 2048   # tokens per sequence (the 340M preset's context); FLA's heuristics look at T
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def smem_limit(arch: int) -> int:
    """Bytes of shared memory one block may use on ``sm_<arch>`` (the closest known older arch otherwise)."""
    known = [a for a in sorted(_SMEM_OPTIN) if a <= arch]
    return _SMEM_OPTIN[known[-1]] if known else 48 * 1024


def parse_archs(text: str) -> list[int]:
    """``"80,90"`` (or ``"sm_80, sm_90"``) -> ``[80, 90]``. Raises ``ValueError`` with a one-line message for an
    empty list, a word that is not a compute capability, or one this check has no shared-memory limit for (ptxas
    would reject e.g. ``sm_95`` in every configuration)."""
    archs = []
    for word in (w.strip() for w in str(text).split(",")):
        if not word:
            continue
        digits = word[3:] if word.lower().startswith("sm_") else word
        if not digits.isdigit():
            raise ValueError(f"--arch takes compute capabilities such as 80 or 80,90; got {word!r} in {text!r}")
        if int(digits) not in _SMEM_OPTIN:
            raise ValueError(f"--arch {word}: not a GPU architecture this check knows; known: "
                             + ", ".join(str(a) for a in sorted(_SMEM_OPTIN)) + " (80 = A100, 90 = H100)")
        if int(digits) not in archs:
            archs.append(int(digits))
    if not archs:
        raise ValueError(f"--arch is empty ({text!r}); give compute capabilities such as 80 or 80,90")
    return archs


def toolchain() -> str:
    """The compilers the verdicts depend on, e.g. ``"triton 3.8.0, ptxas CUDA 12.9 (V12.9.86)"``."""
    import triton

    line = f"triton {triton.__version__}"
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version

        text = get_ptxas_version()
        release = re.search(r"release ([\d.]+), (V[\d.]+)", text)
        line += f", ptxas CUDA {release.group(1)} ({release.group(2)})" if release else ", ptxas (version unknown)"
    except Exception:  # noqa: BLE001 - a label only
        line += ", ptxas (version unknown)"
    return line


# ----------------------------------------------------------------------------------------------- ptxas report


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")


def parse_ptxas(log: str, name: str | None = None) -> dict:
    """Registers, spills and stack of entry function ``name`` (the only entry if None) from ``ptxas -v``.

    Works for every arch's layout (sm_80 adds ``cmem`` sizes, sm_90 ``(C7xxx)`` performance advisories and no
    ``cmem`` line; a function with no local memory may omit the stack line). Raises ``ValueError`` quoting the
    log if the entry or its register count is missing."""
    blocks = {}
    parts = _ENTRY.split(log)
    for i in range(1, len(parts) - 1, 2):
        blocks[parts[i]] = parts[i + 1]
    if not blocks:
        raise ValueError(f"ptxas log has no entry function:\n{log[:2000]}")
    if name is None:
        if len(blocks) != 1:
            raise ValueError(f"ptxas log has {len(blocks)} entry functions, name one: {sorted(blocks)}")
        name = next(iter(blocks))
    if name not in blocks:
        raise ValueError(f"ptxas log has no entry function {name!r} (entries: {sorted(blocks)}):\n{log[:2000]}")
    text = blocks[name]
    regs = re.search(r"Used (\d+) registers", text)
    if regs is None:
        raise ValueError(f"ptxas log gives no register count for {name!r}:\n{log[:2000]}")

    def num(pattern: str) -> int:
        m = re.search(pattern, text)
        return int(m.group(1)) if m else 0

    return dict(regs=int(regs.group(1)), spill_stores=num(r"(\d+) bytes spill stores"),
                spill_loads=num(r"(\d+) bytes spill loads"), stack=num(r"(\d+) bytes stack frame"))


# ----------------------------------------------------------------------------------------------- capture


@dataclasses.dataclass
class _Launch:
    group: str                 # "linear_attn", "nala", "laplace", "fla"
    where: str                 # the shape / call it came from
    fn: object                 # the JITFunction
    args: tuple
    kwargs: dict
    tuned: str = ""            # autotune group id ("" for a plain launch)


@contextlib.contextmanager
def _intercept() -> Iterator[list]:
    """Record ``kernel[grid](*args, **kwargs)`` calls (JIT functions, autotuners, heuristics) without running them."""
    from triton.runtime.jit import KernelInterface

    calls: list = []
    original = KernelInterface.__getitem__

    def getitem(self, grid):
        return lambda *args, **kwargs: calls.append((self, args, dict(kwargs)))

    KernelInterface.__getitem__ = getitem
    try:
        yield calls
    finally:
        KernelInterface.__getitem__ = original


def _expand(obj, args: tuple, kwargs: dict, tag: str) -> list[tuple]:
    """(JITFunction, args, kwargs, autotune id) of every compile a launch of ``obj`` can make."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    if isinstance(obj, Heuristics):
        kwargs = dict(kwargs)
        for name, rule in obj.values.items():   # as Heuristics.run: each rule sees the earlier ones' values
            kwargs[name] = rule({**dict(zip(obj.arg_names, args)), **kwargs})
        return _expand(obj.fn, args, kwargs, tag)
    if isinstance(obj, Autotuner):
        obj.nargs = dict(zip(obj.arg_names, args))
        configs = obj.prune_configs(kwargs)
        tid = f"{tag}:{id(obj)}"
        out = []
        for cfg in configs:
            out += [(fn, a, kw, tid) for fn, a, kw, _ in
                    _expand(obj.fn, args, {**kwargs, **cfg.all_kwargs()}, tag)]
        return out
    if isinstance(obj, JITFunction):
        return [(obj, args, kwargs, "")]
    raise TypeError(f"cannot compile a launch of {type(obj).__name__}")


def _meta(*shape, dtype=torch.float32, grad: bool = False) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def _run_fwd_bwd(fn: Callable, inputs: list[torch.Tensor]) -> None:
    """Forward, then backward of the first output with respect to every input that requires a gradient."""
    out = fn()
    first = out[0] if isinstance(out, (tuple, list)) else out
    wrt = [t for t in inputs if t is not None and t.requires_grad]
    torch.autograd.grad(first, wrt, torch.empty_like(first), allow_unused=True)


def _linear_calls(quick: bool) -> Iterator[tuple[str, str, Callable]]:
    from attnbench.kernels import linear_attn as la

    # (normalize, initial state S0, z0): attnbench's own call (forward_triton: unnormalised, no state) and every
    # combination the public entry accepts; backward flags follow from autograd (dS, dz of the final state).
    flags_all = [(n, s, z) for n in (False, True) for s in (False, True) for z in (False, True)]
    shapes = []
    if quick:
        shapes = [(M, D, 64, flags_all[:1] + flags_all[-1:]) for M, D in _QUICK_LINEAR]
    else:
        for M in _POW2_DIMS:
            for D in _POW2_DIMS:
                for c in _CHUNKS:
                    every = (M, D) in _PRESET_LINEAR and c == 64
                    shapes.append((M, D, c, flags_all if every else flags_all[:1] + flags_all[-1:]))
    for dname, dt in _DTYPES.items():
        for M, D, chunk, flag_list in shapes:
            for normalize, has_s0, has_z0 in flag_list:
                def call(M=M, D=D, chunk=chunk, normalize=normalize, has_s0=has_s0, has_z0=has_z0, dt=dt):
                    fq, fk, v = _meta(1, 2, 100, M, dtype=dt, grad=True), _meta(1, 2, 100, M, dtype=dt, grad=True), \
                        _meta(1, 2, 100, D, dtype=dt, grad=True)
                    S0 = _meta(1, 2, M, D, dtype=torch.float32, grad=True) if has_s0 else None
                    z0 = _meta(1, 2, M, dtype=torch.float32, grad=True) if has_z0 else None
                    _run_fwd_bwd(lambda: la.ChunkLinearAttnFunction.apply(fq, fk, v, S0, z0, normalize, 1e-6, 0, chunk),
                                 [fq, fk, v, S0, z0])
                state = "S0,z0" if has_s0 and has_z0 else "S0" if has_s0 else "z0" if has_z0 else "no state"
                yield dname, f"M={M} D={D} chunk={chunk} {'norm' if normalize else 'unnorm'} {state}", call


def _nala_calls(quick: bool) -> Iterator[tuple[str, str, Callable]]:
    from attnbench.kernels import nala as nl

    for dname, dt in _DTYPES.items():
        for D in ((64,) if quick else _NALA_DIMS):
            for q in (True, False):
                def call(D=D, q=q, dt=dt):
                    x = _meta(2, 4, 100, D, dtype=dt, grad=True)
                    _run_fwd_bwd(lambda: nl.NaLaFeatureMapFunction.apply(x, q, 3.0, 0.5, 1e-6), [x])
                yield dname, f"D={D} {'query' if q else 'key'}", call


def _laplace_calls(quick: bool) -> Iterator[tuple[str, str, Callable]]:
    from attnbench.kernels import laplace as lp

    for dname, dt in _DTYPES.items():
        def l1(dt=dt):
            x, y = _meta(1, 2, 100, 32, dtype=dt, grad=True), _meta(1, 2, 49, 32, dtype=dt, grad=True)
            _run_fwd_bwd(lambda: lp.L1DistanceFunction.apply(x, y), [x, y])
        yield dname, "N=100 m=49 d=32", l1
        for m in ((64,) if quick else _NS_SIZES):
            def ns(m=m, dt=dt):
                X, W = _meta(2, 2, m, m, dtype=dt), _meta(2, 2, m, m, dtype=dt)
                lp.NewtonSchulzStepFunction.apply(X, W)
            yield dname, f"m={m}", ns


@functools.lru_cache(maxsize=None)   # the same launches for every arch: captured once per process
def _own_launches(quick: bool) -> tuple[_Launch, ...]:
    launches = []
    for group, calls in (("linear_attn", _linear_calls), ("nala", _nala_calls), ("laplace", _laplace_calls)):
        for dname, where, call in calls(quick):
            with _intercept() as got:
                call()
            launches += [_Launch(group, f"{dname} {where}", obj, a, kw) for obj, a, kw in got]
    return tuple(launches)


# ----------------------------------------------------------------------------------------------- FLA


@contextlib.contextmanager
def _fla_as_if_on(arch: int) -> Iterator[None]:
    """FLA's hardware probes answer as ``sm_<arch>`` would, and ``fla.ops`` is re-imported under them (its
    autotune lists and block sizes are chosen at import from the GPU); everything is restored on exit."""
    import warnings

    with warnings.catch_warnings():   # "Triton is not supported on current platform": the point of the patch
        warnings.simplefilter("ignore")
        import fla.utils
        import fla.utils.hardware as hw

    limit = smem_limit(arch)
    fake = dict(
        IS_NVIDIA=True, IS_AMD=False, IS_INTEL=False, IS_NPU=False, IS_NVIDIA_HOPPER=arch // 10 == 9,
        IS_NVIDIA_SM100=arch // 10 == 10, IS_NVIDIA_SM120=arch == 120, IS_NVIDIA_BLACKWELL=arch // 10 in (10, 12),
        IS_TF32_SUPPORTED=arch >= 80, IS_TMA_SUPPORTED=False, IS_AMD_TMA_ARCH=False, device_platform="cuda",
        check_shared_mem=lambda arch_name="none", tensor_idx=0: limit >= hw.Backend.get_shared_memory(arch_name),
        get_multiprocessor_count=lambda tensor_idx=0, **_: _SM_COUNT.get(arch, 108),
        get_device_capability=lambda device_index=0: (arch // 10, arch % 10),
        get_device_smem_optin=lambda device_index=0: limit,
        get_all_max_shared_mem=lambda: [limit])
    saved_modules = {k: v for k, v in sys.modules.items() if k.startswith("fla.ops") or k.startswith("fla.modules")}
    patched = [m for m in (hw, fla.utils) if m is not None]
    saved_attrs = [(m, k, getattr(m, k)) for m in patched for k in fake if hasattr(m, k)]
    try:
        for m in patched:
            for k, v in fake.items():
                if hasattr(m, k):
                    setattr(m, k, v)
        for k in saved_modules:
            del sys.modules[k]
        yield
    finally:
        for m, k, v in saved_attrs:
            setattr(m, k, v)
        for k in [k for k in sys.modules if k.startswith("fla.ops") or k.startswith("fla.modules")]:
            del sys.modules[k]
        sys.modules.update(saved_modules)


def _fla_launches(arch: int, quick: bool) -> tuple[list[_Launch], list[str]]:
    """FLA's chunk kernels as attnbench calls them (``attnbench.ops.delta._delta_rule_fla`` and
    ``attnbench.ops.gla._gla_fla``: ``[B, T, H, D]``; ``chunk_delta_rule``, ``chunk_gated_delta_rule``,
    ``chunk_gla``, ``chunk_simple_gla``, forward and backward), at the LM presets' head sizes. Returns the launches
    and one line per shape FLA's Python refuses (with its reason)."""
    launches, refused = [], []
    dtypes = {"bf16": torch.bfloat16} if quick else {"bf16": torch.bfloat16, "fp16": torch.float16}
    import warnings

    with _fla_as_if_on(arch):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from fla.ops.delta_rule import chunk_delta_rule
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            from fla.ops.gla import chunk_gla
            from fla.ops.simple_gla import chunk_simple_gla
        # training: no state, forward and backward; incremental decoding (the LM's caches): a state in and out,
        # forward only
        for label, op, K, V in (_QUICK_FLA if quick else _FLA_SHAPES):
            for dname, dt in dtypes.items():
                for state in ((False,) if quick else (False, True)):
                    H, grad = 2, not state
                    q, k = _meta(1, _FLA_T, H, K, dtype=dt, grad=grad), _meta(1, _FLA_T, H, K, dtype=dt, grad=grad)
                    v = _meta(1, _FLA_T, H, V, dtype=dt, grad=grad)
                    beta = _meta(1, _FLA_T, H, dtype=dt, grad=grad)
                    g = _meta(*((1, _FLA_T, H, K) if op == "gla" else (1, _FLA_T, H)), dtype=torch.float32, grad=grad)
                    kw = dict(initial_state=_meta(1, H, K, V) if state else None, output_final_state=state)
                    where = f"{dname} {label} K={K} V={V} chunk=64" + (" state" if state else "")
                    call, inputs = {
                        "delta": (lambda: chunk_delta_rule(q, k, v, beta, chunk_size=64, **kw), [q, k, v, beta]),
                        "gated_delta": (lambda: chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=64, **kw),
                                        [q, k, v, beta, g]),
                        "gla": (lambda: chunk_gla(q, k, v, g, **kw), [q, k, v, g]),
                        "simple_gla": (lambda: chunk_simple_gla(q, k, v, g, **kw), [q, k, v, g]),
                    }[op]
                    try:
                        with _intercept() as got:
                            if state:
                                call()
                            else:
                                _run_fwd_bwd(call, inputs)
                    except Exception as e:  # noqa: BLE001 - FLA's own checks (e.g. head size limits) are findings
                        refused.append(f"{where}: FLA refuses: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                        continue
                    for obj, a, kwargs in got:
                        launches.append(_Launch("fla", where, obj, a, kwargs))
    return launches, refused


# ----------------------------------------------------------------------------------------------- compile


@dataclasses.dataclass
class Result:
    """One compiled configuration. ``status``: "ok", "spill" (compiles and fits, spills registers), "FAIL", or
    "skip" (an autotune config that does not fit while another config of the same launch does)."""
    group: str
    kernel: str
    where: str
    dtype: str
    constexprs: str
    num_warps: int
    num_stages: int
    status: str = "ok"
    error: str = ""
    shared: int = 0
    smem_limit: int = 0
    regs: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    tuned: str = ""
    seconds: float = 0.0

    @property
    def spill(self) -> int:
        return self.spill_stores + self.spill_loads


def _prepare(fn, args: tuple, kwargs: dict, backend):
    """Triton's own launch-time binding (JITFunction.run): signature, constexprs, attrs, options."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    kwargs = dict(kwargs)
    kwargs.setdefault("debug", fn.debug or knobs.runtime.debug)
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    return fn._pack_args(backend, kwargs, bound, specialization, options)


def classify(res: Result) -> Result:
    """Set ``res.status``: FAIL if it needs more shared memory than ``res.smem_limit`` or more registers than the
    register file holds for its threads, "spill" if ptxas spilled registers, else "ok"."""
    problems = []
    if res.shared > res.smem_limit:
        problems.append(f"needs {res.shared} B of shared memory > {res.smem_limit} B")
    if res.regs * 32 * res.num_warps > _REGISTER_FILE:
        problems.append(f"{res.regs} registers x {32 * res.num_warps} threads > {_REGISTER_FILE}")
    res.status = "FAIL" if problems else "spill" if res.spill else "ok"
    res.error = "; ".join(problems)
    return res


def _pointer_dtype(signature: dict) -> str:
    kinds = [v[1:] for v in signature.values() if isinstance(v, str) and v.startswith("*")]
    for t in ("bf16", "fp16"):
        if t in kinds:
            return t
    return "fp32" if "fp32" in kinds else (kinds[0] if kinds else "-")


def _show(v) -> str:
    return getattr(v, "value", v).__repr__() if not isinstance(v, str) else repr(v)


def _compile(fn, signature, constexprs, attrs, options, target) -> tuple[object, str]:
    """Compile with Triton's ptxas report captured (a fresh compile: a cache hit would run no ptxas)."""
    import triton
    from triton import knobs
    from triton.compiler import ASTSource

    src = ASTSource(fn, signature, constexprs, attrs)
    out = io.StringIO()
    with knobs.compilation.scope(), knobs.nvidia.scope():
        knobs.compilation.always_compile = True
        knobs.nvidia.dump_ptxas_log = True
        with contextlib.redirect_stdout(out):
            kernel = triton.compile(src, target=target, options=options.__dict__)
    return kernel, out.getvalue()


def check(arch: int = 80, quick: bool = False, fla: bool = True, only: str = "", all_configs: bool = False,
          select: Callable[[Result], bool] | None = None, one_per_kernel: bool = False,
          progress: Callable[[int, int, Result], None] | None = None) -> list[Result]:
    """Compile every configuration for ``sm_<arch>`` and return one :class:`Result` per distinct compile (plus a
    FAIL row per FLA shape FLA's own Python refuses).

    ``quick``: two preset shapes per kernel and dtype (``_QUICK_LINEAR``), FLA's DeltaNet and Gated DeltaNet at
    the 340M presets' K = 256 in bfloat16, training (forward and backward, no state). Autotuned launches
    (FLA's) compile their configs in the autotuner's order until one fits without spilling, which proves the
    autotuner has such a config on that GPU; ``all_configs`` compiles every config (about a thousand per arch).
    ``only``: keep configurations whose "group kernel dtype where" has all these words; ``select``: keep those it
    accepts (it sees a Result before compiling); ``one_per_kernel``: keep the first of each (kernel, dtype)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("the compile check needs the real Triton compiler: unset TRITON_INTERPRET before "
                           "triton is imported (run it in its own process)")
    from triton.runtime.jit import JITFunction

    from attnbench.kernels import linear_attn

    if not isinstance(linear_attn._fwd_kernel, JITFunction):
        raise RuntimeError("the compile check needs the real Triton compiler, but this process imported the kernels "
                           "under Triton's interpreter (TRITON_INTERPRET=1): run it in a process without it")
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", int(arch), 32)
    backend = make_backend(target)
    limit = smem_limit(arch)
    launches = list(_own_launches(quick))
    refused: list[str] = []
    if fla:
        fl, refused = _fla_launches(arch, quick)
        launches += fl

    jobs, seen = [], set()
    for ln in launches:
        for fn, a, kw, tuned in _expand(ln.fn, ln.args, ln.kwargs, ln.where):
            options, signature, constexprs, attrs = _prepare(fn, a, kw, backend)
            consts_key = repr(sorted((str(k), _show(v)) for k, v in constexprs.items()))
            key = (fn.__name__, fn.module, repr(signature), consts_key,
                   repr(attrs), repr(sorted(options.__dict__.items())))
            if key in seen:
                continue
            consts = " ".join(f"{fn.arg_names[k[0]] if isinstance(k, tuple) else k}={_show(v)}"
                              for k, v in constexprs.items() if v is not None and not callable(v))
            res = Result(ln.group, fn.__name__, ln.where, _pointer_dtype(signature), consts, options.num_warps,
                         options.num_stages, smem_limit=limit, tuned=tuned)
            text = f"{res.group} {res.kernel} {res.dtype} {res.where}"
            if only and not all(w in text for w in only.split()) or select and not select(res):
                continue   # (before ``seen``: a launch left out does not hide the same compile of a later one)
            seen.add(key)
            if one_per_kernel:
                if (res.group, res.kernel, res.dtype) in seen:
                    continue
                seen.add((res.group, res.kernel, res.dtype))
            jobs.append((res, fn, signature, constexprs, attrs, options))

    results = [Result("fla", "(python)", line.split(": FLA refuses")[0], "-", "", 0, 0, status="FAIL",
                      error=line.split(": ", 1)[1], smem_limit=limit) for line in refused
               if not only or all(w in f"fla {line}" for w in only.split())]
    clean: set[str] = set()   # autotuned launches with a config that fits and does not spill already
    for i, (res, fn, signature, constexprs, attrs, options) in enumerate(jobs):
        if res.tuned and res.tuned in clean and not all_configs:
            continue
        t0 = time.perf_counter()
        try:
            kernel, log = _compile(fn, signature, constexprs, attrs, options, target)
            res.shared = int(kernel.metadata.shared)
            res.__dict__.update(parse_ptxas(log, kernel.metadata.name))
            classify(res)
        except Exception as e:  # noqa: BLE001 - every failing config is reported, then the check fails
            res.status, res.error = "FAIL", f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        res.seconds = time.perf_counter() - t0
        if res.tuned and res.status == "ok":
            clean.add(res.tuned)
        results.append(res)
        if progress:
            progress(i + 1, len(jobs), res)
    # Per autotuned launch the row that stands for it: its first config that fits without spilling, else the one
    # that spills least; the others are "skip" (the autotuner skips what does not fit; it times the rest)
    best: dict[str, Result] = {}
    for r in results:
        if r.tuned and r.status != "FAIL":
            b = best.get(r.tuned)
            if b is None or (r.status == "ok") > (b.status == "ok") or (b.status != "ok" and r.spill < b.spill):
                best[r.tuned] = r
    for r in results:
        if r.tuned and r.tuned in best and r is not best[r.tuned]:
            r.status = "skip"
    for tid, b in best.items():
        if b.status == "spill" and not b.error:
            n = sum(r.tuned == tid for r in results)
            b.error = f"each of the autotuner's {n} configs spills or does not fit: the one spilling least"
    return results


# ----------------------------------------------------------------------------------------------- report


def log_progress(i: int, n: int, r: Result, file=None) -> None:
    """A ``progress`` callback for :func:`check`: one line per compiled configuration, on stderr."""
    print(f"[{i}/{n}] {r.status:5s} {r.group}.{r.kernel} {r.dtype} {r.where} ({r.seconds:.1f} s)",
          file=file or sys.stderr, flush=True)


def summary(results: Iterable[Result]) -> dict:
    rs = list(results)
    spills = [r.spill for r in rs if r.status in ("ok", "spill")]
    return dict(total=len(rs), ok=sum(r.status == "ok" for r in rs), spill=sum(r.status == "spill" for r in rs),
                skip=sum(r.status == "skip" for r in rs), failed=sum(r.status == "FAIL" for r in rs),
                max_spill=max(spills, default=0),
                max_shared=max((r.shared for r in rs if r.status in ("ok", "spill")), default=0),
                max_regs=max((r.regs for r in rs if r.status in ("ok", "spill")), default=0))


def print_table(results: list[Result], arch: int, *, verbose: bool = False, file=None) -> int:
    """Print the results (every row with ``verbose``; else failures, spills and one summary row per kernel and
    dtype) and a summary line; returns the number of failures. Plain text when the output is not a terminal."""
    from rich.console import Console
    from rich.table import Table

    file = file or sys.stdout
    console = Console(file=file, width=None if file.isatty() else 200, highlight=False)
    s = summary(results)
    name = ARCH_NAMES.get(arch, "")
    title = f"Ahead-of-time compile for sm_{arch}{f' ({name})' if name else ''}, shared memory limit " \
            f"{smem_limit(arch) // 1024} KiB per block"
    table = Table(title=title, title_justify="left")
    for col, just in (("status", "left"), ("kernel", "left"), ("dtype", "left"), ("where / constexprs", "left"),
                      ("warps", "right"), ("stages", "right"), ("shared B", "right"), ("regs", "right"),
                      ("spill B", "right"), ("n", "right")):
        table.add_column(col, justify=just, overflow="fold")
    style = {"FAIL": "bold red", "spill": "yellow", "skip": "dim", "ok": "green"}
    if verbose:
        rows = [(r, 1) for r in results]
    else:  # each failing / spilling config, and per (kernel, dtype) the largest of the rest
        rows, groups = [], {}
        for r in results:
            if r.status in ("FAIL", "spill"):
                rows.append((r, 1))
            else:
                groups.setdefault((r.group, r.kernel, r.dtype), []).append(r)
        for rs in groups.values():
            worst = max(rs, key=lambda r: (r.regs, r.shared))
            rows.append((worst, len(rs)))
        rows.sort(key=lambda x: ({"FAIL": 0, "spill": 1}.get(x[0].status, 2), x[0].group, x[0].kernel, x[0].dtype))
    for r, n in rows:
        detail = f"{r.where}  {r.constexprs}" + (f"\n{r.error}" if r.error else "")
        if n > 1:
            detail = f"largest of {n} configs: " + detail
        table.add_row(f"[{style.get(r.status, '')}]{r.status}[/]", f"{r.group}.{r.kernel}", r.dtype, detail,
                      str(r.num_warps), str(r.num_stages), str(r.shared) if r.status != "FAIL" or r.shared else "-",
                      str(r.regs or "-"), str(r.spill) if r.regs else "-", str(n))
    console.print(table)
    console.print(f"sm_{arch}: {s['total']} configs: {s['ok']} ok, {s['spill']} spill (max {s['max_spill']} B), "
                  f"{s['skip']} autotune configs skipped, {s['failed']} failed; max shared memory "
                  f"{s['max_shared']} B of {smem_limit(arch)}, max {s['max_regs']} registers")
    return s["failed"]
