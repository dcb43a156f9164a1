"""``attnbench run lm``: a typer command over :mod:`.train`. Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.cli import kit as clikit
from attnbench.cli.kit import console, fail
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions

ATTN_HELP = ("LM variants, comma-separated: LAYER[+NAME][:key=value...], LAYER transformer | retnet | gla | mamba | "
             "deltanet | gated_deltanet; NAME a registered q/k feature map for the delta rules, GLA and RetNet "
             "(default silu for the delta rules, none for GLA and RetNet; nala), or the Transformer's causal "
             "attention (default softmax); options qk_norm=l2|k|none, key_width=double|match, use_short_conv, "
             "conv_size, use_gate, chunk_size, or the map's own (lam, tau)")
#: every row of NaLaFormer's Table 5
TABLE_ROWS = "transformer,retnet,mamba,gla,deltanet,deltanet+nala,gated_deltanet,gated_deltanet+nala"


@clikit.run_command(suite="lm")
def run_command(
    attn: str = typer.Option(TABLE_ROWS, "--attn", help=ATTN_HELP),
    preset: str = typer.Option("tiny", "--preset", help="tiny (offline: Python stdlib source, CPU minutes), 340m "
                               "(NaLaFormer Table 5's setting, GPUs), or a .toml path"),
    data: Optional[str] = typer.Option(None, "--data", help="corpus instead of the preset's: local .txt / .jsonl / "
                                       ".parquet paths or globs (comma-separated), or hub:NAME[:CONFIG]"),
    smoke: bool = clikit.flag(False, "--smoke", help="each model of the preset at full size through the real "
                              "pipeline on a small JSONL corpus written here (tokenizer training, packing, 3 steps "
                              "at batch 2 on the CPU, validation, a checkpoint and a resume, lm-eval on the local "
                              "tasks), then the full run's cost on an H100; temporary store and files unless "
                              "--db / --out"),
    no_eval: bool = clikit.flag(False, "--no-eval", help="train only (evaluate later with `attnbench eval lm`)"),
    *, opts: RunOptions,
) -> None:
    """Train the language models of NaLaFormer's Table 5 (Transformer++, RetNet, Mamba, GLA, DeltaNet and Gated
    DeltaNet, with and without NaLa) on the same tokens, then score them with lm-eval (held-out perplexity and
    multiple choice offline; the paper's tasks where the hub is reachable)."""
    from .config import load_preset, parse_variants
    from .smoke import run_smoke

    try:
        variants = parse_variants(attn)
        pre = load_preset(preset)
        for v in variants:
            pre.model_config(v, 256)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    if smoke:
        if data is not None:
            fail("--smoke writes its own small JSONL corpus; drop --data")

        clikit.exit_with(lambda: run_smoke(pre, variants, seed=opts.only_seed(), db=opts.db, out=opts.out,
                                           console=console), opts)

    def run():
        from .train import run_lm

        return run_lm(variants=variants, preset=pre, data=data, opts=opts, console=console, evaluate=not no_eval)

    clikit.finish(run, suite="lm", setting=pre.key, opts=opts)
