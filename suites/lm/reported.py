"""NaLaFormer's Table 5 (``../shared/papers/notes/nalaformer.md``): 340M models, 15B SlimPajama tokens, zero-shot
lm-eval. Published numbers, never mixed with measured rows; ``attnbench table lm`` prints them labelled
"reported". The Transformer++, RetNet, Mamba and GLA rows are the GLA paper's 340M/15B numbers reproduced by
NaLaFormer (the notes checked them); the DeltaNet row (29.08 / 50.87) differs from the DeltaNet paper's own 340M
row, so it was presumably retrained with an unpublished configuration."""

from __future__ import annotations

SOURCE = "Meng et al. 2026, NaLaFormer (arXiv 2506.21137), Table 5"
# the lm-eval (task, metric) behind each column, as in FLA's README evaluation
COLUMNS = (("Wiki. ppl↓", "wikitext", "word_perplexity"), ("LMB. ppl↓", "lambada_openai", "perplexity"),
           ("PIQA acc", "piqa", "acc"), ("Hella. acc_n", "hellaswag", "acc_norm"), ("Wino. acc", "winogrande", "acc"),
           ("ARC-e acc", "arc_easy", "acc"), ("ARC-c acc_n", "arc_challenge", "acc_norm"))
# Avg: the mean of the five accuracy columns (the notes verified every row)
AVERAGED = ("piqa", "hellaswag", "winogrande", "arc_easy", "arc_challenge")

# model, attnbench variant (None: not a variant attnbench trains), the 7 columns, Avg as printed
TABLE5 = (
    ("Transformer++", None, (28.39, 42.69, 63.3, 34.0, 50.4, 44.5, 24.2), 43.3),
    ("RetNet", None, (32.33, 49.19, 63.5, 33.5, 52.5, 44.5, 23.4), 43.5),
    ("Mamba", None, (28.39, 39.66, 65.0, 35.4, 50.1, 46.3, 23.6), 44.1),
    ("GLA", None, (28.65, 43.35, 64.8, 34.5, 51.4, 45.1, 22.7), 43.7),
    ("DeltaNet", "deltanet", (29.08, 50.87, 63.6, 33.6, 51.7, 46.0, 23.0), 43.6),
    ("NaLa+DN", "deltanet+nala", (27.82, 49.77, 64.9, 34.3, 52.7, 46.5, 23.1), 44.3),
    ("Gated DeltaNet", "gated_deltanet", (26.59, 31.67, 65.8, 35.2, 50.8, 46.0, 23.5), 44.3),
    ("NaLa+GDN", "gated_deltanet+nala", (25.89, 32.32, 65.6, 36.2, 53.2, 45.4, 23.8), 44.8),
)


def reported_tables() -> list[tuple[str, list[str], list[list[str]], str]]:
    header = ["model [attnbench variant]", *[c[0] for c in COLUMNS], "Avg."]
    rows = [[f"{name} [{variant}]" if variant else name, *[f"{x:.2f}" if i < 2 else f"{x:.1f}"
                                                           for i, x in enumerate(vals)], f"{avg:.1f}"]
            for name, variant, vals, avg in TABLE5]
    cap = (f"Published numbers, not measured by attnbench. Source: {SOURCE}. 340M parameters (the name; attnbench "
           f"counts 374M for flame's DeltaNet config and 512M for its Gated DeltaNet one), 15B SlimPajama tokens, "
           f"zero-shot; accuracies in %, Avg. = mean of the five accuracy columns. Reproduce the setting with "
           f"`attnbench run lm --preset 340m` on GPUs.")
    return [("lm reported — NaLaFormer Table 5 (340M / 15B tokens)", header, rows, cap)]
