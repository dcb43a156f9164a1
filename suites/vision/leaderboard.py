"""The vision leaderboard: ``attnbench table vision``. One table per (setting, device): rows the attention
specs, columns test top-1 (with its 95% interval and significance marks, as the LRA table), top-5, parameters,
FLOPs per image, training and inference throughput, peak memory and wall time. The papers' reported ImageNet
numbers (``reported/*.toml``) follow as separate tables labelled "reported", never mixed with measured rows."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from attnbench.results.records import Measurement
from attnbench.results.reported import leaderboard_tables
from attnbench.results.stats import above_rate_p
from attnbench.views.rows import (
    aggregate,
    board_title,
    boards,
    fmt_seeds,
    seed_note,
    seed_rows,
    timing_mark,
    unfinished_caption,
)
from attnbench.views.sources import commits_of
from attnbench.views.tables import table_view
from attnbench.views.compare import SCORE_TEST, metric, score_p, separation


def measured_tables(records: Iterable[Measurement], source_label: str) -> list[tuple[str, list[str], list[list[str]], str]]:
    out = []
    for (setting, device), recs in boards(records):
        ok = [r for r in recs if r.status == "ok" and "score" in r.metrics]
        # a row is a spec over its seeds (attnbench.views.rows.seed_rows); columns other than top-1: its latest seed
        rows_of = {k[4]: rs for k, rs in seed_rows(recs, key=lambda r: r.attention).items()}
        stats = {lab: aggregate(rs) for lab, rs in rows_of.items()}
        scored = [lab for lab, st in stats.items() if st is not None]
        best = max(scored, key=lambda lab: stats[lab].mean, default=None)
        rows = []
        for lab in sorted(rows_of, key=lambda lab: (lab.split(":")[0] != "softmax",
                                                    -(stats[lab].mean if stats[lab] else -1.0), lab)):
            st = stats[lab]
            r = next((m for m in reversed(rows_of[lab]) if m.status == "ok" and "score" in m.metrics),
                     rows_of[lab][-1])
            m = r.metrics
            if st is None:
                rows.append([lab, r.impl or "-", r.status, *["-"] * 7])
                continue
            n, p = st.n_test or 0, st.mean / 100
            marks = "^" if lab == best else ""
            if lab != best and (p_best := score_p(rows_of[lab], rows_of[best])) is not None and p_best >= 0.05:
                marks += "≈"
            if n and m.get("majority_test_acc") is not None and above_rate_p(p, n, m["majority_test_acc"]) >= 0.05:
                marks += "†"
            mem = m.get("peak_mem_bytes")
            top5 = aggregate(rows_of[lab], "test_top5", scale=1.0, proportion=False)
            rows.append([lab, r.impl or "-", fmt_seeds(st) + (f" {marks}" if marks else ""),
                         f"{100 * top5.mean:.2f}" if top5 is not None and m.get("num_classes", 0) >= 100 else "-",
                         f"{m['n_params'] / 1e6:.2f} M", f"{m['flops_per_image'] / 1e9:.3g} G",
                         f"{m['train_images_per_s']:.0f}{timing_mark(r)}", f"{m['infer_images_per_s']:.0f}{timing_mark(r)}",
                         f"{mem / 2**20:.0f} MiB" if isinstance(mem, (int, float)) else "< res.",
                         f"{m['wall_s']:.0f} s{timing_mark(r)}"])
        first = ok[-1] if ok else recs[-1]
        fm, fp = first.metrics, first.params
        commits = commits_of(recs)
        cap = (f"{source_label}. Data: {fm.get('data', '?')}. Test top-1 (%) with the weights of the best validation "
               f"step ± the half-width of its 95% Wilson interval over the test set (n = {fm.get('n_test', '?')}); "
               f"^ best; ≈ not significantly different from the best ({SCORE_TEST}, p ≥ 0.05); † not above "
               f"the majority class ({100 * (fm.get('majority_test_acc') or 0):.1f}%). Top-5 shown with ≥ 100 "
               f"classes. FLOPs per image by torch.utils.flop_counter (matmul-class ops). Budget: "
               f"{fp.get('steps')} steps × batch {fp.get('batch_size')} on {fm.get('n_train', '?')} training "
               f"images, {fp.get('model')} ViT, {fp.get('image_size')}² px, patch {fp.get('patch_size')}, "
               f"{fm.get('tokens', '?')} tokens" + (f", block options {fp.get('block_options')}"
                                                    if fp.get("block_options") else "")
               + f". Top-5: mean over seeds; throughput, memory and wall: the latest seed's cell, from whatever "
               f"machine ran it. Commit {', '.join(commits)}.{seed_note(stats.values())} "
               + separation(rows_of, metric("score")).line("Separation (top-1)"))
        if not ok:
            cap = unfinished_caption(source_label, recs)
        title = board_title("vision", setting, device, recs)
        out.append((title, ["attention", "impl", "top-1", "top-5", "params", "FLOPs/img", "train img/s",
                            "infer img/s", "peak mem", "wall"], rows, cap))
        sweep = resolution_table(ok, setting, device)
        if sweep:
            out.append(sweep)
    return out


def resolution_table(records: list[Measurement], setting: str, device: str):
    """Inference images/s and peak memory of each trained model as the resolution grows (its ``sweep``)."""
    sweeps = {r.attention: r.metrics.get("resolution_sweep") or [] for r in records}
    marks = {r.attention: timing_mark(r) for r in records}
    resolutions = sorted({row["resolution"] for rows in sweeps.values() for row in rows})
    if not resolutions:
        return None
    tokens = {row["resolution"]: row["tokens"] for rows in sweeps.values() for row in rows}
    rows = []
    for att, pts in sweeps.items():
        by = {p["resolution"]: p for p in pts}
        cells = []
        for res in resolutions:
            p = by.get(res)
            if p is None:
                cells.append("-")
            elif p["status"] != "ok":
                cells.append(p["status"])
            else:
                cells.append(f"{p['infer_images_per_s']:.0f}/s · {p['peak_mem_bytes'] / 2**20:.0f} MiB"
                             f"{marks[att]}")
        rows.append([att, *cells])
    cap = ("The trained weights evaluated at each resolution (position embedding resampled): inference images/s "
           "and peak memory of one forward pass (CUDA: the allocator's peak; CPU: tensor bytes alive at once, "
           "allocator-independent). Same batch at every resolution (the preset's [sweep] batch). Separation: not tested "
           "(one timing per point, without repeats: no noise to test a difference against)."
           + (" fixed length: the attention's own weights are sized by the training resolution's token count "
              "(Linformer's projections), so the trained model has no form at another."
              if any(p["status"] == "fixed length" for pts in sweeps.values() for p in pts) else ""))
    return (f"vision resolution sweep — {setting} · {device}",
            ["attention", *[f"{res}² ({tokens[res]} tok)" for res in resolutions]], rows, cap)


def _reported() -> list:
    """The main published tables (the ablations stay in ``reported/*.toml``)."""
    return leaderboard_tables(Path(__file__).with_name("reported"))


def view():
    """The vision view of :mod:`attnbench.views.tables`: measured tables, then the reported ones."""
    return table_view(measured_tables, extra=_reported)
