"""The MixA leaderboard: ``attnbench table mixa``. One table per (setting, device, teacher, k): the softmax
teacher, then MixA's selected mix and the controls (all-SteLLA, last-k, random-k per seed), with test top-1 (95%
Wilson interval, Δ vs the teacher), the quadratic layers, FLOPs per image, training and inference images/s and
peak memory; the caption gives the Eq. 3 scores and the selected layers."""

from __future__ import annotations

from typing import Iterable

from attnbench.tables import latest, timing_mark, unfinished_caption
from attnbench.store import Measurement

ORDER = {"teacher": 0, "mixa": 1, "all-stella": 2, "last-k": 3}


def _mib(v) -> str:
    return f"{v / 2**20:.1f} MiB" if isinstance(v, (int, float)) else "-"


def measured_tables(records: Iterable[Measurement], source_label: str) -> list[tuple[str, list[str], list[list[str]], str]]:
    from attnbench.stats import two_proportion_p, wilson_interval

    groups: dict[tuple, list[Measurement]] = {}
    for r in latest(records, preferred=("ok",)):
        p = r.params
        groups.setdefault((r.setting, r.device, p.get("teacher"), p.get("k")), []).append(r)
    out = []
    for (setting, device, teacher, k), recs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        rows = []
        scored = [r for r in recs if r.status == "ok" and "score" in r.metrics]
        best = max(scored, key=lambda r: r.metrics["score"], default=None)
        teach = next((r for r in scored if r.params.get("quadratic_layers") is None), None)

        def differs(a: Measurement, b: Measurement | None) -> bool | None:
            """Whether a's and b's test top-1 differ significantly (two-proportion test, p < 0.05)."""
            na, nb = int(a.metrics.get("n_test") or 0), int((b.metrics if b else {}).get("n_test") or 0)
            if b is None or not na or not nb:
                return None
            return two_proportion_p(a.metrics["score"] / 100, na, b.metrics["score"] / 100, nb) < 0.05

        for r in sorted(recs, key=lambda r: (ORDER.get(r.attention, 4), r.attention)):
            m = r.metrics
            layers = r.params.get("quadratic_layers")
            where = "all softmax" if layers is None else (", ".join(map(str, layers)) if layers else "none")
            if r.status != "ok" or "score" not in m:
                rows.append([r.attention, where, r.status, *["-"] * 7])
                continue
            n, p = int(m.get("n_test") or 0), m["score"] / 100
            lo, hi = wilson_interval(p, n)
            delta = m.get("delta_vs_teacher")
            tr = m.get("train_images_per_s")
            mark = "^" if r is best else ("≈" if differs(r, best) is False else "")
            dmark = " ≈" if differs(r, teach) is False else ""
            rows.append([r.attention, where, f"{100 * p:.2f} ± {100 * (hi - lo) / 2:.1f}" + (f" {mark}" if mark else ""),
                         "-" if delta is None or layers is None else f"{delta:+.2f}{dmark}",
                         f"{m['flops_per_image'] / 1e6:.3g} M", "-" if tr is None else f"{tr:.0f}{timing_mark(r)}",
                         f"{m['infer_images_per_s']:.0f}{timing_mark(r)}", _mib(m.get("infer_peak_mem_bytes")),
                         _mib(m.get("peak_mem_bytes")), f"{m['wall_s']:.0f} s"])
        ok = [r for r in recs if r.status == "ok" and r.metrics.get("scores")]
        first = ok[-1] if ok else recs[-1]
        fm, fp = first.metrics, first.params
        scores = fm.get("scores") or []
        commits = sorted({(r.git_commit or "?")[:10] + ("-dirty" if r.git_dirty else "") for r in recs})
        cap = (f"{source_label}. MixA (Ahmed et al. 2025): Eq. 3 scores I_A per layer "
               + ", ".join(f"{i}: {s:.3g}" for i, s in enumerate(scores))
               + f" (A' = {fp.get('linear_matrix')}, {fp.get('score_batches')} × {fp.get('score_batch_size')} "
               f"{fp.get('score_split')} images); top-{k} selected: {fp.get('selected_layers')}. Quadratic layers "
               f"are ReLU quadratic attention (Eqs. 4-5), the rest SteLLA (Eqs. 6-7); every variant fine-tuned "
               f"{fp.get('steps')} steps × batch {fp.get('batch_size')} from the teacher's weights with KD (T = "
               f"{fp.get('kd_temperature')}, α = {fp.get('kd_alpha')}). Teacher {teacher}. Data: {fm.get('data', '?')}. "
               f"Test top-1 (%) at the best validation step ± half-width of the 95% Wilson interval (n = "
               f"{fm.get('n_test', '?')}); ^ best; ≈ not significantly different from the best (two-proportion test, "
               f"p ≥ 0.05). Δ: points vs the teacher, ≈ when not significantly different from it (p ≥ 0.05): no gain "
               f"or loss shown. FLOPs per image by torch.utils.flop_counter; "
               f"infer mem: tensor bytes of one forward at {fm.get('infer_batch', '?')} images (CUDA: allocator "
               f"peak); train mem: {fm.get('mem_method', '?')}. Commit {', '.join(commits)}.")
        if not any(r.status == "ok" for r in recs):
            cap = unfinished_caption(source_label, recs)
        out.append((f"mixa — {setting} · {device} · k = {k}",
                    ["variant", "quadratic layers", "top-1", "Δ teacher", "FLOPs/img", "train img/s",
                     "infer img/s", "infer mem", "train mem", "wall"], rows, cap))
    return out


def view():
    from attnbench.tables import table_view

    return table_view(measured_tables)
