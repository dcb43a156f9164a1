"""The doctor's tables, read from its records (``attnbench table doctor``, ``report``, and the run's ``doctor.md``):
the contract per precision with every failure, the gates, the timings per form and length with the nominal
TFLOP/s and its share of peak, attnbench's kernels against FLA's and SDPA as time ratios from the same run, the
first calls and peak memory, the smokes, and what was skipped or dropped and why."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable

from attnbench.results.records import Measurement
from attnbench.views.render import markdown_tables
from attnbench.views.tables import TableData, table_view

# (ours, theirs): the ratio theirs / ours (above 1: ours is faster)
PAIRS = (("attnbench.chunk_linear_attn", "fla.chunk_linear_attn"), ("attnbench.chunk_linear_attn", "sdpa"),
         ("attnbench.delta_rule", "fla.chunk_delta_rule"),
         ("attnbench.gated_delta_rule", "fla.chunk_gated_delta_rule"))


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3g}"


def _latest(records: Iterable[Measurement]) -> list[Measurement]:
    """The last run's records of each (task, attention, impl, dtype, params) point."""
    out: dict = {}
    for r in records:
        if r.suite == "doctor":
            out[(r.task, r.attention, r.impl, r.dtype, tuple(sorted((r.params or {}).items())))] = r
    return list(out.values())


def doctor_tables(records: list[Measurement], label: str = "") -> list[TableData]:
    recs = _latest(records)
    tables: list[TableData] = []
    contract = [r for r in recs if r.task == "contract"]
    if contract:
        by = defaultdict(Counter)
        for r in contract:
            by[r.dtype][r.status] += 1
        rows = [[dt, str(c["ok"]), str(c["skipped"]), str(c["incorrect"] + c["failed"])]
                for dt, c in sorted(by.items())]
        bad = [r for r in contract if r.status in ("incorrect", "failed")]
        tables.append(("doctor: contract (every impl vs the float64 reference, fwd + bwd)",
                       ["dtype", "agree", "skipped", "failed"], rows,
                       f"{len(bad)} failure(s)" + "".join(f"; {r.attention} {r.impl} N={r.params.get('n')} "
                                                           f"{r.dtype}: {r.error}" for r in bad[:20])))
    gates = [r for r in recs if r.task == "gate"]
    if gates:
        rows = [[r.attention, r.dtype or "-", r.status if r.status != "skipped" else f"skipped ({r.error})",
                 "-" if r.metrics.get("check_err") is None else f"{r.metrics['check_err']:.1e}",
                 "-" if r.metrics.get("check_tol") is None else f"{r.metrics['check_tol']:.1e}",
                 (r.error or "") if r.status != "skipped" else ""] for r in sorted(gates, key=lambda r: r.attention)]
        tables.append(("doctor: gates (each timed form vs its exact form at the preset's shape)",
                       ["form", "dtype", "status", "error", "bound", "detail"], rows,
                       "A form whose gate failed is not timed."))
    timed = [r for r in recs if r.task == "time" and r.status == "ok"]
    if timed:
        lengths = sorted({r.params["n"] for r in timed})
        for mode in ("fwd", "fwd+bwd"):
            rs = [r for r in timed if r.params.get("mode") == mode]
            if not rs:
                continue
            cell = {(r.attention, r.params["n"]): r for r in rs}
            forms = sorted({r.attention for r in rs}, key=lambda a: (cell_family(rs, a), a))
            rows = []
            for a in forms:
                row = [a]
                for n in lengths:
                    r = cell.get((a, n))
                    if r is None:
                        row.append("-")
                        continue
                    share = r.metrics.get("peak_share")
                    row.append(f"{_ms(r.metrics['time_median_s'])} ({r.metrics['tflops']:.3g}"
                               + (f", {100 * share:.0f}%" if share is not None else "") + ")")
                rows.append(row)
            what = rs[0].metrics.get("peak_what", "")
            tables.append((f"doctor: {mode} median ms (nominal TFLOP/s, share of peak), {rs[0].dtype}",
                           ["form"] + [f"N={n}" for n in lengths], rows,
                           f"Median over repeats after warm-up; quantiles and the first call are in the records. "
                           f"Peak: {what}. Nominal FLOPs: see suites/doctor/forms.py."))
            ratio_rows = []
            for ours, theirs in PAIRS:
                vals = []
                for n in lengths:
                    a, b = cell.get((ours, n)), cell.get((theirs, n))
                    ratio = (b.metrics["time_median_s"] / a.metrics["time_median_s"]) if a and b else None
                    vals.append("-" if ratio is None else f"{ratio:.2f}")
                if any(v != "-" for v in vals):
                    ratio_rows.append([f"{theirs} / {ours}"] + vals)
            if ratio_rows:
                tables.append((f"doctor: {mode} time ratios from the same run (above 1: attnbench is faster)",
                               ["pair"] + [f"N={n}" for n in lengths], ratio_rows, ""))
        first = {}
        for r in timed:
            a = r.attention
            first.setdefault(a, []).append(r)
        rows = []
        for a, rs in sorted(first.items()):
            lo = min(rs, key=lambda r: r.params["n"])
            hi = max(rs, key=lambda r: r.params["n"])
            peak = hi.metrics.get("peak_bytes")
            rows.append([a, f"{lo.metrics.get('first_call_s', 0):.2f}", str(hi.params["n"]),
                         "-" if peak is None else f"{peak / 2 ** 20:.1f}"])
        tables.append(("doctor: first call (JIT, autotune, compile) and peak memory",
                       ["form", "first call s (shortest N)", "longest N", "peak MiB there"], rows,
                       "Peak memory: CUDA max_memory_allocated above the start on a GPU, else peak RSS."))
    smokes = [r for r in recs if r.task == "smoke"]
    if smokes:
        rows = [[r.attention, r.status + (f" ({r.error})" if r.status == "skipped" else ""),
                 "-" if r.metrics.get("wall_s") is None else f"{r.metrics['wall_s']:.0f}"]
                for r in sorted(smokes, key=lambda r: r.attention)]
        tables.append(("doctor: smokes (each preset's pipeline on this device, in its precision)",
                       ["suite/preset", "status", "seconds"], rows,
                       "; ".join(f"{r.attention}: {r.error}" for r in smokes if r.status == "failed")))
    not_run = Counter((r.task, r.error) for r in recs if r.status == "skipped" and r.task != "contract")
    if not_run:
        tables.append(("doctor: not run", ["step", "why", "count"],
                       [[t, why or "-", str(c)] for (t, why), c in sorted(not_run.items())], ""))
    return tables


def cell_family(rs: list[Measurement], attention: str) -> int:
    fam = next(r.params.get("family") for r in rs if r.attention == attention)
    return {"kernel": 0, "mechanism": 1, "compiled": 2}.get(fam, 3)


def verdict(records: list[Measurement]) -> str:
    """The run's last line: OK or FAILED, with the counts behind it."""
    c = Counter((r.task, r.status) for r in records)
    failed = sum(n for (t, s), n in c.items() if s in ("incorrect", "failed"))
    skipped = Counter(r.error for r in records if r.status == "skipped" and r.task != "contract")
    parts = [f"{c['contract', 'ok']} checks agree", f"{c['gate', 'ok']} gates pass",
             f"{c['time', 'ok']} timings", f"{c['smoke', 'ok']} smokes ok"]
    if c["contract", "skipped"]:
        parts.append(f"{c['contract', 'skipped']} checks skipped")
    if skipped:
        parts.append("not run: " + ", ".join(f"{n} ({why})" for why, n in skipped.most_common()))
    if c["smoke", "timeout"]:
        parts.append(f"{c['smoke', 'timeout']} smokes stopped at the budget")
    if c["time", "oom"]:
        parts.append(f"{c['time', 'oom']} out of memory")
    head = f"doctor: FAILED, {failed} failure(s)" if failed else "doctor: OK"
    return f"{head}: " + "; ".join(parts)


def summary_markdown(records: list[Measurement], *, header: list[str], verdict: str) -> str:
    lines = ["# attnbench doctor", ""] + [f"- {h}" for h in header] + ["", f"**{verdict}**", ""]
    return "\n".join(lines) + "\n" + markdown_tables(doctor_tables(records))


def view():
    return table_view(doctor_tables)
