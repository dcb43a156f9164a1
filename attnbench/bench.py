"""Timing, peak memory and FLOPs of one attention at one shape — with a correctness gate before any timing.

The pieces, usable on their own:

- :func:`check_correctness` — the gate: the resolved fast form against ``module.reference`` at a small shape
  (forward, and the input gradients for ``fwd+bwd``), judged by the one tolerance policy of
  :mod:`attnbench.tolerance` (error against the float64 reference at most ``MULTIPLE`` times the reference's own
  error in the run's dtype, plus a floor). A point that fails is recorded ``incorrect`` and never timed ("a
  speedup is never reported on a red gate").
- :func:`time_fn` — do_bench-style repeated timing: warm-up, then as many repetitions as fit ``rep_ms``
  (between ``min_reps`` and ``max_reps``); median, 20/80 and 25/75 percentiles, IQR.
- :func:`count_flops` — ``torch.utils.flop_counter.FlopCounterMode`` (matmul-class ops; elementwise work is not
  counted). The CPU SDPA kernels, which torch does not count, are registered here with torch's own SDPA formula.
- :class:`TensorMemory` — the primary memory figure: the peak bytes of tensor storages alive at once during a
  call, counting the storages created inside it (above the inputs and parameters), op by op through a
  ``TorchDispatchMode``. It does not depend on the allocator or the CPU: the same on any machine.
- :class:`PeakRSS` — the secondary, process-level figure on the CPU: ``VmHWM`` from ``/proc/self/status``, reset
  to the current RSS through ``/proc/self/clear_refs``. An RSS rise below one page is *below its resolution*
  (the allocator served the call from memory it already held, as glibc does for small N after the gate's
  warm-up): recorded as None with the reason, never as 0. On CUDA, ``torch.cuda.max_memory_allocated``.
- :func:`measure_point` — everything above for one :class:`PointSpec`, meant to run in a fresh child process
  (:func:`run_in_child`) so the memory it reports is the point's own.
- :func:`run_in_child` — a forkserver child per point (torch preloaded in the server, so a child costs a fork,
  not an import), with a hard time limit (the child is killed: ``timeout``), an optional address-space budget
  (``RLIMIT_DATA``: an allocation past it fails like an out-of-memory), and out-of-memory detection (torch's
  allocator errors, ``MemoryError``, or a child killed by SIGKILL, as the kernel's OOM killer does).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import signal
import statistics
import time
import traceback
import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import registry
from .checks import forward_backward
from .errors import is_oom
from .protocol import UnsupportedError
from .tolerance import compare

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
MODES = ("fwd", "fwd+bwd")
MEM_METHOD_CPU = "child-process peak RSS (VmHWM after clear_refs reset) minus RSS after inputs"
MEM_METHOD_CPU_NORESET = "child-process peak RSS (VmHWM, no reset available) minus RSS after inputs"
MEM_METHOD_CUDA = "torch.cuda.max_memory_allocated minus allocated after inputs"
TENSOR_MEM_METHOD = ("peak bytes of tensor storages alive at once during the call, created by its ops (inputs and "
                     "parameters not counted; scratch inside a single kernel not seen)")
def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}") from None


# --- FLOPs ---------------------------------------------------------------------------------------------------
def _register_cpu_sdpa_flops() -> None:
    """torch counts the CUDA SDPA kernels but not the CPU flash kernel; count it with torch's formula."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None and fwd not in fc.flop_registry and fwd.default not in fc.flop_registry:
        def _fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_flop_count(query_shape, key_shape, value_shape)
        fc.register_flop_formula(fwd)(_fwd)
    if bwd is not None and bwd not in fc.flop_registry and bwd.default not in fc.flop_registry:
        def _bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
        fc.register_flop_formula(bwd)(_bwd)


try:
    _register_cpu_sdpa_flops()
except Exception:  # noqa: BLE001 - a torch without these ops or this API: FLOPs of SDPA on CPU stay uncounted
    pass


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of one call of ``fn`` as ``torch.utils.flop_counter.FlopCounterMode`` counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


# --- timing --------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class TimingStats:
    """Seconds. ``iqr`` = q75 - q25; ``q20``/``q80`` are do_bench's spread quantiles."""

    median: float
    q20: float
    q80: float
    q25: float
    q75: float
    min: float
    mean: float
    reps: int
    cpu_median: float | None = None   # process CPU seconds per call (all threads): robust to a busy machine

    @property
    def iqr(self) -> float:
        return self.q75 - self.q25

    @classmethod
    def of(cls, times: list[float], cpu_times: list[float] | None = None) -> "TimingStats":
        ts = sorted(times)
        return cls(median=statistics.median(ts), q20=_quantile(ts, 0.2), q80=_quantile(ts, 0.8),
                   q25=_quantile(ts, 0.25), q75=_quantile(ts, 0.75), min=ts[0], mean=statistics.fmean(ts),
                   reps=len(ts), cpu_median=statistics.median(cpu_times) if cpu_times else None)

    def as_metrics(self) -> dict[str, float | None]:
        return {"time_median_s": self.median, "time_q20_s": self.q20, "time_q80_s": self.q80,
                "time_q25_s": self.q25, "time_q75_s": self.q75, "time_iqr_s": self.iqr, "time_min_s": self.min,
                "time_mean_s": self.mean, "reps": self.reps, "cpu_time_median_s": self.cpu_median}


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolation quantile of an already sorted list."""
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def round_robin(fns: dict, repeats: int, warmup: int = 1) -> dict:
    """Median wall time of each callable, the callables interleaved round by round (standalone benchmark
    scripts comparing two forms in one run)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def time_fn(fn: Callable[[], Any], *, warmup_ms: float = 100.0, rep_ms: float = 1000.0, min_reps: int = 3,
            max_reps: int = 100, estimate_s: float | None = None, sync: Callable[[], None] | None = None
            ) -> TimingStats:
    """Time ``fn`` like ``triton.testing.do_bench``: warm up for ~``warmup_ms``, then repeat for ~``rep_ms``.

    ``estimate_s`` is the duration of one call if already known (else one untimed call measures it); ``sync``
    is called before reading the clock (``torch.cuda.synchronize`` on a GPU).
    """
    sync = sync or (lambda: None)
    if estimate_s is None:
        t0 = time.perf_counter()
        fn()
        sync()
        estimate_s = time.perf_counter() - t0
    est_ms = max(estimate_s * 1e3, 1e-3)
    for _ in range(min(int(warmup_ms / est_ms), 1000)):
        fn()
    sync()
    n = max(min_reps, min(max_reps, int(rep_ms / est_ms)))
    times, cpu = [], []
    for _ in range(n):
        c0 = time.process_time()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return TimingStats.of(times, cpu)


# --- memory --------------------------------------------------------------------------------------------------
def _proc_status_kb(*keys: str) -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in keys:
                out[k] = int(v.split()[0])
    return out


class TensorMemory(TorchDispatchMode):
    """Peak bytes of tensor storages alive at once inside the ``with`` block, counting only storages the block's
    ops create (not its inputs, parameters, or anything that existed before), in bytes.

    Every op that runs under the mode (forward, and the backward the autograd engine runs for it) is seen at the
    aten level: an output whose storage is none of the op's inputs' storages is a new allocation of
    ``storage.nbytes()``; it stops counting when the storage is freed (a weakref finalizer on the storage). Views
    share their base's storage and are not counted twice. Scratch memory a single kernel allocates and frees
    inside itself is not seen. Deterministic and allocator-independent: the same on any CPU.

    After the block: ``peak`` (the figure), ``live`` (bytes still alive at exit: outputs, gradients),
    ``allocated`` (total bytes created), ``count`` (storages created).
    """

    method = TENSOR_MEM_METHOD

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.allocated = 0
        self.count = 0
        self._finalizers: dict[int, weakref.finalize] = {}

    def _free(self, key: int, nbytes: int) -> None:
        if self._finalizers.pop(key, None) is not None:
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            key = _storage_key(t)
            if key is None or key in inputs or key in self._finalizers:
                continue
            storage = t.untyped_storage()
            nbytes = storage.nbytes()
            self._finalizers[key] = weakref.finalize(storage, self._free, key, nbytes)
            self.live += nbytes
            self.allocated += nbytes
            self.count += 1
            self.peak = max(self.peak, self.live)
        return out

    def __exit__(self, *exc):
        for f in list(self._finalizers.values()):  # what outlives the block is no longer this block's business
            f.detach()
        self._finalizers.clear()
        return super().__exit__(*exc)


def _tensors(tree) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # tensors without a storage (sparse, nested, functional)
        return None


def tensor_peak(fn: Callable[[], Any]) -> TensorMemory:
    """Run ``fn()`` once under :class:`TensorMemory`; returns the meter (``.peak`` in bytes)."""
    with TensorMemory() as meter:
        fn()
    return meter


def _trim_allocator() -> None:
    """Give the C allocator's cached free memory back to the OS where it can (glibc ``malloc_trim``), so an RSS
    rise reflects the call rather than the cache's state; a no-op elsewhere."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakRSS:
    """Peak resident set size of this process since :meth:`reset`, in bytes, on Linux.

    ``reset()`` writes ``5`` to ``/proc/self/clear_refs`` (resets ``VmHWM`` to the current RSS) and records the
    current RSS as the baseline; ``peak()`` is ``VmHWM - baseline``. Where the reset is not allowed, ``VmHWM`` is
    read as is (``resettable`` False): still right for a fresh child whose earlier peak was below the run's.
    :meth:`measured` gives the figure with its resolution applied: below one page it is None, with the reason.
    """

    resolution = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __init__(self) -> None:
        self.baseline = 0
        self.resettable = True

    @staticmethod
    def available() -> bool:
        return os.path.exists("/proc/self/status")

    def reset(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.resettable = False
        self.baseline = _proc_status_kb("VmRSS")["VmRSS"] * 1024

    def peak(self) -> int:
        return _proc_status_kb("VmHWM")["VmHWM"] * 1024 - self.baseline

    @property
    def method(self) -> str:
        return MEM_METHOD_CPU if self.resettable else MEM_METHOD_CPU_NORESET

    def measured(self) -> tuple[int | None, str | None]:
        """``(bytes, None)``, or ``(None, why)`` when the rise is below the resolution (one page)."""
        peak = self.peak()
        if peak < self.resolution:
            return None, (f"below resolution: the RSS rose by {max(peak, 0)} B, less than one page "
                          f"({self.resolution} B): the allocator served the call from memory it already held")
        return peak, None


# --- correctness gate ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class CheckResult:
    ok: bool
    err: float          # the fast form's error against float64, relative to max|ref| + 1 (the worst tensor's)
    tol: float          # the bound it was held to: MULTIPLE * ref_err + floor (attnbench.tolerance)
    ref_err: float      # the reference's own error in the run dtype (against float64), same tensor
    seq_len: int
    impl: str
    detail: str = ""

    def as_metrics(self) -> dict[str, Any]:
        return {"check_err": self.err, "check_tol": self.tol, "check_ref_err": self.ref_err,
                "check_seq_len": self.seq_len}


def make_step(module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None):
    """The timed call: a forward under no_grad, or (``g`` given) forward and backward with output gradient g."""
    if g is not None:
        def step():
            q.grad = k.grad = v.grad = None
            module(q, k, v).backward(g)
    else:
        def step():
            with torch.no_grad():
                module(q, k, v)
    return step


def build_attention(name: str, *, seq_len: int, heads: int, head_dim: int, causal: bool, impl: str = "auto",
                    options: dict | None = None):
    """Build through ``build_for_length`` (mechanisms whose options depend on N, e.g. Linformer)."""
    return registry.build_for_length(name, seq_len=seq_len, heads=heads, head_dim=head_dim, causal=causal,
                                     impl=impl, **(options or {}))


def check_correctness(name: str, *, heads: int, head_dim: int, causal: bool, dtype: str = "fp32",
                      device: str = "cpu", mode: str = "fwd", seq_len: int = 128, batch: int = 1,
                      options: dict | None = None, impl: str = "auto", rtol: float | None = None,
                      seed: int = 0) -> CheckResult:
    """The resolved fast form against ``module.reference`` at ``[batch, heads, seq_len, head_dim]``.

    The ground truth is the reference in float64 (the module deep-copied to float64); the ruler is the reference
    in ``dtype``. The fast form runs in ``dtype`` and is judged by :func:`attnbench.tolerance.compare`: its error
    must be at most ``MULTIPLE`` times the reference's own error plus the dtype's floor (``rtol``, if given,
    replaces the floor). For ``fwd+bwd`` the gradients of ``<out, g>`` with respect to q, k, v are held to the
    same policy. Raises :class:`UnsupportedError` if the mechanism cannot be built this way.
    """
    tdtype = parse_dtype(dtype)
    module = build_attention(name, seq_len=seq_len, heads=heads, head_dim=head_dim, causal=causal, impl=impl,
                             options=options).to(device)
    resolved = module.resolve_impl(device)
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq_len, head_dim)
    base = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3)]
    g64 = torch.randn(shape, generator=gen, dtype=torch.float64).to(device)
    weight = g64 if mode == "fwd+bwd" else None

    def run(fn, dt):
        return forward_backward(fn, [t.to(device=device, dtype=dt) for t in base], weight)

    try:
        ref64 = run(copy.deepcopy(module).double().reference, torch.float64)
    except (RuntimeError, TypeError):  # a reference that cannot run in float64: ground truth in float32
        ref64 = run(copy.deepcopy(module).float().reference, torch.float32)
    ref_low = run(module.reference, tdtype)
    fast = run(module, tdtype)
    a = compare(fast, ref_low, ref64, names=["output", "grad q", "grad k", "grad v"], dtype=tdtype, floor=rtol)
    detail = f"{a.describe()} at N={seq_len} (impl={resolved})"
    return CheckResult(ok=a.ok, err=a.err, tol=a.bound, ref_err=a.ref_err, seq_len=seq_len, impl=resolved,
                       detail=detail)


# --- one point -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class PointSpec:
    """Everything a child needs to measure one point. ``inject`` ('oom', 'timeout', 'fail') is a test hook."""

    attention: str
    seq_len: int
    mode: str = "fwd"
    causal: bool = False
    dtype: str = "fp32"
    device: str = "cpu"
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    options: dict = dataclasses.field(default_factory=dict)
    impl: str = "auto"
    seed: int = 0
    threads: int = 0                 # torch threads in the child; 0 = leave torch's default
    check_seq_len: int = 128
    rtol: float | None = None
    warmup_ms: float = 100.0
    rep_ms: float = 1000.0
    min_reps: int = 3
    max_reps: int = 50
    inject: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        parse_dtype(self.dtype)


def measure_point(spec: PointSpec) -> dict[str, Any]:
    """Gate, then the first call (its time and process-level peak memory), then one call under the FLOP counter
    and :class:`TensorMemory` (``peak_tensor_bytes``: the primary memory figure), then timing. Returns a result dict
    ``{"status", "impl", "metrics", "error"}``; raises on failures (``run_in_child`` classifies them)."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    if spec.inject == "timeout":
        while True:
            time.sleep(3600)
    if spec.inject == "fail":
        raise RuntimeError("injected failure (test hook)")
    check = check_correctness(spec.attention, heads=spec.heads, head_dim=spec.head_dim, causal=spec.causal,
                              dtype=spec.dtype, device=spec.device, mode=spec.mode, seq_len=spec.check_seq_len,
                              options=spec.options, impl=spec.impl, rtol=spec.rtol, seed=spec.seed)
    if not check.ok:
        return {"status": "incorrect", "impl": check.impl, "metrics": check.as_metrics(), "error": check.detail}

    dtype = parse_dtype(spec.dtype)
    module = build_attention(spec.attention, seq_len=spec.seq_len, heads=spec.heads, head_dim=spec.head_dim,
                             causal=spec.causal, impl=spec.impl, options=spec.options).to(spec.device)
    impl = module.resolve_impl(spec.device)
    grad = spec.mode == "fwd+bwd"
    shape = (spec.batch, spec.heads, spec.seq_len, spec.head_dim)
    cuda = spec.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else None
    q, k, v = (torch.randn(shape, device=spec.device, dtype=dtype).requires_grad_(grad) for _ in range(3))
    g = torch.randn(shape, device=spec.device, dtype=dtype) if grad else None
    input_bytes = sum(t.numel() * t.element_size() for t in (q, k, v))
    if spec.inject == "oom":
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 0 bytes (injected "
                           "out-of-memory, test hook)")

    step = make_step(module, q, k, v, g)

    # 1. the first call, timed, with the process-level memory figure (the gate has already warmed up the
    #    libraries at a small shape)
    mem: dict[str, Any] = {}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        mem = {"peak_cuda_allocated_bytes": int(torch.cuda.max_memory_allocated() - base),
               "mem_method": MEM_METHOD_CUDA}
    elif PeakRSS.available():
        _trim_allocator()
        rss = PeakRSS()
        rss.reset()
        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        peak, note = rss.measured()
        mem = {"peak_rss_bytes": peak, "mem_method": rss.method, "rss_resolution_bytes": rss.resolution}
        if note:
            mem["rss_note"] = note
    else:  # no /proc (not Linux)
        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        mem = {"peak_rss_bytes": None, "rss_note": "not measured (no /proc/self/status on this system)"}
    # 2. FLOPs and the tensor-level memory figure of one call (also a warm-up)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, TensorMemory() as meter:
        step()
    flops = int(counter.get_total_flops())
    # 3. timing
    stats = time_fn(step, warmup_ms=spec.warmup_ms, rep_ms=spec.rep_ms, min_reps=spec.min_reps,
                    max_reps=spec.max_reps, estimate_s=first, sync=sync)
    out_bytes = spec.batch * spec.heads * spec.seq_len * spec.head_dim * q.element_size()
    metrics = {**stats.as_metrics(), "first_call_s": first,
               "peak_tensor_bytes": int(meter.peak), "tensor_mem_method": meter.method,
               "tensor_bytes_at_end": int(meter.live), "tensor_bytes_allocated": int(meter.allocated), **mem,
               "input_bytes": input_bytes, "output_bytes": out_bytes, "flops": flops,
               "gflops": (flops / stats.median / 1e9) if flops and stats.median > 0 else None,
               "threads": torch.get_num_threads(), **check.as_metrics()}
    return {"status": "ok", "impl": impl, "metrics": metrics, "error": None}


# --- child processes -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class ChildOutcome:
    status: str                     # ok | oom | timeout | failed | unsupported | incorrect
    result: dict | None = None      # what the target returned (when it returned)
    error: str | None = None
    exitcode: int | None = None
    wall_s: float = 0.0


_CTX = None


def _context():
    """A forkserver context with torch and attnbench preloaded (spawn where forkserver does not exist)."""
    global _CTX
    if _CTX is None:
        import multiprocessing as mp

        try:
            ctx = mp.get_context("forkserver")
            # FlopCounterMode imports torch._dynamo on first use (seconds): preload it with the mechanisms
            ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.utils.flop_counter", "attnbench",
                                        "attnbench.attention", "attnbench.bench"])
        except ValueError:
            ctx = mp.get_context("spawn")
        _CTX = ctx
    return _CTX


def _limit_memory(budget_bytes: int | None) -> None:
    if not budget_bytes:
        return
    try:
        import resource

        data_now = _proc_status_kb("VmData").get("VmData", 0) * 1024
        limit = data_now + int(budget_bytes)
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ImportError, OSError, ValueError):
        pass


def _child_main(conn, target: Callable[[Any], dict], payload: Any, mem_budget: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills us
    _limit_memory(mem_budget)
    try:
        result = target(payload)
        msg = {"status": result.get("status", "ok"), "result": result, "error": result.get("error")}
    except UnsupportedError as e:
        msg = {"status": "unsupported", "result": None, "error": str(e)}
    except BaseException as e:  # noqa: BLE001 - every failure becomes a record
        status = "oom" if is_oom(e) else "failed"
        tb = "".join(traceback.format_exception_only(type(e), e)).strip()
        if status == "failed":
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:]).strip()
        msg = {"status": status, "result": None, "error": tb[-4000:]}
    try:
        conn.send(msg)
    finally:
        conn.close()


def run_in_child(target: Callable[[Any], dict], payload: Any, *, timeout: float | None = None,
                 mem_budget_bytes: int | None = None) -> ChildOutcome:
    """Run ``target(payload)`` in a fresh child; never raises for the child's failures (but re-raises Ctrl-C
    after killing the child). ``target`` must be importable (a module-level function)."""
    ctx = _context()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(send, target, payload, mem_budget_bytes), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    send.close()
    try:
        ready = recv.poll(timeout)
        if not ready:
            proc.kill()
            proc.join()
            return ChildOutcome("timeout", error=f"exceeded the time budget of {timeout:g} s; child killed",
                                exitcode=proc.exitcode, wall_s=time.perf_counter() - t0)
        try:
            msg = recv.recv()
        except (EOFError, OSError):
            msg = None
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    except BaseException:
        if proc.is_alive():
            proc.kill()
            proc.join()
        raise
    finally:
        recv.close()
    wall = time.perf_counter() - t0
    if msg is None:
        code = proc.exitcode
        if code is not None and code < 0 and -code == signal.SIGKILL:
            return ChildOutcome("oom", error="child killed by SIGKILL (the kernel's OOM killer, most likely)",
                                exitcode=code, wall_s=wall)
        what = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        return ChildOutcome("failed", error=f"child died without a result ({what})", exitcode=code, wall_s=wall)
    return ChildOutcome(msg["status"], result=msg["result"], error=msg["error"], exitcode=proc.exitcode,
                        wall_s=wall)


def run_inline(target: Callable[[Any], dict], payload: Any) -> ChildOutcome:
    """:func:`run_in_child` without a child (no memory isolation, no time limit): for debugging."""
    t0 = time.perf_counter()
    try:
        result = target(payload)
        return ChildOutcome(result.get("status", "ok"), result=result, error=result.get("error"),
                            wall_s=time.perf_counter() - t0)
    except UnsupportedError as e:
        return ChildOutcome("unsupported", error=str(e), wall_s=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001
        return ChildOutcome("oom" if is_oom(e) else "failed", error=f"{type(e).__name__}: {e}",
                            wall_s=time.perf_counter() - t0)

