"""``attnbench doctor``: one command a user runs on a new GPU machine before trusting any number.

In one process, after printing the machine and what its versions cannot do: the contract of every registered
mechanism (built-ins and plug-ins) on the device in each precision of the preset, every impl against the float64
reference, forward and backward (:func:`attnbench.checks.verify.verify_all`); the gate of every timed form
(:mod:`attnbench.suites.doctor.forms`) at the preset's shape; the presets' smokes, each in a child process (a
CUDA error poisons the process it happens in; the smoke's exit code is its verdict) on the device in the preset's
own precision; then the timings, shortest length first: the median and quantiles over repeats (CUDA events
through ``triton.testing.do_bench``), the first call apart (JIT, autotuning, compilation), peak memory, the
nominal TFLOP/s and its share of the card's peak. A form whose gate failed is never timed: its timings are
recorded ``incorrect`` with the reason. Every step becomes a record of the store (suite ``doctor``), the
summary (``doctor.md``) is rendered from those records, and one verdict line ends the run; any failure exits 1.
Each record is stored as it is made, so a run stopped at a deadline (Ctrl-C, SIGTERM: exit 130) keeps its finished
steps and still writes its summary; a smoke may run past the budget by a minute at most, then it is stopped
(``timeout``, not a failure).
``--plan`` prints every step (those that cannot run here with the reason, those the budget drops) and runs none.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from attnbench.api import registry
from attnbench.api import suites as suite_registry
from attnbench.checks.verify import DELTA_OPS, agreement, judge_module, runnable_impls, verify_all
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import work_dir
from attnbench.engine.interrupts import sigterm_as_interrupt
from attnbench.engine.presets import preset_names
from attnbench.measure.memory import timed_first_call
from attnbench.measure.peak import PeakMeter
from attnbench.measure.timing import DTYPES, time_fn
from attnbench.results.store import Store
from attnbench.suites.doctor import leaderboard, node
from attnbench.suites.doctor.config import DoctorPreset, load_preset
from attnbench.suites.doctor.forms import (Form, Shape, available, for_length, forget, kernel_forms,
                                           mechanism_forms)
from attnbench.suites.doctor.plan import Plan, Step, exponent, make_plan

SUITE = "doctor"
SMOKE_TIMEOUT_S = 1800


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise AttnbenchError(f"--device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise AttnbenchError("--device cuda: torch.cuda.is_available() is False here; use --device cpu or --plan")
    return torch.device(device)


def every_smoke() -> list[str]:
    """``suite/preset`` for every embedded preset of every suite with a run command (the doctor's own aside)."""
    out = []
    for name in suite_registry.suite_names():
        suite = suite_registry.get_suite(name)
        if name == SUITE or suite.run is None:
            continue
        try:
            names = preset_names(f"attnbench.suites.{name}")
        except (FileNotFoundError, ModuleNotFoundError):
            names = []
        out += [f"{name}/{p}" for p in names] or [f"{name}/-"]
    return out


def choose_smokes(pre: DoctorPreset, smokes: Optional[str]) -> list[str]:
    """The preset's smokes, or ``--smokes``: ``all``, ``none`` or a comma-separated ``suite/preset`` list."""
    if smokes is None:
        chosen = list(pre.smokes)
    elif smokes == "all":
        return every_smoke()
    elif smokes == "none":
        return []
    else:
        chosen = [s.strip() for s in smokes.split(",") if s.strip()]
    known = every_smoke()
    bad = [s for s in chosen if s not in known]
    if bad:
        raise AttnbenchError(f"--smokes: unknown suite/preset {', '.join(bad)}; known: {', '.join(known)}")
    return chosen


def contract_size(names: Sequence[str], lengths: Sequence[int]) -> int:
    """How many verdicts one precision of the contract has (every impl of every form at every length; the
    delta-rule ops: their torch and FLA forms)."""
    n = 0
    for name in names:
        if name in DELTA_OPS:
            n += 2
            continue
        cls = registry.get_attention(name)
        forms = [c for c, ok in ((False, cls.bidirectional), (True, cls.causal_form)) if ok]
        n += sum(len(runnable_impls(cls, c)) for c in forms)
    return n * len(lengths)


def _mechanism_flops(forms: list[Form], pre: DoctorPreset) -> dict[str, tuple[float, float]]:
    """Each mechanism form's FLOPs at the gate length and its power of N (counted at N and 2N on the CPU)."""
    out = {}
    for f in forms:
        if f.family == "kernel":
            continue
        try:
            a, b = (for_length(f if f.family == "mechanism" else _eager(f), n, torch.device("cpu")).flops(n)
                    for n in (pre.gate_len, 2 * pre.gate_len))
        except Exception:  # a mechanism that cannot count its FLOPs: estimated as linear in N
            a, b = 0.0, 0.0
        out[f.name] = (a, exponent(a, b))
    return out


def _eager(f: Form) -> Form:
    return dataclasses.replace(f, family="mechanism")


def build_plan(pre: DoctorPreset, *, names: Sequence[str], device: torch.device, smokes: list[str],
               budget_s: float, env: dict) -> Plan:
    """``names``: the contract's mechanisms (and delta-rule ops); the registered ones among them are also timed."""
    attn = Shape(pre.batch, pre.heads, pre.head_dim)
    delta = Shape(pre.batch, pre.delta_heads, pre.delta_head_dim)
    timed = [n for n in names if n not in DELTA_OPS]
    forms = kernel_forms(attn, delta) + mechanism_forms(timed, attn, compile=pre.compile)
    skips = {f.name: why for f in forms if (why := available(f, device))}
    peak, _ = node.peak_flops(env, pre.dtype if device.type == "cuda" else "fp32")
    return make_plan(pre, forms, device=device.type, contract_rows=contract_size(names, pre.check_lengths),
                     smokes=smokes, skips=skips, peak=peak, budget_s=budget_s,
                     mechanism_flops=_mechanism_flops([f for f in forms if f.name not in skips], pre))


# --- the steps --------------------------------------------------------------------------------------------------------
def _weight(out_shape, seed: int = 1) -> torch.Tensor:
    return torch.randn(out_shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def gate(form: Form, pre: DoctorPreset, device: torch.device) -> tuple[bool, dict, str]:
    """``form`` against its exact form at the gate length, forward and backward, under the tolerance policy, in
    the timed precision on ``device`` (ground truth: the exact form in float64 on the same inputs)."""
    dtype = DTYPES[pre.dtype]
    n = pre.gate_len
    made = for_length(form, n, device, dtype)
    x64 = [t.to(device) for t in made.inputs(n)]
    with torch.no_grad():
        out_shape = made.reference(*x64).shape
    weight = _weight(out_shape).to(device)
    if made.module is not None:
        a = judge_module(made.module, made.fast, x64, weight, dtype)
    else:
        a = agreement(made.fast, made.reference, x64, dtype=dtype, weight=weight, reference64=made.reference)
    metrics = {"check_err": a.err, "check_tol": a.bound, "check_ref_err": a.ref_err, "check_seq_len": n,
               "worst": a.worst}
    return a.ok, metrics, "" if a.ok else f"{a.describe()} at N={n}"


def time_form(form: Form, n: int, mode: str, pre: DoctorPreset, device: torch.device,
              peak: Optional[float]) -> dict:
    """One timing (module docstring); raises ``torch.cuda.OutOfMemoryError`` past the card's memory."""
    dtype = DTYPES[pre.dtype]
    made = for_length(form, n, device, dtype)
    grad = mode == "fwd+bwd"
    x = [t.to(device, dtype).requires_grad_(grad) for t in made.inputs(n)]
    cuda = device.type == "cuda"
    if grad:
        with torch.no_grad():
            g = torch.randn_like(made.fast(*x))

        def step():
            for t in x:
                t.grad = None
            made.fast(*x).backward(g)
    else:
        def step():
            with torch.no_grad():
                made.fast(*x)
    first_s, mem = timed_first_call(step, cuda)
    meter = PeakMeter(device)
    stats = time_fn(step, warmup_ms=pre.timing.warmup_ms, rep_ms=pre.timing.rep_ms, cuda=cuda)
    peak_bytes, mem_method = meter.read()
    flops = made.flops(n) * (3 if grad else 1)
    tflops = flops / stats.median / 1e12
    return {**stats.as_metrics(), "first_call_s": first_s, **mem, "peak_bytes": peak_bytes,
            "peak_method": mem_method, "nominal_flops": flops, "tflops": tflops,
            "peak_share": (flops / stats.median / peak) if peak else None}


def run_smoke(smoke: str, *, db: Path, plugins: Sequence[str],
              timeout_s: float = SMOKE_TIMEOUT_S) -> tuple[int, float, str]:
    """``attnbench run SUITE --smoke --preset PRESET`` in a child process: exit code (124: killed at
    ``timeout_s``), seconds, output's tail."""
    suite, preset = smoke.split("/")
    cmd = [sys.executable, "-m", "attnbench.cli.main", "run", suite, "--smoke", "--db", str(db)]
    cmd += [] if preset == "-" else ["--preset", preset]
    for p in plugins:
        cmd += ["--plugin", p]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
        code, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        tail = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        code, out = 124, f"timed out after {timeout_s:.0f} s: {tail[-500:]}"
    return code, time.perf_counter() - t0, "\n".join(out.strip().splitlines()[-6:])


# --- the run ----------------------------------------------------------------------------------------------------------
def run_doctor(*, preset: Optional[str], attn: Optional[str], device: str = "auto", budget_min: Optional[float] = None,
               smokes: Optional[str] = None, plan_only: bool = False, db: Optional[str] = None,
               out: Optional[str] = None, plugins: Sequence[str] = (), say: Callable[[str], None] = print) -> int:
    """The command (module docstring); returns the exit code."""
    forget()
    dev = resolve_device(device)
    pre = load_preset(preset or ("h100" if dev.type == "cuda" else "cpu"))
    names = [n.strip() for n in (attn or "").split(",") if n.strip()] or registry.names() + list(DELTA_OPS)
    for n in names:
        if n not in DELTA_OPS:
            registry.get_attention(n)  # an unknown name: the registry's did-you-mean error, before any work
    budget_s = 60.0 * (budget_min if budget_min is not None else pre.budget_min)
    if budget_s <= 0:
        raise AttnbenchError(f"--budget must be positive minutes, got {budget_min!r}")
    chosen = choose_smokes(pre, smokes)
    env = node.describe(dev)
    for line in node.lines(env):
        say(line)
    for line in node.limitations(env, dev):
        say(f"cannot: {line}")
    plan = build_plan(pre, names=names, device=dev, smokes=chosen, budget_s=budget_s, env=env)
    say(f"plan: {pre.key} on {dev.type} · {len(plan.steps)} steps · estimated {plan.est_s / 60:.1f} of "
        f"{budget_s / 60:g} min")
    for note in plan.notes:
        say(f"budget: {note}")
    if plan_only:
        for s in plan.steps:
            state = f"skipped ({s.skip})" if s.skip else f"dropped ({s.dropped})" if s.dropped else "planned"
            say(f"  {s.kind:<8} {s.label:<58} ~{s.est_s:6.1f} s  {state}")
        return 0
    return _execute(plan, pre, names=names, device=dev, env=env, db=db, out=out, plugins=plugins, say=say)


def _execute(plan: Plan, pre: DoctorPreset, *, names, device, env, db, out, plugins, say) -> int:
    work = work_dir(SUITE, out)
    work.mkdir(parents=True, exist_ok=True)
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)  # a compile per length,
    # never dynamo's silent fall-back to eager after 8 recompiles (a compiled form's timing would be an eager one)
    peak, peak_what = node.peak_flops(env, pre.dtype if device.type == "cuda" else "fp32")
    notes = list(plan.notes)
    with Store(db) as store:
        run = store.start_run(suite=SUITE, setting=pre.key, device=device.type, argv=sys.argv[1:],
                              config={"preset": pre.name, "attentions": list(names), **pre.identity(),
                                      "machine": {k: v for k, v in env.items() if k != "machine"}})
        records: list = []
        gates: dict[str, bool] = {}
        failed = 0
        t0 = time.perf_counter()
        smoke_times: list[float] = []

        def keep(m) -> None:
            """Each record goes to the store as it is made: a run killed at a deadline keeps what it did."""
            store.add(m)
            records.append(m)

        def rec(step: Step, status: str, **kw) -> None:
            keep(run.record(task=step.kind, attention=kw.pop("attention", step.form.name if step.form
                                                             else step.smoke), status=status,
                            device=device.type, **kw))

        interrupted = None
        with sigterm_as_interrupt():
            try:
                for step in plan.steps:
                    failed += _step(step, plan, pre, names=names, device=device, run=run, work=work,
                                    plugins=plugins, peak=peak, peak_what=peak_what, gates=gates,
                                    smoke_times=smoke_times, t0=t0, rec=rec, keep=keep, say=say)
            except KeyboardInterrupt:
                interrupted = f"interrupted after {time.perf_counter() - t0:.0f} s, {len(records)} records kept"
                notes.append(interrupted)
                say(f"  {interrupted}")
        store.finish_run(run.run_id, "interrupted" if interrupted else "failed" if failed else "ok",
                         note=interrupted)
    summary = work / "doctor.md"
    verdict = leaderboard.verdict(records) + (f" ({interrupted})" if interrupted else "")
    summary.write_text(leaderboard.summary_markdown(records, header=node.lines(env) + [
        f"cannot: {x}" for x in node.limitations(env, device)] + notes + [f"peak: {peak_what}"],
        verdict=verdict))
    say(f"summary: {summary}")
    say(verdict)
    return 130 if interrupted else 1 if failed else 0


def _step(step: Step, plan: Plan, pre: DoctorPreset, *, names, device, run, work, plugins, peak, peak_what, gates,
          smoke_times, t0, rec, keep, say) -> int:
    """One step of the plan, recorded; returns how many failures it found."""
    if step.skip or step.dropped:
        rec(step, "skipped", error=step.skip or step.dropped,
            params={"n": step.n, "mode": step.mode} if step.kind == "time" else {}, dtype=step.dtype or None)
        return 0
    est = (sum(smoke_times) / len(smoke_times)) if step.kind == "smoke" and smoke_times else step.est_s
    elapsed = time.perf_counter() - t0
    if step.kind in ("time", "smoke") and elapsed + est > plan.budget_s:
        step.dropped = f"budget: {plan.budget_s / 60:g} min reached after {elapsed:.0f} s"
        say(f"  dropped  {step.label}: {step.dropped}")
        rec(step, "skipped", error=step.dropped, dtype=step.dtype or None,
            params={"n": step.n, "mode": step.mode} if step.kind == "time" else {})
        return 0
    if step.kind == "contract":
        rows = verify_all(list(names), dtype=step.dtype, lengths=tuple(pre.check_lengths), device=device.type)
        bad = [r for r in rows if not r.ok]
        for r in rows:
            status = {"ok": "ok", "skipped": "skipped", "mismatch": "incorrect"}.get(r.status, "failed")
            keep(run.record(task="contract", attention=r.name, impl=r.impl, dtype=r.dtype, status=status,
                            error=r.detail or None, device=device.type, params={"n": r.seq_len, "causal": r.causal},
                            metrics={"fwd_err": r.fwd_err, "bwd_err": r.bwd_err, "bound": r.bound,
                                     "worst": r.worst}))
        say(f"  contract {step.dtype}: {sum(r.status == 'ok' for r in rows)} agree, "
            f"{sum(r.status == 'skipped' for r in rows)} skipped, {len(bad)} failed"
            + "".join(f"\n    FAIL {r.name} [{'causal' if r.causal else 'bidir'}] {r.impl} N={r.seq_len} "
                      f"{r.dtype}: {r.detail}" for r in bad))
        return len(bad)
    if step.kind == "gate":
        try:
            ok, metrics, why = gate(step.form, pre, device)
        except Exception as e:  # a crash is a failed gate, reported, not a traceback
            ok, metrics, why = False, {}, f"{type(e).__name__}: {e}"
        gates[step.form.name] = ok
        rec(step, "ok" if ok else "incorrect", dtype=pre.dtype, metrics=metrics, error=why or None,
            params={"n": pre.gate_len})
        say(f"  gate     {step.form.name}: " + ("ok" if ok else f"FAILED ({why})"))
        return int(not ok)
    if step.kind == "smoke":
        # a smoke may use what is left of the budget, and a minute more, then it is stopped and said so
        left = max(plan.budget_s - (time.perf_counter() - t0), 0.0) + 60.0
        code, secs, tail = run_smoke(step.smoke, db=work / "smokes.db", plugins=plugins,
                                     timeout_s=min(SMOKE_TIMEOUT_S, left))
        smoke_times.append(secs)
        status = "ok" if code == 0 else "timeout" if code == 124 else "failed"
        rec(step, status, metrics={"wall_s": secs, "exit_code": code}, error=None if code == 0 else tail)
        say(f"  smoke    {step.smoke}: " + (f"ok in {secs:.0f} s" if code == 0 else
                                           f"stopped at the budget after {secs:.0f} s" if code == 124 else
                                           f"FAILED (exit {code} after {secs:.0f} s)\n{tail}"))
        return int(status == "failed")
    params = {"n": step.n, "mode": step.mode, "batch": step.form.shape.batch, "heads": step.form.shape.heads,
              "head_dim": step.form.shape.head_dim, "causal": step.form.causal, "family": step.form.family,
              "op": step.form.op}
    if not gates.get(step.form.name, False):  # every gate ran before the first timing
        rec(step, "incorrect", dtype=pre.dtype, params=params, error="not timed: its gate failed (see the gate record)")
        say(f"  refused  {step.label}: its gate failed")
        return 0
    try:
        metrics = time_form(step.form, step.n, step.mode, pre, device, peak)
        rec(step, "ok", dtype=pre.dtype, params=params, metrics={**metrics, "peak_what": peak_what})
        say(f"  time     {step.label}: {metrics['time_median_s'] * 1e3:.3f} ms ({metrics['tflops']:.3g} TFLOP/s)")
    except torch.cuda.OutOfMemoryError as e:
        rec(step, "oom", dtype=pre.dtype, params=params, error=str(e).splitlines()[0])
        say(f"  oom      {step.label}")
    except Exception as e:
        rec(step, "failed", dtype=pre.dtype, params=params, error=f"{type(e).__name__}: {e}")
        say(f"  FAILED   {step.label}: {type(e).__name__}: {e}")
        return 1
    return 0
