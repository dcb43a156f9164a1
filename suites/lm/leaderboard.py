"""The LM leaderboard: ``attnbench table lm``. One table per (setting, device): a row per variant with what
training measured (parameters, state size, validation and test loss / perplexity, bits per byte against the
corpus's unigram entropy, tokens/s, wall) and, joined by variant, the lm-eval scores of its checkpoint (records of
task ``lm-eval``, written by ``attnbench eval lm`` or after ``attnbench run lm``). NaLaFormer's Table 5 follows
(``reported/*.toml``), labelled reported."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from attnbench.results.records import Measurement
from attnbench.results.reported import leaderboard_tables
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
from attnbench.views.compare import metric, separation

# the lm-eval (task, metric) behind each column, as in FLA's README evaluation and NaLaFormer's Table 5
COLUMNS = (("Wiki. ppl↓", "wikitext", "word_perplexity"), ("LMB. ppl↓", "lambada_openai", "perplexity"),
           ("PIQA acc", "piqa", "acc"), ("Hella. acc_n", "hellaswag", "acc_norm"), ("Wino. acc", "winogrande", "acc"),
           ("ARC-e acc", "arc_easy", "acc"), ("ARC-c acc_n", "arc_challenge", "acc_norm"))
# Avg.: the mean of the five accuracy columns, as in the paper
AVERAGED = ("piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge")

# the headline metrics of the local tasks (suites/lm/local_tasks.py); not word perplexity: a whitespace "word" of
# source code is a whole expression, and its perplexity runs to millions whatever the model
LOCAL = (("held-out bits/byte↓", "attnbench_heldout", "bits_per_byte"), ("cloze acc", "attnbench_cloze", "acc"),
         ("cloze acc_n", "attnbench_cloze", "acc_norm"))


def _score(scores: dict, task: str, metric: str):
    v = (scores.get(task) or {}).get(metric)
    return v if isinstance(v, (int, float)) else None


def _fmt(v, metric: str) -> str:
    if v is None:
        return "-"
    if "perplexity" in metric:
        return f"{v:.2f}"
    if metric == "bits_per_byte":
        return f"{v:.3f}"
    return f"{100 * v:.1f}"  # accuracies in %


def _mean_of(rs: list[Measurement], metric: str, digits: int) -> str:
    vals = [r.metrics[metric] for r in rs if r.status == "ok" and isinstance(r.metrics.get(metric), (int, float))]
    return f"{sum(vals) / len(vals):.{digits}f}" if vals else "-"


def measured_tables(records: Iterable[Measurement], source_label: str):
    groups: dict[tuple, dict[str, list[Measurement]]] = {}
    for r in latest(records, preferred=("ok",)):
        groups.setdefault((r.setting, r.device), {}).setdefault(r.task, []).append(r)
    out = []
    for (setting, device), by_task in sorted(groups.items()):
        # a row is a variant over its seeds (attnbench.views.rows.seed_rows): test perplexity and bits/byte are means
        # over seeds, the other columns its latest seed's
        over_seeds = {k[4]: rs for k, rs in seed_rows(by_task.get("pretrain", []),
                                                      key=lambda r: r.attention).items()}
        trained = [next((m for m in reversed(rs) if m.status == "ok"), rs[-1]) for rs in over_seeds.values()]
        stats = {a: aggregate(rs, "test_ppl", proportion=False) for a, rs in over_seeds.items()}
        evals = {r.attention: r for r in by_task.get("lm-eval", []) if r.status == "ok"}
        labels = [r.attention for r in trained] + sorted(set(evals) - {r.attention for r in trained})
        scores = {a: (evals[a].metrics.get("lm_eval") or {}) for a in evals}
        tasks_present = {t for s in scores.values() for t in s}
        cols = [c for c in (*LOCAL, *COLUMNS) if c[1] in tasks_present]
        header = ["variant", "params", "state/layer", "test ppl", "test bits/byte", "best val loss", "tokens/s",
                  "wall", *[c[0] for c in cols]] + (["Avg."] if set(AVERAGED) <= tasks_present else [])
        rows = []
        by_label = {r.attention: r for r in trained}
        for label in labels:
            r = by_label.get(label)
            if r is not None and r.status != "ok":
                rows.append([label, r.status, *["-"] * (len(header) - 2)])
                continue
            m = r.metrics if r is not None else {}
            row = [label, f"{m['n_params'] / 1e6:.2f} M" if m.get("n_params") else "-",
                   (f"{m['state_per_layer'] / 1e3:.1f} k" + ("/token" if m.get("state_per_token") else ""))
                   if m.get("state_per_layer") else "-",
                   fmt_seeds(stats.get(label)) if stats.get(label) is not None else "-",
                   _mean_of(over_seeds.get(label, []), "test_bits_per_byte", 3),
                   f"{m['best_val_loss']:.3f}" if m.get("best_val_loss") else "-",
                   f"{m['train_tokens_per_s']:.0f}{timing_mark(r)}" if m.get("train_tokens_per_s") else "-",
                   f"{m['wall_s']:.0f} s{timing_mark(r)}" if m.get("wall_s") else "-"]
            s = scores.get(label, {})
            row += [_fmt(_score(s, task, metric), metric) for _, task, metric in cols]
            if "Avg." in header:
                accs = [_score(s, t, dict((c[1], c[2]) for c in COLUMNS)[t]) for t in AVERAGED]
                row.append(f"{100 * sum(accs) / len(accs):.1f}" if all(a is not None for a in accs) else "-")
            rows.append(row)
        first = next((r for r in trained if r.status == "ok"), None)
        fm, fp = (first.metrics, first.params) if first else ({}, {})
        ev = next(iter(evals.values()), None)
        every = [r for recs in by_task.values() for r in recs]
        commits = commits_of(every)
        cap = (f"{source_label}. Corpus: {fm.get('data', '?')}. Test perplexity per token of the trained model "
               f"(weights of the best validation step) on the held-out test documents; bits/byte the same loss per "
               f"UTF-8 byte; unigram entropy of the corpus {fm.get('unigram_entropy', float('nan')):.3f} nats/token "
               f"(a model that learned only token frequencies; test loss well below it = the model learned). "
               f"Budget: {fp.get('steps', '?')} steps × batch {fp.get('batch_size', '?')} × {fp.get('seq_len', '?')} "
               f"tokens; state/layer = the numbers one layer carries per sequence: heads × key features × value size "
               f"for the delta rules, GLA and RetNet, channels × state size for Mamba (the convolution windows aside); a "
               f"Transformer's KV cache grows with the length (/token). "
               + (f"lm-eval {ev.metrics.get('lm_eval_version', '?')} scores (zero-shot; accuracies in %) of each "
                  f"checkpoint, local tasks over the same held-out documents. " if ev else "No lm-eval records yet "
                  "(attnbench eval lm CHECKPOINT). ")
               + f"Test ppl and bits/byte: means over seeds; the other columns: the latest seed's cell. Throughput "
               f"from whatever machine ran the cells. Commit {', '.join(commits)}."
               + seed_note(stats.values(), proportion=False) + " "
               + separation(over_seeds, metric("test_ppl")).line("Separation (test ppl)"))
        title = board_title("lm", setting, device, every)
        if first is None:
            cap = unfinished_caption(source_label, every)
        out.append((title, header, rows, cap))
    return out


def _reported() -> list:
    return leaderboard_tables(Path(__file__).with_name("reported"))


def view():
    return table_view(measured_tables, extra=_reported)
