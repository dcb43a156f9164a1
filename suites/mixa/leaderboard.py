"""The MixA leaderboard: ``attnbench table mixa``. One table per (setting, device, k) and study (its seeds'
teachers): the softmax teacher, then MixA's selected mix and the controls (all-SteLLA, last-k, random-k per seed),
with test top-1 (95% Wilson interval, Δ vs the teacher), the quadratic layers, FLOPs per image, training and
inference images/s and peak memory; the caption gives the Eq. 3 scores and the selected layers."""

from __future__ import annotations

from typing import Iterable

from attnbench.results.records import Measurement
from attnbench.views.rows import (
    aggregate,
    board_title,
    fmt_seeds,
    seed_note,
    seed_rows,
    timing_mark,
    unfinished_caption,
)
from attnbench.views.sources import commits_of, latest
from attnbench.views.tables import table_view
from attnbench.views.compare import SCORE_TEST, metric, score_p, separation

ORDER = {"teacher": 0, "mixa": 1, "all-stella": 2, "last-k": 3}


def _mib(v) -> str:
    return f"{v / 2**20:.1f} MiB" if isinstance(v, (int, float)) else "-"


def _studies(recs: list[Measurement]) -> list[list[Measurement]]:
    """``recs`` split into studies: a study's run seeds each start from one teacher (one file for every seed, or
    each seed its own, as ``--seeds`` trains them); a teacher whose seeds another teacher already covers (another
    run of the same preset) is another study, newest first."""
    seeds_of: dict = {}
    newest: dict = {}
    for r in recs:
        t = r.params.get("teacher")
        seeds_of.setdefault(t, set()).add(r.seed)
        newest[t] = max(newest.get(t, ""), r.ended_at or "")
    studies: list[tuple[set, set]] = []
    for t in sorted(seeds_of, key=lambda t: newest[t], reverse=True):
        study = next((st for st in studies if not st[1] & seeds_of[t]), None)
        if study is None:
            studies.append(({t}, set(seeds_of[t])))
        else:
            study[0].add(t)
            study[1].update(seeds_of[t])
    return [[r for r in recs if r.params.get("teacher") in teachers] for teachers, _ in studies]


def measured_tables(records: Iterable[Measurement], source_label: str) -> list[tuple[str, list[str], list[list[str]], str]]:
    groups: dict[tuple, list[Measurement]] = {}
    # a preset edited since a run is another configuration: its records get a table of their own, not hidden
    for r in latest(records, preferred=("ok",)):
        groups.setdefault((r.setting, r.device, r.params.get("k"), r.params.get("identity")), []).append(r)
    identities: dict[tuple, int] = {}
    for setting, device, k, _ in groups:
        identities[(setting, device, k)] = identities.get((setting, device, k), 0) + 1
    studies = [(key, study) for key, recs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0])))
               for study in _studies(recs)]
    out = []
    for (setting, device, k, identity), recs in studies:
        rows = []
        # a row is a variant over its seeds (attnbench.views.rows.seed_rows); its teacher (a run seed trains its own)
        # and selected layers may differ by seed
        rows_of = {key[4]: rs for key, rs in seed_rows(recs, key=lambda r: r.attention,
                                                       vary=("seed", "teacher", "quadratic_layers", "specs",
                                                             "selected_layers")).items()}
        stats = {v: aggregate(rs) for v, rs in rows_of.items()}
        scored = [v for v, st in stats.items() if st is not None]
        best = max(scored, key=lambda v: stats[v].mean, default=None)
        teach = next((v for v in scored if rows_of[v][-1].params.get("quadratic_layers") is None), None)

        def differs(a: str, b: str | None) -> bool | None:
            """Whether rows a's and b's test top-1 differ significantly (:func:`score_p`, p < 0.05); None: untested."""
            p = score_p(rows_of[a], rows_of[b]) if b is not None else None
            return None if p is None else p < 0.05

        for v in sorted(rows_of, key=lambda v: (ORDER.get(v, 4), v)):
            rs, st = rows_of[v], stats[v]
            r = next((m for m in reversed(rs) if m.status == "ok" and "score" in m.metrics), rs[-1])
            m = r.metrics
            sets = list(dict.fromkeys(str(x.params.get("quadratic_layers")) for x in rs))
            layers = r.params.get("quadratic_layers")
            where = " / ".join("all softmax" if q == "None" else (q.strip("[]") or "none") for q in sets)
            if st is None:
                rows.append([v, where, r.status, *["-"] * 7])
                continue
            deltas = [x.metrics["delta_vs_teacher"] for x in rs if x.status == "ok"
                      and isinstance(x.metrics.get("delta_vs_teacher"), (int, float))]
            delta = sum(deltas) / len(deltas) if deltas else None
            tr = m.get("train_images_per_s")
            mark = "^" if v == best else ("≈" if differs(v, best) is False else "")
            dmark = " ≈" if differs(v, teach) is False else ""
            rows.append([v, where, fmt_seeds(st) + (f" {mark}" if mark else ""),
                         "-" if delta is None or layers is None else f"{delta:+.2f}{dmark}",
                         f"{m['flops_per_image'] / 1e6:.3g} M", "-" if tr is None else f"{tr:.0f}{timing_mark(r)}",
                         f"{m['infer_images_per_s']:.0f}{timing_mark(r)}", _mib(m.get("infer_peak_mem_bytes")),
                         _mib(m.get("peak_mem_bytes")), f"{m['wall_s']:.0f} s{timing_mark(r)}"])
        ok = [r for r in recs if r.status == "ok" and r.metrics.get("scores")]
        first = ok[-1] if ok else recs[-1]
        fm, fp = first.metrics, first.params
        commits = commits_of(recs)
        per_seed = {r.seed: r for r in sorted(ok, key=lambda r: r.ended_at or "")}  # each seed's teacher and scores
        teachers = sorted({r.params.get("teacher") for r in recs})
        several = len(teachers) > 1
        shown = sorted(per_seed.items()) if several else [(None, first)]  # one teacher: one set of scores
        selection = "; ".join((f"seed {sd}: " if several else "")
                              + ", ".join(f"{i}: {x:.3g}" for i, x in enumerate(r.metrics.get("scores") or []))
                              + f" → top-{k} {r.params.get('selected_layers')}" for sd, r in shown)
        teacher = ("one per run seed, " + "; ".join(f"seed {sd}: {r.params.get('teacher')}"
                                                     for sd, r in sorted(per_seed.items()))) if several else teachers[0]
        cap = (f"{source_label}. MixA (Ahmed et al. 2025): Eq. 3 scores I_A per layer {selection}"
               + f" (A' = {fp.get('linear_matrix')}, {fp.get('score_batches')} × {fp.get('score_batch_size')} "
               f"{fp.get('score_split')} images; the top-{k} stay quadratic). Quadratic layers "
               f"are ReLU quadratic attention (Eqs. 4-5), the rest SteLLA (Eqs. 6-7); every variant fine-tuned "
               f"{fp.get('steps')} steps × batch {fp.get('batch_size')} from the teacher's weights with KD (T = "
               f"{fp.get('kd_temperature')}, α = {fp.get('kd_alpha')}). Teacher {teacher}. Data: {fm.get('data', '?')}. "
               f"Test top-1 (%) at the best validation step ± half-width of the 95% Wilson interval (n = "
               f"{fm.get('n_test', '?')}); ^ best; ≈ not significantly different from the best ({SCORE_TEST}, p ≥ "
               f"0.05). Δ: points vs the teacher, ≈ when not significantly "
               f"different from it (p ≥ 0.05): no gain or loss shown (several seeds: the mean of the seeds' Δ). FLOPs, throughput, memory and "
               f"wall: the latest seed's cell.{seed_note(stats.values())} FLOPs per image by torch.utils.flop_counter; "
               f"infer mem: tensor bytes of one forward at {fm.get('infer_batch', '?')} images (CUDA: allocator "
               f"peak); train mem: {fm.get('mem_method', '?')}. Commit {', '.join(commits)}. "
               + separation(rows_of, metric("score")).line("Separation (top-1)"))
        if not any(r.status == "ok" for r in recs):
            cap = unfinished_caption(source_label, recs)
        preset = f" · preset {str(identity)[:8]}" if identities[(setting, device, k)] > 1 else ""
        out.append((board_title("mixa", setting, f"{device} · k = {k}{preset}", recs),
                    ["variant", "quadratic layers", "top-1", "Δ teacher", "FLOPs/img", "train img/s",
                     "infer img/s", "infer mem", "train mem", "wall"], rows, cap))
    return out


def view():
    return table_view(measured_tables)
