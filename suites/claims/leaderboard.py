"""The claims table: ``attnbench table claims``. One row per (check, mechanism, input): the statistic with its
interval, the criterion (the rule fixed before measuring; its full text is in each record's ``metrics.criterion``)
and the verdict; skipped cells say why. Torch-free."""

from __future__ import annotations

from typing import Iterable

from attnbench.report import label_of, latest
from attnbench.store import Measurement

ORDER = ("nala-entropy", "nala-nonneg", "mirrorla-isometry", "mirrorla-truncation", "laplacian-distance",
         "laplacian-ns", "laplacian-ns-vs-cg", "laplacian-nystrom", "stella-variance", "memory", "adala-depth")


def st_short(st: dict) -> str:
    """A recorded statistic as text: the value, and its interval unless exact."""
    v, lo, hi = st.get("value"), st.get("lo"), st.get("hi")
    if v is None:
        return "-"
    if st.get("interval") == "exact" or lo is None:
        return f"{v:.4g}"
    return f"{v:.4g} [{lo:.3g}, {hi:.3g}]"


def rule(c: dict) -> str:
    """``statistic < x`` (and the fail side when it differs): the criterion in one line."""
    other = "≥" if c["side"] == "<" else "≤"
    text = f"{c['statistic']} {c['side']} {c['holds_at']:g}"
    return text if c["holds_at"] == c["fails_at"] else f"{text} (fails {other} {c['fails_at']:g})"


def measured_tables(records: Iterable[Measurement], source_label: str):
    groups: dict[tuple, list[Measurement]] = {}
    for r in latest(records, preferred=("ok", "skipped")):
        groups.setdefault((r.setting, r.device), []).append(r)
    out = []
    for (setting, device), recs in sorted(groups.items()):
        rank = {n: i for i, n in enumerate(ORDER)}
        recs.sort(key=lambda r: (rank.get(r.task, len(ORDER)), r.task, label_of(r), r.params.get("input", "")))
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
                rows.append([r.task, label_of(r), inp, "-", why[:140], verdict])
            counts[verdict] = counts.get(verdict, 0) + 1
        names = sorted({r.device_name for r in recs if r.device_name})
        commits = sorted({(r.git_commit or "?")[:10] + ("-dirty" if r.git_dirty else "") for r in recs})
        cap = (f"{source_label}. Each row: one paper's mechanism-level argument measured on attnbench's "
               f"implementation; the statistic with its 99% interval where it has one ([lo, hi]); the criterion "
               f"fixed in code before measuring (holds when the interval lies on the claimed side, fails when it "
               f"lies on the other, inconclusive otherwise); figures in results/claims/<check>--<mechanism>--"
               f"<input>.png. Verdicts: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
               + f". Commit {', '.join(commits)}.")
        out.append((f"claims — {setting} · {device}" + (f" ({'; '.join(names)})" if names else ""),
                    ["check", "attention", "input", "statistic", "criterion", "verdict"], rows, cap))
    return out


def view():
    from attnbench.report import table_view

    return table_view(measured_tables)
