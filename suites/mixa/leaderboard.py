"""The MixA leaderboard: ``attnbench table mixa``. One table per (setting, device, teacher, k): the softmax
teacher, then MixA's selected mix and the controls (all-SteLLA, last-k, random-k per seed), with test top-1 (95%
Wilson interval, Δ vs the teacher), the quadratic layers, FLOPs per image, training and inference images/s and
peak memory; the caption gives the Eq. 3 scores and the selected layers."""

from __future__ import annotations

from typing import Iterable

from attnbench.tables import board_title, commits_of, latest, timing_mark, unfinished_caption
from attnbench.store import Measurement

ORDER = {"teacher": 0, "mixa": 1, "all-stella": 2, "last-k": 3}


def _mib(v) -> str:
    return f"{v / 2**20:.1f} MiB" if isinstance(v, (int, float)) else "-"


def measured_tables(records: Iterable[Measurement], source_label: str) -> list[tuple[str, list[str], list[list[str]], str]]:
    from attnbench.stats import two_proportion_p
    from attnbench.tables import aggregate, fmt_seeds, seed_note, seed_rows

    groups: dict[tuple, list[Measurement]] = {}
    for r in latest(records, preferred=("ok",)):
        p = r.params
        groups.setdefault((r.setting, r.device, p.get("teacher"), p.get("k")), []).append(r)
    out = []
    for (setting, device, teacher, k), recs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        rows = []
        # a row is a variant over its seeds (attnbench.tables.seed_rows); its selected layers may differ by seed
        rows_of = {key[4]: rs for key, rs in seed_rows(recs, key=lambda r: r.attention,
                                                       vary=("seed", "quadratic_layers", "specs",
                                                             "selected_layers")).items()}
        stats = {v: aggregate(rs) for v, rs in rows_of.items()}
        scored = [v for v, st in stats.items() if st is not None]
        best = max(scored, key=lambda v: stats[v].mean, default=None)
        teach = next((v for v in scored if rows_of[v][-1].params.get("quadratic_layers") is None), None)

        def differs(a: str, b: str | None) -> bool | None:
            """Whether rows a's and b's test top-1 (means over seeds) differ significantly (two-proportion test,
            p < 0.05)."""
            if b is None or not stats[a].n_test or not stats[b].n_test:
                return None
            return two_proportion_p(stats[a].mean / 100, stats[a].n_test, stats[b].mean / 100,
                                    stats[b].n_test) < 0.05

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
        scores = fm.get("scores") or []
        commits = commits_of(recs)
        cap = (f"{source_label}. MixA (Ahmed et al. 2025): Eq. 3 scores I_A per layer "
               + ", ".join(f"{i}: {s:.3g}" for i, s in enumerate(scores))
               + f" (A' = {fp.get('linear_matrix')}, {fp.get('score_batches')} × {fp.get('score_batch_size')} "
               f"{fp.get('score_split')} images); top-{k} selected: {fp.get('selected_layers')}. Quadratic layers "
               f"are ReLU quadratic attention (Eqs. 4-5), the rest SteLLA (Eqs. 6-7); every variant fine-tuned "
               f"{fp.get('steps')} steps × batch {fp.get('batch_size')} from the teacher's weights with KD (T = "
               f"{fp.get('kd_temperature')}, α = {fp.get('kd_alpha')}). Teacher {teacher}. Data: {fm.get('data', '?')}. "
               f"Test top-1 (%) at the best validation step ± half-width of the 95% Wilson interval (n = "
               f"{fm.get('n_test', '?')}); ^ best; ≈ not significantly different from the best (two-proportion test of "
               f"the means over seeds, p ≥ 0.05). Δ: points vs the teacher, ≈ when not significantly "
               f"different from it (p ≥ 0.05): no gain or loss shown (several seeds: the mean of the seeds' Δ). FLOPs, throughput, memory and "
               f"wall: the latest seed's cell.{seed_note(stats.values())} FLOPs per image by torch.utils.flop_counter; "
               f"infer mem: tensor bytes of one forward at {fm.get('infer_batch', '?')} images (CUDA: allocator "
               f"peak); train mem: {fm.get('mem_method', '?')}. Commit {', '.join(commits)}.")
        if not any(r.status == "ok" for r in recs):
            cap = unfinished_caption(source_label, recs)
        out.append((board_title("mixa", setting, f"{device} · k = {k}", recs),
                    ["variant", "quadratic layers", "top-1", "Δ teacher", "FLOPs/img", "train img/s",
                     "infer img/s", "infer mem", "train mem", "wall"], rows, cap))
    return out


def view():
    from attnbench.tables import table_view

    return table_view(measured_tables)
