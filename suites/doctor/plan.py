"""The doctor's plan: every step in the order it runs, what each is estimated to cost, and what the budget drops.

Order: the contract of every mechanism in each precision; the gate of every timed form (its check against the
exact float64 form at the preset's shape); the timings, shortest length first; the presets' smokes. The checks and
gates are never dropped (no timing without its gate). If the checks, gates and timings are estimated past the
budget, the longest length's timings are dropped first, then the next; the smokes get what is left, in their
order; each drop is said in one line. While running, a timing or smoke whose estimate would pass the budget is
dropped the same way.

Estimates are stated guesses, not measurements: a check costs ``CHECK_S``; a form's first call its
``first_call_s`` (JIT, autotuning, compilation); a timing its warm-up and repetition windows plus three calls at
``EFFICIENCY`` of the peak (:func:`attnbench.suites.doctor.node.peak_flops`) for its nominal FLOPs; a smoke the
preset's ``smoke_estimate_s``, then the mean of the smokes already run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from attnbench.suites.doctor.config import DoctorPreset
from attnbench.suites.doctor.forms import Form

CHECK_S = {"cuda": 0.15, "cpu": 0.25}   # seconds per contract verdict (three lengths, fwd + bwd)
EFFICIENCY = 0.3                        # share of peak the estimate assumes


@dataclasses.dataclass
class Step:
    """One step. ``kind``: contract, gate, smoke or time; ``skip``: why it cannot run here (listed, not run);
    ``dropped``: why the budget dropped it."""

    kind: str
    label: str
    est_s: float
    form: Optional[Form] = None
    dtype: str = ""
    n: int = 0
    mode: str = ""
    smoke: str = ""
    skip: Optional[str] = None
    dropped: Optional[str] = None

    @property
    def runs(self) -> bool:
        return self.skip is None and self.dropped is None


@dataclasses.dataclass
class Plan:
    steps: list[Step]
    budget_s: float
    notes: list[str]       # the budget's drops, one line each

    @property
    def est_s(self) -> float:
        return sum(s.est_s for s in self.steps if s.runs)


def time_estimate(form: Form, n: int, mode: str, pre: DoctorPreset, peak: Optional[float],
                  flops: Optional[float] = None) -> float:
    """Seconds one timing is guessed to take (see the module docstring; the form's first call is charged to its
    gate, which runs it first)."""
    f = (flops if flops is not None else form.flops(n)) * (3 if mode == "fwd+bwd" else 1)
    call = f / (peak * EFFICIENCY) if peak else 0.0
    return (pre.timing.warmup_ms + pre.timing.rep_ms) / 1e3 + 3 * call


def make_plan(pre: DoctorPreset, forms: list[Form], *, device: str, contract_rows: int, smokes: list[str],
              skips: dict[str, str], peak: Optional[float], budget_s: float,
              mechanism_flops: Optional[dict[str, tuple[float, float]]] = None) -> Plan:
    """The steps (module docstring). ``skips``: form name -> why it cannot run here; ``mechanism_flops``: a
    mechanism form's ``(FLOPs at the gate length, exponent)`` to extrapolate its nominal FLOPs to each length."""
    steps = [Step("contract", f"contract {dt} ({contract_rows} checks)", contract_rows * CHECK_S[device], dtype=dt)
             for dt in pre.check_dtypes]
    for f in forms:
        steps.append(Step("gate", f"gate {f.name} at N={pre.gate_len}", 1.0 + f.first_call_s, form=f,
                          skip=skips.get(f.name)))
    timed = []
    for n in pre.seq_lens:
        for mode in pre.modes:
            for f in forms:
                flops = None
                if mechanism_flops and f.name in mechanism_flops:
                    f0, p = mechanism_flops[f.name]
                    flops = f0 * (n / pre.gate_len) ** p
                est = time_estimate(f, n, mode, pre, peak, flops=flops)
                timed.append(Step("time", f"time {f.name} N={n} {mode}", est, form=f, dtype=pre.dtype, n=n,
                                  mode=mode, skip=skips.get(f.name)))
    steps += timed
    plan = Plan(steps, budget_s, [])
    lengths = sorted({s.n for s in timed}, reverse=True)
    for n in lengths:  # the longest length first
        if plan.est_s <= budget_s:
            break
        drop = [s for s in timed if s.n == n and s.runs]
        saved = sum(s.est_s for s in drop)
        for s in drop:
            s.dropped = f"budget: N={n} dropped to fit {budget_s / 60:g} min"
        plan.notes.append(f"dropped N={n}: {len(drop)} timing(s), estimated {saved:.0f} s, to fit the "
                          f"{budget_s / 60:g} min budget")
    if plan.est_s > budget_s:
        plan.notes.append(f"the checks and gates alone are estimated at {plan.est_s:.0f} s, beyond the "
                          f"{budget_s / 60:g} min budget: they run all the same (no timing without its gate)")
    for name in smokes:  # what is left, in order
        step = Step("smoke", f"smoke {name}", pre.smoke_estimate_s, smoke=name)
        if plan.est_s + step.est_s > budget_s:
            step.dropped = f"budget: smoke dropped to fit {budget_s / 60:g} min"
            plan.notes.append(f"dropped smoke {name} (estimated {step.est_s:.0f} s) to fit the {budget_s / 60:g} "
                              f"min budget")
        plan.steps.append(step)
    return plan


def exponent(f_small: float, f_large: float) -> float:
    """The power of N between two FLOP counts at N and 2N, held to [1, 2] (linear to quadratic: at the gate's
    small N a mechanism's fixed costs, landmarks or features, distort the ratio)."""
    return min(2.0, max(1.0, math.log2(f_large / f_small))) if f_small > 0 and f_large > 0 else 1.0
