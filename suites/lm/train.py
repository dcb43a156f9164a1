"""The LM runner: each variant (layer kind x feature map x options) trained on the same tokens by the same recipe,
then scored by lm-eval.

``attnbench run lm`` -> :func:`run_lm`: the corpus of the preset (:mod:`.data`, tokenised once and cached), the
model of :mod:`attnbench.models.lm`, the shared trainer (:mod:`attnbench.engine.train`: AdamW, warm-up + cosine,
clipping, accumulation, bf16 autocast on CUDA, checkpoints and resume, the NaN and divergence guards, DDP /
FSDP2 under ``--nproc``) and sweep (:mod:`attnbench.engine.sweep`). Per cell the store gets the validation loss at the
best step, the test split's loss, perplexity and bits per byte, the unigram entropy of the corpus (the loss of a
model that learned only token frequencies), parameters, delta-rule state size, tokens/s and wall time; the
trained model is written as an artifact (:mod:`.artifact`) that ``attnbench eval lm`` (lm-eval) scores next.

Determinism: window order from ``(seed, epoch)``, RNG from ``(seed, step, rank)``, so a resumed run ends
bit-identical to an uninterrupted one on a CPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunContext, RunOptions, run_options
from attnbench.engine.sweep import Cell, CellContext, CellResult, Outcome, SweepSummary
from attnbench.engine.train.dist import Dist
from attnbench.engine.train.trainer import TrainHooks, TrainOrder, TrainTask, train
from attnbench.measure.peak import PeakMeter
from attnbench.models.lm import DELTA_LAYERS, build_lm
from attnbench.models.mixers import fla_refusal, key_feature_dim
from attnbench.ops.delta import FLA_MAX_KEY_DIM, resolve_delta_impl
from attnbench.results.records import point_hash
from attnbench.results.store import Store

from .artifact import save_lm
from .config import LMPreset, Variant, load_preset
from .data import Corpus, DataConfig, load_corpus
from .eval_runner import run_evaluation

SUITE = "lm"
HooksFor = Callable[[str], TrainHooks]


def _ids(corpus: Corpus, split: str, idx: Sequence[int], device: torch.device) -> torch.Tensor:
    arr = np.stack([corpus.window(split, int(i)) for i in idx]).astype(np.int64)    # [b, T+1]
    return torch.from_numpy(arr).to(device, non_blocking=True)


def next_token_loss(model: torch.nn.Module, ids: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross entropy of ``ids[:, 1:]`` given ``ids[:, :-1]`` through ``model``'s forward (so DDP / FSDP see it)."""
    logits = model(ids[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction=reduction)


@torch.no_grad()
def split_loss(model: torch.nn.Module, corpus: Corpus, split: str, *, windows: int, batch: int, dist: Dist,
               device: torch.device) -> dict[str, float]:
    """Mean next-token loss (nats) over the first ``windows`` windows of ``split`` (0: all), sharded over the
    ranks; also perplexity and bits per byte (tokens -> bytes by the split's own ratio)."""
    was = model.training
    model.eval()
    n = corpus.windows(split) if not windows else min(windows, corpus.windows(split))
    if n == 0:
        raise AttnbenchError(f"the {split} split has fewer than {corpus.seq_len + 1} tokens: nothing to evaluate")
    mine = list(range(dist.rank, n, dist.world))
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    for i in range(0, len(mine), batch):
        ids = _ids(corpus, split, mine[i:i + batch], device)
        sums[0] += next_token_loss(model, ids, reduction="sum").double()
        sums[1] += ids[:, 1:].numel()
    dist.all_reduce_sum(sums)
    model.train(was)
    loss = (sums[0] / sums[1]).item()
    out = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": int(sums[1].item())}
    bpt = corpus.bytes_per_token(split)
    if bpt:
        out["bits_per_byte"] = loss / math.log(2) / bpt
    return out


def plan_cells(pre: LMPreset, variants: Sequence[Variant], *, seed: int | Sequence[int], device: str,
               corpus_fp: str) -> list[Cell]:
    """One cell per (variant, seed) (``seed``: one seed or several); a seed's cell is the same whether its run had
    other seeds or not (the seed is in params)."""

    seeds = [seed] if isinstance(seed, int) else list(seed)
    cells = []
    for v, seed in ((va, s) for s in seeds for va in variants):
        params = {"seed": seed, "preset": pre.name, "seq_len": pre.data.seq_len, "steps": pre.train.steps,
                  "batch_size": pre.train.batch_size, "identity": pre.identity_hash(), "data": corpus_fp,
                  "layer": pre.layer_identity(v.layer)}
        h = point_hash(suite=SUITE, setting=pre.key, task="pretrain", attention=v.label, options=v.options(),
                       params=params, dtype="float32", device=device)
        cells.append(Cell(task="pretrain", attention=v.label, config_hash=h, options=v.options(), params=params,
                          dtype="float32", seed=seed, payload=v,
                          name=f"{v.label} · seed {seed}" if len(seeds) > 1 else ""))
    return cells


def artifact_dir(work: Path, pre: LMPreset, cell: Cell) -> Path:
    safe = cell.attention.replace(":", "_").replace("=", "-").replace("+", "_")
    return Path(work) / "models" / pre.key.replace("/", "_") / f"{safe}-{cell.config_hash[:10]}"


def run_cell(cell: Cell, ctx: CellContext, *, corpus: Corpus, pre: LMPreset, device: torch.device, work: Path,
             hooks: Optional[HooksFor] = None) -> CellResult:
    """Train one variant, pick the best validation step, score the test split, write the artifact."""

    dist = ctx.dist or Dist()
    variant: Variant = cell.payload
    meter = PeakMeter(device)
    cfg = pre.model_config(variant, corpus.vocab_size)
    torch.manual_seed(cell.seed)
    model = build_lm(cfg).to(device)
    order = TrainOrder(corpus.windows("train"), pre.train.batch_size, cell.seed)
    eval_batch = max(1, pre.eval.batch_size)

    def batch(step: int, rank: int, world: int):
        return (_ids(corpus, "train", order.shard(step, rank, world), device),)

    def loss(net, b, teacher):
        return next_token_loss(net, b[0])

    def validate(net):
        r = split_loss(net, corpus, "val", windows=pre.data.eval_windows, batch=eval_batch, dist=dist, device=device)
        return {"val_loss": r["loss"], "val_ppl": r["ppl"]}

    ckpt = Path(work) / "checkpoints" / (artifact_dir(work, pre, cell).name + ".pt")
    task = TrainTask(batch, loss, validate, unit="tokens", per_sample=pre.data.seq_len)
    result = train(model, pre.train, task, seed=cell.seed, device=device, identity=cell.config_hash,
                   checkpoint=ckpt, dist=dist, progress=ctx.progress, label=cell.label,
                   hooks=hooks(cell.attention) if hooks else None, restart=ctx.force, compile=ctx.compile)
    st = result.state
    val = split_loss(model, corpus, "val", windows=0, batch=eval_batch, dist=dist, device=device)
    test = split_loss(model, corpus, "test", windows=0, batch=eval_batch, dist=dist, device=device)
    peak, mem_method = meter.read()
    mixer = model.blocks[0].attn
    metrics = {
        "score": test["ppl"], "test_loss": test["loss"], "test_ppl": test["ppl"],
        "test_bits_per_byte": test.get("bits_per_byte"), "test_tokens": test["tokens"],
        "val_loss": val["loss"], "val_ppl": val["ppl"], "best_val_loss": st.best_value, "best_step": st.best_step,
        "unigram_entropy": corpus.unigram_entropy(), "first_loss": st.first_loss, "steps_run": st.step,
        "n_params": result.n_params, "state_per_layer": mixer.state_size(),
        "state_per_token": bool(getattr(mixer, "state_grows", False)),
        "key_dim": getattr(mixer, "key_dim", None), "model": cfg.to_dict(),
        "train_tokens": st.samples * pre.data.seq_len,
        "train_tokens_per_s": st.samples * pre.data.seq_len / max(st.train_time, 1e-9),
        "train_time_s": st.train_time, "wall_s": result.wall_s, "peak_mem_bytes": peak, "mem_method": mem_method,
        "world_size": dist.world, "threads": torch.get_num_threads(), "data": corpus.description,
        "vocab_size": corpus.vocab_size, "resumed_from": st.resumed_from,
        "val_history": [[h["step"], h["val_loss"]] for h in st.history],
    }
    if dist.main:
        folder = save_lm(artifact_dir(work, pre, cell), model, corpus.tokenizer, eos_id=corpus.eos_id,
                         max_length=pre.data.seq_len,
                         meta={"setting": pre.key, "variant": cell.attention, "config_hash": cell.config_hash,
                               "preset": pre.name, "data": corpus.description, "heldout": str(corpus.test_docs),
                               "seed": cell.seed, "n_params": result.n_params})
        metrics["checkpoint"] = str(folder)
        ckpt.unlink(missing_ok=True)
    return CellResult("ok", metrics=metrics, impl=resolve_delta_impl(device, cfg.delta_impl))


def with_data(pre: LMPreset, data: Optional[str]) -> LMPreset:
    """``--data``: local files (paths / globs, comma-separated) or ``hub:NAME[:CONFIG]`` instead of the preset's."""
    import dataclasses

    if not data:
        return pre
    if data.startswith("hub:"):
        name, _, config = data[4:].partition(":")
        new = dataclasses.replace(pre.data, source="hub", path=name, name=config)
    else:
        new = dataclasses.replace(pre.data, source="files", path=data)
    return dataclasses.replace(pre, data=DataConfig(**dataclasses.asdict(new)))


def _check_fla_shapes(pre: LMPreset, variants: Sequence[Variant], device: torch.device) -> None:
    """Before any data is read: every variant whose delta rule runs on FLA's kernels here fits them (the key
    heads FLA takes; ``attnbench check --aot`` compiles the rest for the GPU), and FLA will not refuse its
    backward on this GPU and Triton (:func:`attnbench.models.mixers.fla_refusal`)."""

    for v in variants:
        cfg = pre.model_config(v, 256)
        refusal = fla_refusal(cfg, device)
        if refusal:
            raise AttnbenchError(f"{v.label}: {refusal}")
        if cfg.layer not in DELTA_LAYERS or resolve_delta_impl(device, cfg.delta_impl) != "fla":
            continue
        if key_feature_dim(cfg) > FLA_MAX_KEY_DIM:
            raise AttnbenchError(f"{pre.path}: {v.label} has key features of {key_feature_dim(cfg)} per head and FLA's "
                                 f"chunk kernels take at most {FLA_MAX_KEY_DIM}; run it as {v.label}:key_width=match "
                                 f"(the baseline's state size) or with smaller heads")


def run_lm(*, variants: Sequence[Variant], preset: str | LMPreset, data: Optional[str] = None,
           opts: Optional[RunOptions] = None, console=None, evaluate: bool = True, hooks: Optional[HooksFor] = None,
           progress: bool = True, **fields) -> SweepSummary:
    """Train every variant of ``preset`` on its corpus (``data`` in place of the preset's), then score the trained
    models with lm-eval (``evaluate``). ``opts``: the shared run options (or single ``fields`` of them, e.g.
    ``db=``, ``out=``, ``seed=``)."""
    opts = run_options(opts, **fields)
    seeds = opts.seeds  # one cell per (variant, seed)
    run = RunContext(opts, suite=SUITE, console=console, progress=progress)
    console = run.console
    pre = with_data(preset if isinstance(preset, LMPreset) else load_preset(preset), data)
    for v in variants:  # every model option checked (trial config) before any data is read
        pre.model_config(v, 256)
    work = run.work
    device = run.device
    _check_fla_shapes(pre, variants, device)
    run.check_trainable(pre, [pre.train])
    with run:
        dist = run.dist
        run.say(f"[bold]lm[/] {pre.key}: {len(variants)} variant(s) · seed {','.join(map(str, seeds))} · "
                f"{pre.train.steps} steps × "
                f"{pre.train.batch_size} × {pre.data.seq_len} tokens · {device}"
                + (f" · {dist.world} processes" if dist.enabled else ""))
        corpus = load_corpus(pre.data, work / "data", console=console if dist.main else None)
        run.say(f"[dim]corpus: {corpus.description}; {len(corpus.train):,} training tokens, vocabulary "
                f"{corpus.vocab_size}, unigram entropy {corpus.unigram_entropy():.3f} nats/token[/]")
        cells = plan_cells(pre, variants, seed=seeds, device=device.type, corpus_fp=corpus.fingerprint)
        config = {"preset": pre.name, "variants": [v.label for v in variants], "seeds": seeds, "world_size": dist.world,
                  **pre.identity(), "layers": {v.layer: pre.layer_identity(v.layer) for v in variants}}

        def one(cell: Cell, ctx: CellContext) -> CellResult:
            return run_cell(cell, ctx, corpus=corpus, pre=pre, device=device, work=work, hooks=hooks)

        summary = run.sweep(cells, one, setting=pre.key, config=config, describe=_line)
    if not (evaluate and pre.eval.tasks and dist.main):
        return summary
    return _evaluate_trained(summary, pre, db=opts.db, force=opts.force, console=console, device=device)


def _evaluate_trained(summary: SweepSummary, pre: LMPreset, *, db, force, console,
                      device: torch.device) -> SweepSummary:
    """lm-eval on the checkpoint of every cell that trained (now or earlier), through ``attnbench eval lm``'s
    code; the returned summary fails if either step failed."""

    hashes = [o.cell.config_hash for o in summary.outcomes if o.result.status == "ok"]
    with Store(db) as store:
        recs = {r.config_hash: r for r in store.measurements(suite=SUITE, setting=pre.key, task="pretrain")
                if r.status == "ok"}
    checkpoints = [recs[h].metrics["checkpoint"] for h in hashes if h in recs and recs[h].metrics.get("checkpoint")]
    missing = [p for p in checkpoints if not Path(p).is_dir()]
    if missing:
        console.print(f"[yellow]{len(missing)} checkpoint(s) recorded but not on this machine, not evaluated: "
                      f"{', '.join(missing)}[/]")
    checkpoints = [p for p in checkpoints if Path(p).is_dir()]
    if not checkpoints:
        return summary
    console.print()
    ev = run_evaluation(checkpoints, list(pre.eval.tasks), limit=pre.eval.limit or None,
                        batch_size=pre.eval.batch_size, num_fewshot=pre.eval.num_fewshot, db=db, force=force,
                        console=console, device=str(device))
    return ev if ev.exit_code() and not summary.exit_code() else summary


def _line(o: Outcome) -> str:
    from rich.markup import escape

    head = f"  {escape(o.cell.attention):<28}" + (f" seed {o.cell.seed}" if o.cell.name else "")
    r = o.result
    if r.status == "ok" and r.metrics:
        m = r.metrics
        return (f"{head} [green]ok[/]  test ppl {m['test_ppl']:.2f} (loss {m['test_loss']:.3f}, unigram entropy "
                f"{m['unigram_entropy']:.3f}) · best val loss {m['best_val_loss']:.3f} @ step {m['best_step']} · "
                f"{m['n_params'] / 1e6:.2f} M params · {m['train_tokens_per_s']:.0f} tokens/s · wall "
                f"{m['wall_s']:.0f} s")
    if r.status == "ok":
        return f"{head} [green]ok[/]  ({o.skipped})"
    color = "yellow" if r.status == "interrupted" else "red"
    return f"{head} [{color}]{r.status}[/]  {escape((r.error or o.skipped or '').splitlines()[0])}"
