"""lm-eval task definitions over local JSONL files, so an LM checkpoint can be scored with no network.

:func:`write_local_tasks` writes, into one folder (lm-eval's ``include_path``):

- ``<prefix>_heldout``: ``loglikelihood_rolling`` over the held-out documents (``heldout.jsonl``, one
  ``{"text": ...}`` per document); lm-eval reports ``word_perplexity``, ``byte_perplexity`` and ``bits_per_byte``
  as its ``wikitext`` task does (words: whitespace-separated pieces of the document, bytes: its UTF-8 bytes).
- ``<prefix>_cloze``: ``multiple_choice`` built deterministically (``seed``) from the same documents
  (``cloze.jsonl``): the context is up to ``CONTEXT_LINES`` consecutive lines of a document, the choices its true next
  line and 3 lines drawn from *other* documents, re-indented like the true one (so indentation alone does not give
  the answer away); ``acc`` and ``acc_norm``. Chance is 1/4.

The YAML files are generated here (not templates under ``suites/lm/tasks``): each names its JSONL by absolute path
(``dataset_path: json`` + ``dataset_kwargs.data_files``), as lm-eval's guide to local datasets has it. Torch-free.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Sequence

CONTEXT_LINES = 4  # lines of context of a cloze item
MIN_LINE_CHARS = 8  # a cloze answer (and a distractor) has at least this many non-blank characters
N_CHOICES = 4


def _informative(line: str) -> bool:
    return len(line.strip()) >= MIN_LINE_CHARS


def cloze_items(docs: Sequence[str], *, seed: int = 0, n: int = 200) -> list[dict]:
    """Up to ``n`` items ``{"context", "choices", "label"}`` from ``docs`` (see the module docstring); the same
    ``docs`` and ``seed`` give the same items."""
    rng = random.Random(seed)
    lines = [d.split("\n") for d in docs]
    # (doc, line) of every answer candidate: an informative line after at least one non-blank line
    candidates = [(d, i) for d, ls in enumerate(lines) for i in range(1, len(ls))
                  if _informative(ls[i]) and any(x.strip() for x in ls[max(0, i - CONTEXT_LINES):i])]
    pool = [(d, ln.strip()) for d, ls in enumerate(lines) for ln in ls if _informative(ln)]
    if len({d for d, _ in pool}) < 2:
        return []
    rng.shuffle(candidates)
    items = []
    for d, i in candidates:
        if len(items) >= n:
            break
        true = lines[d][i]
        indent = true[:len(true) - len(true.lstrip())]
        seen = {true.strip()}
        distractors: list[str] = []
        for _ in range(200):  # draws; an item without 3 distinct lines of other documents is skipped
            od, text = pool[rng.randrange(len(pool))]
            if od != d and text not in seen:
                seen.add(text)
                distractors.append(indent + text)
                if len(distractors) == N_CHOICES - 1:
                    break
        if len(distractors) < N_CHOICES - 1:
            continue
        label = rng.randrange(N_CHOICES)
        choices = distractors[:label] + [true] + distractors[label:]
        context = "\n".join(lines[d][max(0, i - CONTEXT_LINES):i]) + "\n"
        items.append({"context": context, "choices": choices, "label": label})
    return items


def _yaml(config: dict) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=10_000)


def write_local_tasks(folder: str | Path, docs: Sequence[str], *, seed: int = 0, n_cloze: int = 200,
                      name_prefix: str = "attnbench") -> Path:
    """Write the held-out perplexity task and the cloze task over ``docs`` into ``folder`` (created) and return it:
    the ``include_path`` to give lm-eval. Empty documents are dropped. Raises ``ValueError`` without documents."""
    docs = [d for d in docs if d and d.strip()]
    if not docs:
        raise ValueError("no held-out documents to build the local lm-eval tasks from")
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    heldout = folder / f"{name_prefix}_heldout.jsonl"
    cloze = folder / f"{name_prefix}_cloze.jsonl"
    with open(heldout, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    items = cloze_items(docs, seed=seed, n=n_cloze)
    with open(cloze, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    configs = {
        f"{name_prefix}_heldout": {
            "task": f"{name_prefix}_heldout",
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(heldout)}},
            "output_type": "loglikelihood_rolling",
            "test_split": "test",
            "num_fewshot": 0,
            "doc_to_text": "",
            "doc_to_target": "text",
            "metric_list": [{"metric": "word_perplexity", "aggregation": "weighted_perplexity",
                             "higher_is_better": False},
                            {"metric": "byte_perplexity", "aggregation": "weighted_perplexity",
                             "higher_is_better": False},
                            {"metric": "bits_per_byte", "aggregation": "bits_per_byte", "higher_is_better": False}],
            "metadata": {"version": 1.0, "documents": len(docs)},
        },
    }
    if items:
        configs[f"{name_prefix}_cloze"] = {
            "task": f"{name_prefix}_cloze",
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(cloze)}},
            "output_type": "multiple_choice",
            "test_split": "test",
            "fewshot_split": "test",
            "doc_to_text": "context",
            "doc_to_target": "label",
            "doc_to_choice": "choices",
            "target_delimiter": "",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
            "metadata": {"version": 1.0, "seed": seed, "items": len(items)},
        }
    for old in folder.glob(f"{name_prefix}_*.yaml"):
        old.unlink()
    for name, cfg in configs.items():
        (folder / f"{name}.yaml").write_text(_yaml(cfg), encoding="utf-8")
    return folder


def read_jsonl_texts(path: str | Path, field: str = "text") -> list[str]:
    """The ``field`` of every line of a JSONL file (the held-out corpus of a checkpoint)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line)[field])
    return out
