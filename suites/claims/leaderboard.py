"""The claims table: ``attnbench table claims``. One row per (check, mechanism, input): the statistic with its
interval, the criterion (the rule fixed before measuring; its full text is in each record's ``metrics.criterion``)
and the verdict; skipped cells say why. Torch-free."""

from __future__ import annotations

import math
from typing import Iterable

from attnbench.results.records import Measurement
from attnbench.views.rows import board_title, boards, fmt_bytes, fmt_n, label_of
from attnbench.views.sources import commits_of
from attnbench.views.tables import table_view

ORDER = ("nala-entropy", "nala-nonneg", "mirrorla-isometry", "mirrorla-truncation", "laplacian-distance",
         "laplacian-ns", "laplacian-ns-vs-cg", "laplacian-nystrom", "stella-variance", "memory", "adala-depth")


def st_short(st: dict) -> str:
    """A recorded statistic as text: the value, and its interval unless exact; a statistic without a value (NaN: its
    inputs do not define one, e.g. neither solver converged) says why instead."""
    v, lo, hi = st.get("value"), st.get("lo"), st.get("hi")
    if v is None:
        return "-"
    if math.isnan(v):
        return f"no value ({st.get('interval') or 'undefined'})"
    if st.get("interval") == "exact" or lo is None:
        return f"{v:.4g}"
    return f"{v:.4g} [{lo:.3g}, {hi:.3g}]"


def rule(c: dict) -> str:
    """``statistic < x`` (and the fail side when it differs): the criterion in one line."""
    other = "≥" if c["side"] == "<" else "≤"
    text = f"{c['statistic']} {c['side']} {c['holds_at']:g}"
    return text if c["holds_at"] == c["fails_at"] else f"{text} (fails {other} {c['fails_at']:g})"


def _decided_line(counts: dict[str, int]) -> str:
    """The claims' separation line: a claims table ranks no mechanisms (no pairs to test); what it can tell apart is
    how many claims its intervals decide."""
    decided = counts.get("holds", 0) + counts.get("fails", 0)
    total = sum(counts.values())
    return (f"Separation: {decided} of {total} claims decided at their criterion (holds or fails; a claims table "
            f"ranks no mechanisms, so no pairs are tested)"
            + (": this table decides nothing." if decided == 0 else "."))


def measured_tables(records: Iterable[Measurement], source_label: str):
    out = []
    for (setting, device), recs in boards(records, preferred=("ok", "skipped")):
        rank = {n: i for i, n in enumerate(ORDER)}
        # checks in table order; within one, mechanisms and inputs in the order the run planned them
        recs.sort(key=lambda r: (rank.get(r.task, len(ORDER)), r.task, r.metrics.get("order", 0), label_of(r),
                                 r.params.get("input", "")))
        rows, counts = [], {}
        for r in recs:
            m = r.metrics
            inp = r.params.get("input", "?")
            if r.status == "ok" and "verdict" in m:
                verdict = m["verdict"]
                rows.append([r.task, label_of(r), inp, st_short(m["statistic"]), rule(m["criterion"]), verdict])
            else:
                verdict = r.status
                why = (m.get("reason") or r.error or "").splitlines()[0] if (m.get("reason") or r.error) else ""
                rows.append([r.task, label_of(r), inp, "-", why, verdict])  # prose: wraps, never cut
            counts[verdict] = counts.get(verdict, 0) + 1
        commits = commits_of(recs)
        cap = (f"{source_label}. Each row: one paper's mechanism-level argument measured on attnbench's "
               f"implementation; the statistic with its 99% interval where it has one ([lo, hi]); the criterion "
               f"fixed in code before measuring (holds when the interval lies on the claimed side, fails when it "
               f"lies on the other, inconclusive otherwise); figures: <check>--<mechanism>--<input>.png in "
               f"{'results/claims' if 'committed' in source_label else 'results/runs/claims (or --out)'}. Verdicts: "
               + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + f". Commit {', '.join(commits)}. "
               + _decided_line(counts))
        out.append((board_title("claims", setting, device, recs),
                    ["check", "attention", "input", "statistic", "criterion", "verdict"], rows, cap))
        mem = [r for r in recs if r.task == "memory" and r.status == "ok" and "peak_bytes" in r.metrics]
        if mem:
            out.append(memory_table(mem, setting, device))
    return out


def memory_table(recs: list[Measurement], setting: str, device: str):
    """The memory check's numbers: peak forward memory per N with the ratio to softmax (reference) where softmax
    ran, beside what the paper prints."""

    sizes = sorted({n for r in recs for n in r.metrics["sizes"]})
    rows = []
    soft = {}
    for r in recs:
        m = r.metrics
        cells = []
        for n in sizes:
            if n not in m["sizes"]:
                cells.append("-")
                continue
            i = m["sizes"].index(n)
            ratio = m["ratio_to_softmax"][i]
            if m["softmax_peak_bytes"][i] is not None:
                soft[n] = m["softmax_peak_bytes"][i]
            cells.append(fmt_bytes(m["peak_bytes"][i]) + (f" (x{ratio:.3g})" if ratio is not None else ""))
        rows.append([label_of(r), *cells, m.get("paper", "")])
    rows.append(["softmax (reference)", *[fmt_bytes(soft[n]) if n in soft else "size limit" for n in sizes], ""])
    cap = ("Peak bytes of tensors alive at once in one forward pass (B = 1, H = 1, d = 64, float32, no autograd; "
           "attnbench.measure.memory.TensorMemory: allocator-independent, the same on any CPU), and the ratio to softmax's "
           "reference form (its N x N matrices) at the same N; 'size limit': softmax not run (its two N x N float32 "
           "matrices exceed the cap). The papers' numbers are whole models on GPUs against their own baselines: "
           "context, not comparable. Separation: exact counts, no noise to test against (every unequal pair differs).")
    return (f"claims memory — {setting} · {device}", ["attention", *[f"N = {fmt_n(n)}" for n in sizes],
                                                      "the paper prints"], rows, cap)


def view():
    return table_view(measured_tables)
