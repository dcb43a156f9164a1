"""One point of the scaling sweep, measured in a fresh child (:func:`attnbench.measure.isolation.run_in_child`):
the correctness gate (:func:`attnbench.checks.verify.verify_resolved`) at a small shape, then the first call (its time
and process-level peak memory), one call under the FLOP counter and :class:`~attnbench.measure.memory.TensorMemory`,
then timing. A point that fails the gate is recorded ``incorrect`` and never timed ("a speedup is never reported
on a red gate")."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from attnbench.api.spec import Spec
from attnbench.measure.flops import flop_counter
from attnbench.measure.memory import TensorMemory, timed_first_call
from attnbench.measure.timing import MODES, make_step, parse_dtype, time_fn
from attnbench.checks.verify import verify_resolved


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
    dtype = parse_dtype(spec.dtype)
    check = verify_resolved(spec.attention, heads=spec.heads, head_dim=spec.head_dim, causal=spec.causal,
                            dtype=dtype, device=spec.device, grads=spec.mode == "fwd+bwd",
                            seq_len=spec.check_seq_len, options=spec.options, impl=spec.impl, floor=spec.rtol,
                            seed=spec.seed)
    if not check.ok:
        return {"status": "incorrect", "impl": check.impl, "metrics": check.as_metrics(), "error": check.detail}

    module = Spec.make(spec.attention, spec.options).build(seq_len=spec.seq_len, heads=spec.heads,
                                                           head_dim=spec.head_dim, causal=spec.causal,
                                                           impl=spec.impl).to(spec.device)
    impl = module.resolve_impl(spec.device)
    grad = spec.mode == "fwd+bwd"
    shape = (spec.batch, spec.heads, spec.seq_len, spec.head_dim)
    cuda = spec.device.startswith("cuda")
    q, k, v = (torch.randn(shape, device=spec.device, dtype=dtype).requires_grad_(grad) for _ in range(3))
    g = torch.randn(shape, device=spec.device, dtype=dtype) if grad else None
    input_bytes = sum(t.numel() * t.element_size() for t in (q, k, v))
    if spec.inject == "oom":
        raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 0 bytes (injected "
                           "out-of-memory, test hook)")

    step = make_step(module, q, k, v, g)

    # 1. the first call, timed, with the process-level memory figure (the gate has already warmed up the
    #    libraries at a small shape)
    first, mem = timed_first_call(step, cuda)
    # 2. FLOPs and the tensor-level memory figure of one call (also a warm-up)
    with flop_counter() as counter, TensorMemory() as meter:
        step()
    flops = int(counter.get_total_flops())
    # 3. timing
    stats = time_fn(step, warmup_ms=spec.warmup_ms, rep_ms=spec.rep_ms, min_reps=spec.min_reps,
                    max_reps=spec.max_reps, estimate_s=first, cuda=cuda)
    out_bytes = spec.batch * spec.heads * spec.seq_len * spec.head_dim * q.element_size()
    metrics = {**stats.as_metrics(), "first_call_s": first,
               "peak_tensor_bytes": int(meter.peak), "tensor_mem_method": meter.method,
               "tensor_bytes_at_end": int(meter.live), "tensor_bytes_allocated": int(meter.allocated), **mem,
               "input_bytes": input_bytes, "output_bytes": out_bytes, "flops": flops,
               "gflops": (flops / stats.median / 1e9) if flops and stats.median > 0 else None,
               "threads": torch.get_num_threads(), **check.as_metrics()}
    return {"status": "ok", "impl": impl, "metrics": metrics, "error": None}
