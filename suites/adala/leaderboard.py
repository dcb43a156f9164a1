"""The ViT-AdaLA leaderboard: ``attnbench table adala``. One table per (setting, device): the softmax teacher,
each student attention's from-scratch model (the vision suite's, at the pipeline's step budget), and each stage
set the pipeline ran (``stages 1+2+3``, Table 3's ablation rows), with test top-1 (95% interval), the top-1 after
each stage, each stage's training loss first -> last, parameters, FLOPs, inference throughput and peak memory."""

from __future__ import annotations

from typing import Iterable

from attnbench.results.records import Measurement
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
from attnbench.views.compare import metric, separation


def _order(r: Measurement) -> tuple:
    kind = {"teacher": 0, "scratch": 1}.get(r.task, 2)
    return (kind, r.attention, -len(r.task), r.task)


def _pct(v) -> str:
    return f"{100 * v:.1f}" if isinstance(v, (int, float)) else "-"


def _loss(s: dict | None) -> str:
    if not s or s.get("first_train_loss") is None:
        return "-"
    return f"{s['first_train_loss']:.2g}→{s['final_train_loss']:.2g}"


def measured_tables(records: Iterable[Measurement], source_label: str) -> list[tuple[str, list[str], list[list[str]], str]]:
    out = []
    for (setting, device), recs in boards(records):
        rows, stats = [], []
        # a row is (attention, stage set) over its seeds (attnbench.views.rows.seed_rows); columns other than top-1
        # and the stage accuracies: its latest seed
        over_seeds = sorted(seed_rows(recs, key=lambda r: r.attention, vary=("seed", "teacher", "weights")).values(),
                            key=lambda rs: _order(rs[-1]))  # each seed has its own teacher (and scratch model)
        for rs in over_seeds:
            st = aggregate(rs)
            stats.append(st)
            r = next((m for m in reversed(rs) if m.status == "ok" and "score" in m.metrics), rs[-1])
            m = r.metrics
            what = r.task.removeprefix("stages ") if r.task.startswith("stages ") else r.task
            if st is None:
                rows.append([r.attention, what, r.status, *["-"] * 6])
                continue
            st_of = lambda x, k: ((x.metrics.get("stages") or {}).get(k) or {}).get("test_top1")  # noqa: E731
            after = []
            for k in "12":
                vals = [st_of(x, k) for x in rs if x.status == "ok" and isinstance(st_of(x, k), (int, float))]
                after.append(_pct(sum(vals) / len(vals)) if vals else "-")
            stages = m.get("stages") or {}
            mem = m.get("infer_peak_mem_bytes")
            rows.append([r.attention, what, fmt_seeds(st), " / ".join(after),
                         "; ".join(_loss(stages.get(k)) for k in "123" if k in stages) or "-",
                         f"{m['n_params'] / 1e6:.3f} M · {m['flops_per_image'] / 1e6:.3g} MFLOPs",
                         f"{m['infer_images_per_s']:.0f}{timing_mark(r)}",
                         f"{mem / 2**20:.1f} MiB" if isinstance(mem, (int, float)) else "-",
                         f"{m['wall_s']:.0f} s{timing_mark(r)}" if m.get("wall_s") is not None else "-"])
        ok = [r for r in recs if r.status == "ok" and "score" in r.metrics]
        first = ok[-1] if ok else recs[-1]
        fm, fp = first.metrics, first.params
        commits = commits_of(recs)
        cap = (f"{source_label}. Data: {fm.get('data', '?')}. Teacher: the softmax ViT {fp.get('teacher', '?')} "
               f"(vision preset {fp.get('vision_preset', '?')}). Rows: the teacher; 'scratch', the vision suite's "
               f"model of the attention trained from scratch for as many steps as stages 1+2+3 together; then the "
               f"stage sets run (Table 3: 3 = direct swap + fine-tuning). Test top-1 (%) ± the half-width of its "
               f"95% Wilson interval (n = {fm.get('n_test', '?')}); 'after 1 / 2': test top-1 after stage 1 / 2 "
               f"(with the teacher's head; mean over seeds). Stage losses (the latest seed's): each stage's training loss, first step→mean of the last "
               f"10, in stage order (1: Eq. 3, 2: Eq. 4, 3: cross-entropy). FLOPs per image by torch.utils.flop_counter; inference "
               f"images/s and the peak memory of one forward at batch {fm.get('mem_batch', '?')} (CPU: tensor bytes "
               f"alive at once) on the machine that ran the cell. Commit {', '.join(commits)}.{seed_note(stats)} "
               + separation({f"{rs[-1].attention} {i}": rs for i, rs in enumerate(over_seeds)}, metric("score"))
               .line("Separation (top-1)"))
        title = board_title("adala", setting, device, recs)
        if not ok:
            cap = unfinished_caption(source_label, recs)
        out.append((title, ["attention", "stages", "top-1", "after 1 / 2", "stage losses",
                            "params · FLOPs/img", "infer img/s", "peak mem", "train wall"], rows, cap))
    return out


def view():
    return table_view(measured_tables)
