"""The training step of every suite's CPU preset beside softmax's and beside its matmul floor (issue #47).

For each model (recall tiny over its mixers, LM tiny over its table's rows, vision tiny and LRA tiny over the
mechanisms asked for) one step is what the suite's trainer does: zero the gradients, forward, the suite's loss,
backward, clipping where the preset clips, the optimizer's step, on a batch of the preset's shape. Its floor is
the step's matmul-class FLOPs (``torch.utils.flop_counter.FlopCounterMode``, :mod:`attnbench.measure.flops`)
at the rate this machine reaches on the step's *own* matrix products: every mm / bmm / addmm / baddbmm the step
calls is recorded once (shapes, transposition) and replayed bare, and that replay is timed in the same rounds as
the steps. So ``x floor`` = step time / (counted FLOPs / measured rate): 1 would be a step that does nothing but
its products at the speed the BLAS gives those shapes.

All forms are timed interleaved, round by round (:func:`attnbench.measure.timing.round_robin`), on the thread
count asked (default 1); ratios come from one run. ``--compile`` adds each model under ``torch.compile`` (the
model's forward; the backward through AOTAutograd; the loss and the optimizer's step stay eager, as in the suites'
``--compile``) in the same rounds, with its compile time; ``--compile default,reduce-overhead`` adds one column per
mode (``reduce-overhead``: CUDA graphs, on CUDA; on the CPU it compiles as ``default``). ``--device cuda`` builds
and steps the models on the GPU, each timed step ending with a synchronisation (wall time only).
``--reference-forms`` adds each model's step with the shared model's reference forms in place of its fast ones
(``rotary_reference`` for ``rotary``, ``ShortConv.forward_reference`` for its forward: the same numbers to the bit,
tests/test_lm_mixers.py), in the same rounds: what those fast forms save, measured in one process.
``--profile N`` prints torch.profiler's N most expensive ops per model instead of timing; ``--breakdown`` each
model's step by kind of op (the products the floor counts, the rest that holds a step above it).

    python benchmarks/bench_train_step.py --suites recall --threads 1
    python benchmarks/bench_train_step.py --suites lm,vision,lra --compile
    python benchmarks/bench_train_step.py --suites recall --device cuda --compile default,reduce-overhead
    python benchmarks/bench_train_step.py --suites recall,lm --reference-forms --clock cpu
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnbench.engine.train.trainer import make_optimizer, param_groups
from attnbench.measure.flops import count_flops
from attnbench.measure.peak import keep_freed_memory
from attnbench.measure.timing import round_robin
from attnbench.results.provenance import device_name, machine, machine_line

MATMULS = ("mm", "bmm", "addmm", "baddbmm")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")


@dataclasses.dataclass
class Model:
    """One model of one suite: how to run its forward and loss on the fixed batch, its optimizer config."""
    suite: str
    label: str
    module: torch.nn.Module
    loss: Callable[[torch.nn.Module], torch.Tensor]
    train_cfg: object            # attnbench.engine.train.TrainConfig


def _step(m: Model, net: torch.nn.Module, graphs: bool = False) -> Callable[[], None]:
    """One training step of ``m`` through ``net`` (the module, or it compiled); ``graphs``: ``net`` replays CUDA
    graphs (``mode="reduce-overhead"``), so each step tells them a new iteration begins (the last step's outputs,
    read by then, may be overwritten)."""
    cfg = m.train_cfg
    opt = make_optimizer(param_groups(m.module, cfg), cfg)
    params = [p for p in m.module.parameters() if p.requires_grad]

    def step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        m.loss(net).backward()
        if cfg.clip_grad_value:
            torch.nn.utils.clip_grad_value_(params, cfg.clip_grad_value)
        if cfg.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad_norm)
        opt.step()
    return step


class _Products(TorchDispatchMode):
    """Records every matrix product a call makes: (op, operand shapes and whether each is a transposed view)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMULS:
            ops = [a for a in args if isinstance(a, torch.Tensor)]
            self.calls.append((name, tuple((tuple(t.shape), t.dim() >= 2 and t.stride(-2) == 1 and t.shape[-2] > 1)
                                           for t in ops), ops[-1].dtype, ops[-1].device))
        return func(*args, **(kwargs or {}))


def _operand(shape: tuple, transposed: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if transposed:
        return torch.randn(*shape[:-2], shape[-1], shape[-2], dtype=dtype, device=device).transpose(-1, -2)
    return torch.randn(*shape, dtype=dtype, device=device)


def product_replay(step: Callable[[], None]) -> tuple[Callable[[], None], int]:
    """``(replay, flops)``: a callable that redoes every matrix product of one ``step`` on random operands of the
    same shapes and layouts, and those products' FLOPs."""
    with _Products() as rec:
        step()
    ops, flops = [], 0
    for name, operands, dtype, device in rec.calls:
        ts = [_operand(s, t, dtype, device) for s, t in operands]
        fn = getattr(torch, name)
        ops.append((fn, ts))
        mats = [s for s, _ in operands][-2:]          # addmm / baddbmm: (bias, a, b)
        (a, b) = mats
        flops += 2 * a[-2] * a[-1] * b[-1] * (a[0] if len(a) == 3 else 1)

    def replay():
        for fn, ts in ops:
            fn(*ts)
    return replay, flops


@contextlib.contextmanager
def reference_forms():
    """The shared model's reference forms in place of its fast ones, for the calls inside the block."""
    from attnbench.models import mixers

    fast = mixers.rotary, mixers.ShortConv.forward
    mixers.rotary, mixers.ShortConv.forward = mixers.rotary_reference, mixers.ShortConv.forward_reference
    try:
        yield
    finally:
        mixers.rotary, mixers.ShortConv.forward = fast


# --- the suites' models -------------------------------------------------------------------------------------
def recall_models(names: str | None, device: torch.device) -> list[Model]:
    from attnbench.suites.recall.config import load_preset, parse_mixers
    from attnbench.suites.recall.model import build_model
    from attnbench.suites.recall.tasks import generate
    from attnbench.suites.recall.train import masked_loss

    pre = load_preset("tiny")
    point = pre.points()[0]
    cfg = pre.train
    ex = generate(point.task, cfg.batch_size, point.params, 0)
    x, y = torch.as_tensor(ex[0]).to(device), torch.as_tensor(ex[1]).to(device)
    out = []
    for m in parse_mixers(names or pre.mixers):
        if m.variant is None:
            continue
        torch.manual_seed(0)
        model = build_model(pre.model_config(m, point), point.task).to(device)
        out.append(Model("recall", m.label, model, lambda net, x=x, y=y: masked_loss(net(x), y), cfg))
    return out


def lm_models(names: str | None, device: torch.device) -> list[Model]:
    from attnbench.models.lm import build_lm
    from attnbench.models.variants import parse_variant
    from attnbench.suites.lm.cli import TABLE_ROWS
    from attnbench.suites.lm.config import load_preset
    from attnbench.suites.lm.train import next_token_loss

    pre = load_preset("tiny")
    ids = torch.randint(0, pre.data.vocab_size, (pre.train.batch_size, pre.data.seq_len + 1),
                        generator=torch.Generator().manual_seed(0)).to(device)
    out = []
    for name in (names or TABLE_ROWS).split(","):
        v = parse_variant(name)
        torch.manual_seed(0)
        model = build_lm(pre.model_config(v, pre.data.vocab_size)).to(device)
        out.append(Model("lm", v.label, model, lambda net: next_token_loss(net, ids), pre.train))
    return out


VISION_DEFAULT = "softmax,linear,relu_linear,performer,cosformer,hedgehog,polaformer,nala,mirrorla,stella,flatten"


def vision_models(names: str | None, device: torch.device) -> list[Model]:
    from attnbench.api.spec import AttentionSpec
    from attnbench.image.classify import build_classifier, recipe_loss
    from attnbench.suites.vision.config import load_preset

    pre = load_preset("tiny")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(pre.train.batch_size, 3, pre.data.image_size, pre.data.image_size, generator=g)
    y = torch.randint(0, 10, (pre.train.batch_size,), generator=g)
    x, y = x.to(device), y.to(device)
    _, criterion = recipe_loss(pre, 10)
    out = []
    for name in (names or VISION_DEFAULT).split(","):
        spec = AttentionSpec.parse(name)
        spec = spec.with_defaults(pre.options_for(spec.name))
        torch.manual_seed(0)
        model = build_classifier(spec, pre, 10).to(device)
        out.append(Model("vision", spec.label, model, lambda net: criterion(net(x).float(), y), pre.train))
    return out


def lra_models(names: str | None, device: torch.device) -> list[Model]:
    from attnbench.api.spec import AttentionSpec
    from attnbench.suites.lra.config import load_preset
    from attnbench.suites.lra.model import build_model
    from attnbench.suites.lra.train import train_config

    pre = load_preset("tiny")
    task = pre.task("listops")
    m = pre.model
    g = torch.Generator().manual_seed(0)
    vocab = 20                                     # generated ListOps: digits, four operators, brackets, pad
    x = torch.randint(1, vocab, (task.batch_size, task.seq_len), generator=g)
    x[:, -8:] = 0                                  # some padding, as the generated trees are shorter than seq_len
    y = torch.randint(0, 10, (task.batch_size,), generator=g)
    x, y = x.to(device), y.to(device)
    out = []
    for name in (names or VISION_DEFAULT).split(","):
        spec = AttentionSpec.parse(name)
        spec = spec.with_defaults(pre.options_for(spec.name))
        torch.manual_seed(0)
        model = build_model(spec, vocab_size=vocab, num_classes=10, seq_len=task.seq_len, pair=False, pad_id=0,
                            dim=m.dim, ffn_dim=m.ffn_dim, heads=m.heads, head_dim=m.head_dim, layers=m.layers,
                            dropout=m.dropout).to(device)
        out.append(Model("lra", spec.label, model, lambda net: F.cross_entropy(net(x).float(), y),
                         train_config(task)))
    return out


SUITES = {"recall": recall_models, "lm": lm_models, "vision": vision_models, "lra": lra_models}


def _profiled(m: Model, steps: int = 5):
    """torch.profiler over ``steps`` training steps of ``m``, after 3 that warm it up."""
    from torch.profiler import ProfilerActivity, profile

    step = _step(m, m.module)
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            step()
    return p


def _profile(models: list[Model], rows: int) -> None:
    for m in models:
        p = _profiled(m)
        print(f"\n== {m.suite} · {m.label} (5 steps)")
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


# ``--breakdown``: aten ops by kind (self CPU time). Products are what the floor counts; the rest is what holds a step
# above it. Ops not named here show as "other", with their names, so nothing is hidden by the grouping.
KINDS = {
    "products": {"mm", "bmm", "addmm", "baddbmm", "addbmm", "mkldnn_convolution", "convolution_backward",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"},
    "solve": {"linalg_solve_triangular", "triangular_solve"},
    "elementwise": {"mul", "mul_", "add", "add_", "sub", "sub_", "rsub", "div", "div_", "neg", "pow", "pow_", "exp",
                    "exp_", "log", "log1p", "sigmoid", "sigmoid_backward", "tanh", "tanh_backward", "silu",
                    "silu_backward", "relu", "threshold", "threshold_", "threshold_backward", "where", "clamp",
                    "clamp_min", "clamp_max", "clamp_min_", "masked_fill", "masked_fill_", "sqrt", "rsqrt", "cos",
                    "sin", "eq", "ne", "lt", "le", "gt", "ge", "abs", "sgn", "sign", "reciprocal", "softplus",
                    "softplus_backward", "elu", "elu_backward", "gelu", "gelu_backward", "lerp_", "addcmul_",
                    "addcdiv_", "mul_out", "square", "tril", "triu", "tril_", "triu_", "logical_not", "bitwise_not",
                    "erf", "expm1", "atan2", "fmod", "remainder", "maximum", "minimum", "hardtanh_backward"},
    "copies and layout": {"copy_", "cat", "stack", "clone", "contiguous", "fill_", "zero_", "zeros", "zeros_like",
                          "ones", "ones_like", "empty", "empty_like", "empty_strided", "new_zeros", "new_empty",
                          "flip", "index_select", "index", "index_put_", "index_add_", "scatter", "scatter_add_",
                          "gather", "embedding", "embedding_dense_backward", "narrow", "as_strided", "transpose", "t",
                          "view", "reshape", "_reshape_alias", "expand", "permute", "unbind", "split",
                          "split_with_sizes", "select", "slice", "_to_copy", "to", "unsqueeze", "squeeze", "detach",
                          "alias", "resize_", "constant_pad_nd", "pad", "repeat", "diag_embed", "eye", "arange",
                          "full", "full_like", "lift_fresh", "select_backward", "slice_backward", "unfold",
                          "_unsafe_view", "flatten", "expand_as", "movedim", "clone_", "masked_select"},
    "reductions and scans": {"sum", "mean", "cumsum", "cumsum_", "linalg_vector_norm", "norm", "max", "amax", "min",
                             "logsumexp", "_log_softmax", "_log_softmax_backward_data", "_softmax",
                             "_softmax_backward_data", "var", "std", "var_mean", "prod", "cumprod", "nll_loss_forward",
                             "nll_loss_backward", "_fused_rms_norm", "native_layer_norm",
                             "native_layer_norm_backward", "_fused_rms_norm_backward", "sort", "topk"},
}


def _kind(key: str) -> str:
    """The kind of one profiler event (its self time: events nest, self times add up to the profiled time)."""
    if key.startswith("autograd::engine"):
        return "autograd engine"
    if key.startswith("Optimizer.") or key.startswith("aten::_foreach_"):
        return "optimizer"
    name = key[len("aten::"):] if key.startswith("aten::") else None
    return next((k for k, names in KINDS.items() if name in names), "other")


def _breakdown(models: list[Model], steps: int = 5) -> None:
    """Per model: the share of a step's self CPU time by kind, and its costliest ops that are not products."""
    order = list(KINDS) + ["optimizer", "autograd engine", "other"]
    print(f"self CPU time per step by kind (torch.profiler, {steps} steps after 3; its per-op overhead adds a few us "
          f"to every op, so the small ops' share reads high; 'other': Python-level autograd functions, unlisted ops)")
    print(f"{'suite':7} {'model':22} {'ms':>6} " + " ".join(f"{k.split()[0][:11]:>11}" for k in order)
          + "  costliest non-products")
    for m in models:
        p = _profiled(m, steps)
        per_kind = dict.fromkeys(order, 0.0)
        ops: dict[str, float] = {}
        for e in p.key_averages():
            kind = _kind(e.key)
            per_kind[kind] += e.self_cpu_time_total
            if kind not in ("products", "autograd engine"):
                ops[e.key.removeprefix("aten::")] = e.self_cpu_time_total
        total = sum(per_kind.values())
        top = sorted(ops.items(), key=lambda kv: -kv[1])[:4]
        print(f"{m.suite:7} {m.label:22} {total / steps / 1e3:6.1f} "
              + " ".join(f"{100 * per_kind[k] / total:10.0f}%" for k in order) + "  "
              + ", ".join(f"{name} {t / steps / 1e3:.1f}" for name, t in top))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default="recall", help=f"comma-separated, of {', '.join(SUITES)}")
    ap.add_argument("--recall", default=None, help="recall mixers (default: the tiny preset's)")
    ap.add_argument("--lm", default=None, help="LM rows (default: the table's eight)")
    ap.add_argument("--vision", default=None, help=f"vision mechanisms (default: {VISION_DEFAULT})")
    ap.add_argument("--lra", default=None, help="LRA mechanisms (default: as vision)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10, help="timed rounds (each form once per round)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time, or this process's CPU time (one thread on a busy machine: leaves out the waits "
                         "for a core)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda[:N]: the models built and stepped there")
    ap.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODES",
                    help="also each model under torch.compile, same rounds; MODES: comma-separated torch.compile "
                         f"modes, of {', '.join(COMPILE_MODES)} (default: default)")
    ap.add_argument("--reference-forms", action="store_true",
                    help="also each model with the shared model's reference forms (rotary, the short convolution) "
                         "in place of the fast ones, same rounds")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest ops per model")
    ap.add_argument("--breakdown", action="store_true",
                    help="each model's step by kind of op (products, solve, elementwise, copies, reductions, "
                         "optimizer, other) and its costliest ops that are not products")
    a = ap.parse_args(argv)
    unknown = [s for s in a.suites.split(",") if s not in SUITES]
    if unknown:
        print(f"--suites: unknown {', '.join(unknown)}; choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    modes = a.compile.split(",") if a.compile else []
    bad = [m for m in modes if m not in COMPILE_MODES]
    if bad:
        print(f"--compile: unknown mode {', '.join(bad)}; choose from {', '.join(COMPILE_MODES)}", file=sys.stderr)
        return 2
    try:
        device = torch.device(a.device)
    except RuntimeError:
        print(f"--device: {a.device!r} is not a device; give cpu or cuda[:N]", file=sys.stderr)
        return 2
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print(f"--device {a.device}: this torch sees no CUDA device; run on the CPU (--device cpu)", file=sys.stderr)
        return 2
    if cuda and a.clock == "cpu":
        print("--clock cpu times this process's CPU only, not the GPU's work: use --clock wall with --device cuda",
              file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    keep_freed_memory()   # as every run does: the steps are timed with the allocator the suites train with
    print(machine_line(machine(threads=a.threads)))
    if cuda:
        print(f"device: {device_name(str(device))} · CUDA {torch.version.cuda} · each timed step ends with "
              f"torch.cuda.synchronize()")
    models = [m for s in a.suites.split(",") for m in SUITES[s](getattr(a, s), device)]
    if a.profile:
        _profile(models, a.profile)
        return 0
    if a.breakdown:
        _breakdown(models)
        return 0
    sync = torch.cuda.synchronize if cuda else (lambda: None)   # a step's GPU work is timed with it
    fns, info = {}, {}
    for m in models:
        key = (m.suite, m.label)
        step = _step(m, m.module)
        flops = count_flops(lambda: m.loss(m.module).backward())
        replay, replay_flops = product_replay(step)
        fns[key + ("eager",)] = step
        fns[key + ("products",)] = replay
        info[key] = {"flops": flops, "replay_flops": replay_flops, "compile_s": {}}
        for mode in modes:
            # one torch.compile wrapper per mode: a wrapper's mode is fixed when it is made
            compiled = torch.compile(m.module, mode=None if mode == "default" else mode)
            cstep = _step(m, compiled, graphs=cuda and mode == "reduce-overhead")
            t0 = time.perf_counter()
            cstep()
            sync()
            secs = info[key]["compile_s"][mode] = time.perf_counter() - t0
            print(f"compiled: {m.suite} · {m.label} · {mode} in {secs:.1f} s", flush=True)
            fns[key + (mode,)] = cstep
        if a.reference_forms:
            def reference(step=step):
                with reference_forms():
                    step()
            fns[key + ("reference",)] = reference
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    t = round_robin(fns, repeats=a.repeats, warmup=2, clock=clock, sync=sync)
    print(f"one step per model, {a.threads} thread(s), {a.clock} time, medians of {a.repeats} interleaved rounds; "
          f"floor = counted FLOPs at the rate of the step's own matrix products replayed bare")
    head = f"{'suite':7} {'model':22} {'ms/step':>8} {'GFLOP':>6} {'prod GF/s':>9} {'x floor':>7} {'x softmax':>9}"
    print(head + "".join(f"  {mode}: x eager  compile s" for mode in modes)
          + ("  fast / reference forms" if a.reference_forms else ""))
    base: dict[str, float] = {}
    for (suite, label), d in info.items():
        if label in ("softmax", "transformer"):
            base[suite] = t[(suite, label, "eager")]
    for (suite, label), d in info.items():
        step_s = t[(suite, label, "eager")]
        rate = d["replay_flops"] / t[(suite, label, "products")]
        floor = d["flops"] / rate
        rel = f"{step_s / base[suite]:9.2f}" if suite in base else f"{'':>9}"
        line = (f"{suite:7} {label:22} {step_s * 1e3:8.1f} {d['flops'] / 1e9:6.2f} {rate / 1e9:9.1f} "
                f"{step_s / floor:7.2f} {rel}")
        for mode in modes:
            line += f"  {t[(suite, label, mode)] / step_s:{len(mode) + 9}.2f}  {d['compile_s'][mode]:9.1f}"
        if a.reference_forms:
            line += f"  {step_s / t[(suite, label, 'reference')]:23.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
