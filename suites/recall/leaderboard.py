"""The recall leaderboard: ``attnbench table recall`` and ``attnbench plot recall``.

One table per (setting, device, task point): a row per mixer, each seed scored at the learning rate whose
validation accuracy is best for that seed (:mod:`.rates`; Zoology's and MAD's protocol: the best of a sweep, here
chosen on validation, not on the test set), with its test accuracy over the asked positions (mean over seeds with
the test-set and seed intervals), the rates that won and the validation accuracy at each rate, the state one layer
carries, parameters and wall time. The caption: the budget, the separation line (compare's tests
between the rows, Holm-corrected), how stable the ordering is across seeds, and the registered mechanisms that do
not apply (no causal form).

The plot: test accuracy against state size per layer, one line per mixer over the widths of a difficulty (the
signature figure of Zoology and MAD); softmax's state is its KV cache at the task's length.
"""

from __future__ import annotations

import collections
import itertools
import json
import statistics
from pathlib import Path
from typing import Iterable

from attnbench.api.registry import get_attention, names
from attnbench.results.records import Measurement
from attnbench.views.compare import metric, separation
from attnbench.views.rows import aggregate, board_title, fmt_seeds, seed_note, seed_rows, slug, unfinished_caption
from attnbench.views.sources import Source, commits_of
from attnbench.views.tables import table_view

from .rates import best_rates, complete_seeds


def _vals(rs: list[Measurement]) -> dict[int, float]:
    """``{seed: best validation accuracy}`` of a mixer's finished records at one rate."""
    return {r.seed: r.metrics["best_val_acc"] for r in rs
            if r.status == "ok" and isinstance(r.metrics.get("best_val_acc"), (int, float))}


def _point(r: Measurement) -> str:
    """What a record was trained on besides its mixer, rate and seed: two points that share a task label (a preset
    whose default difficulty changed) are two tables, never one."""
    return json.dumps({k: r.params.get(k) for k in ("task_params", "hidden", "n_train", "steps", "batch_size",
                                                    "identity")}, sort_keys=True, default=str)


def by_rate(records: Iterable[Measurement]) -> dict[tuple, dict[str, dict[float, list[Measurement]]]]:
    """``(setting, device, task, point) -> {mixer: {learning rate: its records, one per seed}}``."""
    out: dict[tuple, dict[str, dict]] = {}
    for (setting, device, _dtype, task, (mixer, lr, point)), rs in seed_rows(
            records, key=lambda r: (r.attention, r.params.get("lr"), _point(r))).items():
        out.setdefault((setting, device, task, point), {}).setdefault(mixer, {})[lr] = rs
    return out


def best_rows(grouped: dict[tuple, dict[str, dict[float, list[Measurement]]]]) -> dict[tuple, dict[str, list]]:
    """Of :func:`by_rate`'s groups, each mixer's records, one per seed whose sweep has finished, each at the rate
    whose validation accuracy is best for that seed (:func:`.rates.best_rates`, the run's protocol). A mixer with no
    finished sweep keeps only its records that failed, if any (the table shows how they stand)."""
    best: dict[tuple, dict[str, list[Measurement]]] = {}
    for key, mixers in grouped.items():
        best[key] = {}
        for mixer, rates in mixers.items():
            picks = best_rates({lr: _vals(rs) for lr, rs in rates.items()})
            best[key][mixer] = ([r for s, lr in picks.items() for r in rates[lr] if r.seed == s and r.status == "ok"]
                                or [r for rs in rates.values() for r in rs if r.status != "ok"])
    return best


def _picked(rs: list[Measurement]) -> str:
    """The rates the seeds of a row were scored at: ``3e-03`` when one, ``3e-03 ×4 · 1e-03 ×2`` when several."""
    won = collections.Counter(r.params.get("lr") for r in rs if r.status == "ok")
    if len(won) == 1:
        return _fmt_lr(next(iter(won)))
    return " · ".join(f"{_fmt_lr(lr)} ×{n}" for lr, n in sorted(won.items(), key=lambda kv: (-kv[1], -(kv[0] or 0))))


def order_stability(rows: dict[str, list[Measurement]]) -> str:
    """How alike the seeds order the rows: the mean Kendall tau over pairs of seeds of the rows' test accuracies
    (1: every seed orders them alike). Over every row and the seeds all of them have, when they share two or more (a
    planned run gives some rows more seeds than others: those seeds order only some rows); else over the rows that
    have every seed."""
    from scipy.stats import kendalltau

    scores = {m: {r.seed: r.metrics["score"] for r in rs if r.status == "ok"} for m, rs in rows.items()}
    scores = {m: v for m, v in scores.items() if v}
    if not scores:
        return ""
    shared = set.intersection(*(set(v) for v in scores.values()))
    every = set.union(*(set(v) for v in scores.values()))
    if len(shared) >= 2:
        seeds, full = shared, scores
    else:
        seeds, full = every, {m: v for m, v in scores.items() if every <= set(v)}
    seeds = sorted(seeds, key=lambda s: (s is None, s))
    if len(seeds) < 2 or len(full) < 3:
        return ""
    taus = [kendalltau([v[a] for v in full.values()], [v[b] for v in full.values()]).statistic
            for a, b in itertools.combinations(seeds, 2)]
    taus = [t for t in taus if t == t]
    if not taus:
        return ""
    which = "the seeds every row has; " if len(seeds) < len(every) and len(full) == len(scores) else ""
    return (f" Ordering across seeds: mean Kendall τ {statistics.fmean(taus):.2f} between the {len(seeds)} seeds' "
            f"orderings of the {len(full)} rows ({which}1: the same order).")


def not_applicable() -> list[str]:
    """The registered mechanisms without a causal form (a recall model reads left to right)."""
    return [n for n in names() if not get_attention(n).causal_form]


def _state(m: dict) -> str:
    s = m.get("state_per_layer")
    if not isinstance(s, (int, float)):
        return "-"
    if m.get("state_per_token"):
        return f"{s * m.get('seq_len', 0) / 1e3:.1f} k (KV)"
    return f"{s / 1e3:.1f} k"


def _fmt_lr(lr) -> str:
    return f"{lr:.0e}" if isinstance(lr, (int, float)) else "?"


def measured_tables(records: Iterable[Measurement], source_label: str):
    grouped = by_rate(records)
    best = best_rows(grouped)
    out = []
    for (setting, device, task, point), rows in sorted(best.items()):
        stats = {mx: aggregate(rs, "score") for mx, rs in rows.items()}
        order = sorted(rows, key=lambda mx: -(stats[mx].mean if stats[mx] is not None else -1))
        left_out: list[str] = []
        header = ["mixer", "test acc % (answers)", "best lr", "val acc by lr", "state/layer", "params", "wall"]
        table = []
        for mx in order:
            rs = rows[mx]
            val = {lr: _vals(rs_lr) for lr, rs_lr in grouped[(setting, device, task, point)][mx].items()}
            done = complete_seeds(val)
            pending = sorted({s for v in val.values() for s in v} - done)
            if pending:
                left_out.append(f"{mx} (seed {','.join(map(str, pending))})")
            ok = [r for r in rs if r.status == "ok"]
            if not ok:
                table.append([mx, rs[-1].status if rs else "sweep unfinished", *["-"] * (len(header) - 2)])
                continue
            m = ok[-1].metrics
            scan = " · ".join(f"{_fmt_lr(lr)}: {100 * statistics.fmean(v[s] for s in done):.1f}"
                              for lr, v in sorted(val.items(), key=lambda kv: kv[0] or 0))
            table.append([mx, fmt_seeds(stats[mx]), _picked(rs), scan, _state(m),
                          f"{m['n_params'] / 1e3:.0f} k" if m.get("n_params") else "-",
                          f"{statistics.fmean(r.metrics.get('wall_s', 0) for r in ok):.0f} s"])
        every = [r for rates in grouped[(setting, device, task, point)].values() for rs in rates.values() for r in rs]
        first = next((r for r in every if r.status == "ok"), None)
        if first is None:
            out.append((board_title(f"recall {task}", setting, device, every), header, table,
                        unfinished_caption(source_label, every)))
            continue
        fm, fp = first.metrics, first.params
        na = not_applicable()
        cap = (f"{source_label}. Task {task}: {json.dumps(fp.get('task_params', {}), sort_keys=True)}; width "
               f"{fp.get('hidden')}, {fp.get('n_train', fm.get('n_train'))} training examples, "
               f"{fp.get('steps')} steps × batch {fp.get('batch_size')}. Test accuracy over the "
               f"{fm.get('n_test')} asked positions of the test split (weights of the best validation step), each "
               f"seed at the learning rate whose validation accuracy is best for it ('best lr': the rates that won, "
               f"'val acc by lr': each rate's mean over the seeds)."
               + (f" Left out until they have trained at every rate: {', '.join(left_out)}." if left_out else "")
               + f" state/layer: the numbers one layer's mixer carries from token to "
               f"token per sequence "
               f"(the Transformer's KV cache at this length, which grows with it: 'KV'; the convolution windows "
               f"aside). Commit {', '.join(commits_of(every))}."
               + seed_note(stats.values()) + " " + separation(rows, metric("score")).line("Separation")
               + order_stability(rows)
               + (f" Not applicable (no causal form; a recall model reads left to right): {', '.join(na)}."
                  if na else ""))
        out.append((board_title(f"recall {task}", setting, device, every), header, table, cap))
    return out


def plot_recall(source: Source, out_dir: Path, prefix: str = "recall") -> list[Path]:
    """Test accuracy against state size per layer (log scale), one line per mixer over the widths of each
    difficulty, one figure per (setting, device, task difficulty); returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple, dict[str, list[tuple[float, float, bool]]]] = {}
    for (setting, device, _task, _point), rows in best_rows(by_rate(source.records)).items():
        for mx, rs in rows.items():
            st = aggregate(rs, "score")
            ok = [r for r in rs if r.status == "ok"]
            if st is None or not ok:
                continue
            m, p = ok[-1].metrics, ok[-1].params
            size = m.get("state_per_layer") * (m.get("seq_len", 1) if m.get("state_per_token") else 1)
            key = (setting, device, json.dumps(p.get("task_params", {}), sort_keys=True), p.get("n_train"))
            panels.setdefault(key, {}).setdefault(mx, []).append((size, st.mean, bool(m.get("state_per_token"))))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (setting, device, params, n_train), lines in sorted(panels.items()):
        fig, ax = plt.subplots(figsize=(7.5, 4.8))
        colors = plt.get_cmap("tab20")
        for i, (mx, pts) in enumerate(sorted(lines.items())):   # 20 colours x 4 markers: every mixer its own
            pts.sort()
            kv = any(g for _, _, g in pts)
            ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="s" if kv else "o^vD"[i // 20 % 4],
                    color=colors(i % 20), linewidth=1.2, linestyle="--" if kv else "-",
                    label=mx + (" (KV cache)" if kv else ""))
        ax.set_xscale("log")
        ax.set_xlabel("state size per layer (numbers per sequence)")
        ax.set_ylabel("test accuracy over the asked positions (%)")
        ax.set_title(f"{setting} · {device}\n{params}, {n_train} training examples", fontsize=8)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4, frameon=False)
        fig.text(0.01, 0.005, f"{source.label}", fontsize=6, color="grey")
        fig.tight_layout(rect=(0, 0.02, 1, 1))
        path = out_dir / f"{prefix}-{slug(setting.split('/', 1)[-1])}-{slug(device)}-{slug(params)}.png"
        fig.savefig(path, bbox_inches="tight", dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def view():
    return table_view(measured_tables, plot=plot_recall)
