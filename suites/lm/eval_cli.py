"""``attnbench eval lm CHECKPOINT...`` (the runner is :mod:`.eval_runner`), and lm-eval's own command line with
the ``attnbench`` model registered: ``python -m attnbench.suites.lm.eval_cli run --model attnbench --model_args
pretrained=CKPT,batch_size=8 --tasks attnbench_heldout --include_path DIR`` (:func:`lm_eval_main`; the HF offline
variables are the caller's to set there). Torch-free at import (typer only); lm-eval and torch are imported when a
command runs.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from attnbench.cli import kit as clikit
from attnbench.cli.kit import fail
from attnbench.core.errors import AttnbenchError

from .artifact import read_meta
from .eval_runner import DEFAULT_TASKS, run_evaluation


def eval_command(
    checkpoint: list[str] = typer.Argument(..., help="LM checkpoint directories (config.json, model.pt, "
                                           "tokenizer.json), as `attnbench run lm` writes them"),
    tasks: str = typer.Option(DEFAULT_TASKS, "--tasks", help="comma-separated lm-eval tasks: the local "
                              "attnbench_heldout (rolling perplexity of the held-out corpus) and attnbench_cloze "
                              "(next-line multiple choice), or lm-eval's own (wikitext, lambada_openai, piqa, "
                              "hellaswag, winogrande, arc_easy, arc_challenge; need --online or a cached copy)"),
    include_path: Optional[str] = typer.Option(None, "--include-path", help="a folder of extra lm-eval task YAMLs "
                                               "(lm-eval's include_path)"),
    limit: Optional[float] = typer.Option(None, "--limit", help="at most this many documents per task (a "
                                          "fraction when < 1), as lm-eval's --limit; for quick checks only"),
    batch_size: int = typer.Option(8, "--batch-size", help="sequences per forward pass"),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1 ..."),
    num_fewshot: int = typer.Option(0, "--num-fewshot", help="few-shot examples per prompt (perplexity tasks "
                                    "stay at 0)"),
    online: bool = clikit.flag(False, "--online", help="allow the HF hub (lm-eval's own tasks download their "
                               "data); default: offline, HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1"),
    db: Optional[str] = clikit.DB,
    force: bool = clikit.FORCE,
    seed: int = typer.Option(0, "--seed", help="seed of the cloze task's items and of lm-eval's sampling"),
) -> None:
    """Score LM checkpoints with lm-eval (perplexity and accuracy), one record per checkpoint in the store."""
    setting = None
    try:
        metas = [read_meta(c) for c in checkpoint]
        settings = {str(m.get("setting") or "lm/unknown") for m in metas}
        setting = settings.pop() if len(settings) == 1 else None
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))

    def run():
        return run_evaluation(checkpoint, tasks, include_path=include_path, limit=limit, batch_size=batch_size,
                              device=device, num_fewshot=num_fewshot, online=online, db=db, force=force,
                              console=clikit.console, seed=seed)

    clikit.finish(run, suite="lm", setting=setting, db=db)


def lm_eval_main(argv: Optional[list[str]] = None) -> None:
    """lm-eval's own command line (``lm_eval ...``) with the ``attnbench`` model registered."""
    from lm_eval.__main__ import cli_evaluate

    import attnbench.suites.lm.evaluate  # noqa: F401  (registers `attnbench`)

    if argv is not None:
        sys.argv = ["lm_eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    lm_eval_main()
