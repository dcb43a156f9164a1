"""The LRA leaderboard: ``attnbench table lra`` and ``attnbench export --format markdown --suite lra``.

A view over the results store (:mod:`attnbench.views.tables`): one accuracy table per (setting, device) — rows
attention, columns the tasks and their average, cells the test accuracy at the best validation step (mean ± std
over seeds, n) — plus an efficiency table (training samples/s, peak memory, wall time per cell). Published numbers
(``reported/*.toml``) are separate tables labelled "reported (...)", never rows of a measured table, and a setting's
scores never share a column with another setting's.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Iterable

from attnbench.results.records import Measurement
from attnbench.results.reported import leaderboard_tables
from attnbench.results.stats import above_rate_p, wilson_interval
from attnbench.views.rows import aggregate, board_title, boards, fmt_seeds, seed_note, seed_rows, timing_mark
from attnbench.views.sources import commits_of, committed_records, latest, machine_of
from attnbench.views.tables import table_view
from attnbench.views.compare import SCORE_TEST, metric, score_p, separation

TASK_ORDER = ("listops", "text", "retrieval", "image", "pathfinder")
BASELINE = "softmax"


def _label(r: Measurement) -> str:
    """The spec as run, then in parentheses the options it did not spell (the preset's ``attn_options``)."""
    spelled = {part.split("=", 1)[0] for part in r.attention.split(":")[1:]}
    extra = [f"{k}={v}" for k, v in sorted(r.options.items()) if k not in spelled]
    return r.attention + (f"({','.join(extra)})" if extra else "")


def _majority(by: dict, lab: str, t: str) -> float | None:
    vals = [r.metrics.get("majority_test_acc") for r in by.get((lab, t), []) if r.status == "ok"]
    vals = [v for v in vals if isinstance(v, (int, float))]
    return vals[-1] if vals else None


def _fmt_cell(st, p_best: float | None, majority: float | None, is_best: bool) -> str:
    """One accuracy cell over its seeds (:func:`attnbench.views.rows.fmt_seeds`) with the marks of the caption of
    :func:`measured_tables`. ``p_best``: the p-value of its difference from the best row
    (:func:`attnbench.views.compare.score_p`); the majority mark tests the mean over seeds as a proportion of the
    test set."""

    n, mean = st.n_test or 0, st.mean
    marks = ""
    if is_best:
        marks += "^"
    elif p_best is not None and p_best >= 0.05:
        marks += "≈"
    if n and majority is not None and above_rate_p(mean / 100, n, majority) >= 0.05:
        marks += "†"
    return fmt_seeds(st) + (f" {marks}" if marks else "")


def _budget(by: dict, tasks: list[str]) -> str:
    """What each task's cells trained on: steps, global batch, training samples seen, test-set size."""
    parts = []
    for t in tasks:
        ok = [r for (lab, task), rs in by.items() if task == t for r in rs if r.status == "ok"]
        if not ok:
            continue
        m, p = ok[-1].metrics, ok[-1].params
        steps, batch = p.get("steps"), p.get("batch_size")
        part = f"{t}: {steps} steps × batch {batch}"
        if isinstance(steps, int) and isinstance(batch, int) and isinstance(m.get("n_train"), int):
            part += f" = {steps * batch:,} samples of {m['n_train']:,} training examples"
        parts.append(part + f", test n = {m.get('n_test', '?')}")
    return ("Budget — " + "; ".join(parts) + ".") if parts else ""


_SAME = ("batch_size", "data", "preset", "seq_len", "steps")  # what makes two cells' budgets the same


def _committed_baseline(setting: str, device: str, tasks: list[str], by: dict) -> list[str] | None:
    """A row of the committed softmax results for the user's table that has no softmax row (e.g. the README's
    main job trains only the new mechanisms): its accuracy per task where the committed cell had the same budget
    and data as the user's cells, labelled as committed with its machine; no marks (another run, another
    machine). None when no committed cell matches."""

    mine = {t: next((r for (lab, task), rs in by.items() if task == t for r in rs if r.status == "ok"), None)
            for t in tasks}
    cells, used = [], []
    for t in tasks:
        ref = mine[t]
        match = [r for r in latest(committed_records("lra", setting), preferred=("ok",))
                 if r.attention == BASELINE and not r.options and r.task == t and r.device == device
                 and r.status == "ok" and ref is not None and "score" in r.metrics
                 and all(r.params.get(k) == ref.params.get(k) for k in _SAME)]
        if not match:
            cells.append("-")
            continue
        r = match[-1]
        used.append(r)
        n = int(r.metrics.get("n_test") or 0)
        lo, hi = wilson_interval(r.metrics["score"] / 100, n) if n else (0.0, 0.0)
        cells.append(f"{r.metrics['score']:.2f}" + (f" ± {100 * (hi - lo) / 2:.1f}" if n else ""))
    if not used:
        return None
    avg = (f"{statistics.fmean(r.metrics['score'] for r in used):.2f}" if len(used) == len(tasks) else "-")
    return [f"softmax (committed; {machine_of(used)})", ",".join(sorted({r.impl or "-" for r in used})), *cells, avg]


def measured_tables(records: Iterable[Measurement], source_label: str) -> list[tuple[str, list[str], list[list[str]], str]]:
    """(title, header, rows, caption) tables of measured LRA records, grouped by (setting, device)."""
    out = []
    for (setting, device), recs in boards(records):
        tasks = [t for t in TASK_ORDER if any(r.task == t for r in recs)]
        labels = sorted({_label(r) for r in recs})
        # a row is (spec, task) over its seeds, of the latest configuration only (attnbench.views.rows.seed_rows)
        by: dict[tuple[str, str], list[Measurement]] = {(lab, t): rs for (_s, _d, _dt, t, lab), rs
                                                        in seed_rows(recs, key=_label).items()}
        stats = {key: aggregate(rs) for key, rs in by.items()}

        best = {t: max(((stats[(lab, t)].mean, lab) for lab in labels if stats.get((lab, t)) is not None),
                       default=(None, None)) for t in tasks}

        rows, avgs = [], {}
        for lab in labels:
            row = [lab, ",".join(sorted({r.impl or "-" for t in tasks for r in by.get((lab, t), [])}))]
            means = []
            for t in tasks:
                st = stats.get((lab, t))
                if st is not None:
                    p_best = score_p(by[(lab, t)], by[(best[t][1], t)]) if best[t][1] else None
                    row.append(_fmt_cell(st, p_best, _majority(by, lab, t), lab == best[t][1]))
                    means.append(st.mean)
                else:
                    st = sorted({r.status for r in by.get((lab, t), [])})
                    row.append("/".join(st) or "·")
            avg = statistics.fmean(means) if len(means) == len(tasks) and tasks else None
            avgs[lab] = avg
            row.append(f"{avg:.2f}" if avg is not None else "-")
            rows.append(row)
        order = sorted(range(len(labels)), key=lambda i: (labels[i].split("(")[0] != BASELINE,
                                                          -(avgs[labels[i]] or -math.inf), labels[i]))
        rows = [rows[i] for i in order]
        if not any(lab.split("(")[0] == BASELINE for lab in labels) and not source_label.startswith("committed"):
            base = _committed_baseline(setting, device, tasks, by)
            if base:
                rows.insert(0, base)
        current = sorted((m for rs in by.values() for m in rs), key=lambda m: (m.ended_at or "", m.id or 0),
                         reverse=True)  # baselines from the data of the configurations shown
        maj = []
        for t in tasks:
            vals = [r.metrics.get("majority_test_acc") for r in current if r.task == t and r.status == "ok"]
            vals = [v for v in vals if isinstance(v, (int, float))]
            maj.append(f"{100 * vals[0]:.2f}" if vals else "-")
        rows.append(["majority class (baseline)", "-", *maj, "-"])
        if "listops" in tasks:
            vals = [r.metrics.get("first_op_test_acc") for r in current if r.task == "listops" and r.status == "ok"]
            vals = [v for v in vals if isinstance(v, (int, float))]
            if vals:
                rows.append(["first-operator heuristic (baseline)", "-",
                             *[f"{100 * vals[0]:.2f}" if t == "listops" else "-" for t in tasks], "-"])
        seeds = sorted({r.seed for r in recs if r.seed is not None})
        commits = commits_of(recs)
        dates = sorted({(r.ended_at or "")[:10] for r in recs} - {""})
        title = board_title("LRA accuracy", setting, device, recs)
        cap = (f"{source_label}. Test accuracy (%) at the best validation step ± the half-width of its 95% Wilson "
               f"interval over the test set (n in the budget line); seeds {seeds}.{seed_note(stats.values())} ^ best "
               f"of its column (the highest mean over seeds); ≈ not significantly different from the best ({SCORE_TEST}, "
               f"p ≥ 0.05); † not significantly above the majority class (p ≥ 0.05): at chance. avg = mean over "
               f"the {len(tasks)} task(s) shown. {_budget(by, tasks)} A 'softmax (committed ...)' row is the committed "
               f"baseline of the same budget and data (results/lra/), from the machine it names: not in the marks. "
               f"The majority-class row "
               f"predicts the most frequent training class; the first-operator row (ListOps) predicts the most "
               f"frequent training answer of the outermost operator. Commit {', '.join(commits)}; "
               f"{dates[0] if len(dates) == 1 else '..'.join(dates[::max(1, len(dates) - 1)])}. Separation, "
               f"per task: " + " ".join(separation({lab: by.get((lab, t), []) for lab in labels}, metric("score"))
                                        .line(t) for t in tasks))
        out.append((title, ["attention", "impl", *tasks, f"avg ({len(tasks)})"], rows, cap))

        eff_rows = []
        for i in order:
            lab = labels[i]
            row = [lab]
            total = 0.0
            for t in tasks:
                ok = [r for r in by.get((lab, t), []) if r.status == "ok"]
                if not ok:
                    row.append("-")
                    continue
                m = ok[-1].metrics
                mem = m.get("peak_mem_bytes")
                mem_s = f"{mem / 2**20:.0f} MiB" if isinstance(mem, (int, float)) else "< res."
                row.append(f"{m.get('train_samples_per_s', float('nan')):.1f}/s · {mem_s} · "
                           f"{m.get('wall_s', float('nan')):.0f} s{timing_mark(ok[-1])}")
                total += sum(r.metrics.get("wall_s", 0.0) for r in ok)
            row.append(f"{total:.0f} s")
            eff_rows.append(row)
        methods = sorted({r.metrics.get("mem_method") for r in recs if r.metrics.get("mem_method")})
        out.append((f"LRA efficiency — {setting} · {device}", ["attention", *tasks, "wall (all cells)"], eff_rows,
                    f"Training samples/s (global batch, training steps only) · peak memory "
                    f"({'; '.join(methods) or 'method not recorded'}; < res. = below its resolution) · "
                    f"wall time of the cell (training, evaluation, checkpoints). Timings come from whatever machine "
                    f"ran the cells, often shared (see the load notes of committed results): rough ratios only. "
                    + "; ".join(separation({lab: by.get((lab, t), []) for lab in labels},
                                           metric("train_samples_per_s")).line(f"Separation ({t}, samples/s)")
                                for t in tasks)))
    return out


def reported_tables() -> list[tuple[str, list[str], list[list[str]], str]]:
    """The published tables shown beside the measured ones (``reported/*.toml``)."""
    return leaderboard_tables(Path(__file__).with_name("reported"))


# --- rendering (the attnbench.views.tables view) ---------------------------------------------------------------------
def view():
    """The LRA view of :mod:`attnbench.views.tables` (``attnbench table lra``): measured tables, then the reported."""
    return table_view(measured_tables, extra=reported_tables)
