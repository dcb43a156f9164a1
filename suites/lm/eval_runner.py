"""The runner of ``attnbench eval lm CHECKPOINT...``: lm-eval tasks on trained LM checkpoints, scores into the store.
Torch-free at import; lm-eval and torch are imported when an evaluation runs.

One store record per checkpoint (suite ``lm``, the checkpoint's setting, task ``lm-eval``, attention = its variant),
``metrics = {"lm_eval": {task: {metric: value}}, "n": {task: documents}, "lm_eval_version": ...,
"checkpoint": path}``. Its identity (``config_hash``) covers the checkpoint's own config hash, the tasks, ``limit``
and ``num_fewshot``: the same evaluation of the same checkpoint is skipped unless ``--force``.

Local tasks (``attnbench_heldout``, ``attnbench_cloze``, see :mod:`.local_tasks`): when one is asked for and the
checkpoint's ``meta["heldout"]`` names a JSONL corpus, they are written into ``<checkpoint>.lm_eval_tasks/`` beside
the checkpoint and given to lm-eval as an include path (with ``--include-path``, if any, after it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from attnbench.core.errors import AttnbenchError
from attnbench.engine.sweep import Cell, CellResult, SweepSummary, run_sweep
from attnbench.results.paths import project_root
from attnbench.results.records import point_hash

from .artifact import ArtifactError, read_meta
from .local_tasks import read_jsonl_texts, write_local_tasks

DEFAULT_TASKS = "attnbench_heldout,attnbench_cloze"
LOCAL_TASKS = ("attnbench_heldout", "attnbench_cloze")


def _heldout_file(meta: dict, checkpoint: Path) -> Optional[Path]:
    held = meta.get("heldout")
    if not held:
        return None

    p = Path(held)
    for cand in ([p] if p.is_absolute() else [Path.cwd() / p, project_root() / p, checkpoint / p]):
        if cand.is_file():
            return cand.resolve()
    raise ArtifactError(f"{checkpoint}: its held-out corpus {held} is not there (config.json meta.heldout); "
                          f"give the local tasks with --include-path instead")


def local_tasks_for(checkpoint: str | Path, meta: dict, *, seed: int = 0) -> Optional[Path]:
    """Write the local tasks of a checkpoint with a held-out corpus into ``<checkpoint>.lm_eval_tasks/``
    (deterministic: rewritten each time, same content); None without a corpus."""

    checkpoint = Path(checkpoint)
    held = _heldout_file(meta, checkpoint)
    if held is None:
        return None
    try:
        docs = read_jsonl_texts(held)
    except (OSError, ValueError, KeyError) as e:
        raise ArtifactError(f"{held}: damaged held-out corpus ({type(e).__name__}: {e})") from None
    folder = checkpoint.resolve().parent / f"{checkpoint.resolve().name}.lm_eval_tasks"
    return write_local_tasks(folder, docs, seed=seed)


def run_evaluation(checkpoints: Sequence[str | Path], tasks: str | Sequence[str] = DEFAULT_TASKS, *,
                   include_path: Optional[str] = None, limit: Optional[float] = None, batch_size: int = 8,
                   device: str = "cpu", num_fewshot: int = 0, online: bool = False, db: Optional[str] = None,
                   force: bool = False, console: Any = None, seed: int = 0,
                   argv: Optional[list[str]] = None):
    """Evaluate each checkpoint on ``tasks`` with lm-eval and record one cell per checkpoint (see the module
    docstring). Checkpoints and task names are checked before anything runs (:class:`AttnbenchError`, one line);
    a checkpoint whose evaluation fails is a failed cell. Checkpoints of several settings: one sweep per setting,
    returned as one summary."""

    from .evaluate import _tasks_list, check_lm_eval_tasks

    names = _tasks_list(tasks)
    if not names:
        raise AttnbenchError("--tasks: no task given")
    if limit is not None:
        if limit <= 0:
            raise AttnbenchError(f"--limit must be > 0 (documents per task, or a fraction < 1), got {limit}")
        limit = int(limit) if limit >= 1 else float(limit)  # lm-eval: a count from 1 up, else a fraction
    if not checkpoints:
        raise AttnbenchError("no checkpoint given")
    wants_local = any(t in LOCAL_TASKS for t in names)
    plans = []  # (path, meta, include paths)
    for ck in checkpoints:
        path = Path(ck)
        meta = read_meta(path)
        auto = local_tasks_for(path, meta, seed=seed) if wants_local else None
        includes = [str(p) for p in (auto, include_path) if p is not None]
        plans.append((path, meta, includes))
    checked: set[tuple] = set()
    for _, _, includes in plans:  # unknown tasks / hub tasks offline: one line before any work
        key = tuple(includes)
        if key not in checked:
            check_lm_eval_tasks(names, includes or None, offline=not online)
            checked.add(key)

    def run_cell(cell: Cell, ctx) -> CellResult:
        from .evaluate import evaluate_checkpoint

        path, includes = cell.payload
        metrics = evaluate_checkpoint(str(path), names, include_path=includes or None, limit=limit,
                                      batch_size=batch_size, device=device, num_fewshot=num_fewshot,
                                      offline=not online, random_seed=seed)
        metrics["checkpoint"] = str(path)
        return CellResult("ok", metrics=metrics)

    by_setting: dict[str, list[Cell]] = {}
    for path, meta, includes in plans:
        setting = str(meta.get("setting") or "lm/unknown")
        variant = str(meta.get("variant") or path.name)
        params = {"checkpoint_hash": meta.get("config_hash"), "tasks": names, "limit": limit,
                  "num_fewshot": num_fewshot, "seed": seed}
        h = point_hash(suite="lm", setting=setting, task="lm-eval", attention=variant, options={}, params=params,
                       dtype=None, device=device)
        by_setting.setdefault(setting, []).append(
            Cell(task="lm-eval", attention=variant, config_hash=h, params=params, seed=seed,
                 payload=(path, includes), name=f"lm-eval · {variant} ({path.name})"))
    summaries = [run_sweep(cells, run_cell, suite="lm", setting=setting, db=db, device=device, force=force,
                           console=console, argv=argv if argv is not None else list(sys.argv),
                           config={"tasks": names, "limit": limit, "num_fewshot": num_fewshot, "online": online})
                 for setting, cells in by_setting.items()]
    if len(summaries) == 1:
        return summaries[0]
    return SweepSummary("lm", ",".join(s.setting for s in summaries), [o for s in summaries for o in s.outcomes],
                        interrupted=any(s.interrupted for s in summaries), run_id=summaries[-1].run_id,
                        planned=sum(s.planned for s in summaries))
