"""lm-eval over attnbench LM checkpoints: a registered lm-eval model (``attnbench``) and one call that runs tasks.

Nothing here computes a metric: lm-eval builds the requests, this model only answers them (log-likelihoods of
continuations, rolling log-likelihoods of whole documents, greedy generations), and lm-eval aggregates them into
word / byte perplexity, bits per byte, accuracy and their standard errors.

- :class:`AttnbenchLM` (registered as ``attnbench`` in lm-eval's model registry when this module is imported) wraps a
  causal ``model(input_ids[B, T]) -> logits[B, T, V]`` and a ``tokenizers.Tokenizer``. Build it from objects
  (``AttnbenchLM(model=..., tokenizer=..., eos_id=..., max_length=...)``) or from a checkpoint directory
  (``AttnbenchLM(pretrained=PATH)``, what ``--model attnbench --model_args pretrained=PATH,batch_size=8`` does,
  through :func:`attnbench.suites.lm.artifact.load_lm`).
- :func:`evaluate_checkpoint` runs ``lm_eval.simple_evaluate`` with it and returns the store's metrics
  ``{"lm_eval": {task: {metric: value}}, "n": {task: samples}, "lm_eval_version": ...}``.
- Offline (the default): ``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1`` are set for the call; the HF libraries read
  them once at import, so when ``datasets`` / ``huggingface_hub`` are already imported their module constants are
  switched too (and restored after), see :func:`hub_mode`.

The lm-eval CLI itself with this model: ``python -m attnbench.suites.lm.eval_cli run --model attnbench --model_args
pretrained=CKPT --tasks attnbench_heldout --include_path DIR`` (lm-eval's own command line, run after this module is
imported so that ``attnbench`` is in the registry; ``lm_eval`` alone does not know it).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import Any, Iterator, Optional, Sequence

from attnbench.core.errors import AttnbenchError

OFFLINE_VARS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@contextlib.contextmanager
def hub_mode(offline: bool) -> Iterator[None]:
    """Within the block the HF hub is off (``offline=True``) or allowed. Sets the environment variables and, for
    libraries already imported (they read the variables once, at import), their module constants; restores both
    after."""
    value = "1" if offline else "0"
    saved_env = {k: os.environ.get(k) for k in OFFLINE_VARS}
    patched: list[tuple[Any, str, Any]] = []
    for k in OFFLINE_VARS:
        os.environ[k] = value
    targets = [("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
               ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))]
    for mod_name, attrs in targets:
        mod = sys.modules.get(mod_name)
        if mod is None:
            continue
        for attr in attrs:
            if hasattr(mod, attr):
                patched.append((mod, attr, getattr(mod, attr)))
                setattr(mod, attr, offline)
    try:
        yield
    finally:
        for mod, attr, old in reversed(patched):
            setattr(mod, attr, old)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


import lm_eval.models  # noqa: E402,F401  (placeholders of lm-eval's own models: get_model imports them only

#                                            while its registry is empty, which ours would no longer be)
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402

from .artifact import load_lm

# Run as `python -m attnbench.suites.lm.evaluate` this body is `__main__`: do not register a second class
# under the same name (lm-eval's registry refuses it); the main block imports the real module instead.
_register = register_model("attnbench") if __name__ != "__main__" else (lambda cls: cls)


# lm-eval's settings that its CLI / simple_evaluate pass to every model and that mean nothing here
IGNORED_ARGS = {"max_batch_size", "dtype", "trust_remote_code", "parallelize", "revision"}


def _batch_size(value: Any, default: int = 8) -> int:
    if value is None:
        return default
    if isinstance(value, str):
        if value.startswith("auto"):  # lm-eval's "auto" / "auto:N": no detection here, a fixed batch
            return default
        value = int(value)
    if int(value) < 1:
        raise ValueError(f"batch_size must be >= 1, got {value}")
    return int(value)


@_register
class AttnbenchLM(TemplateLM):
    """An attnbench causal LM as an lm-eval model. Either ``pretrained`` (a checkpoint directory) or the objects
    ``model`` (``input_ids[B, T] -> logits[B, T, V]``, causal), ``tokenizer`` (a ``tokenizers.Tokenizer``),
    ``eos_id`` and ``max_length`` (the context the model was trained at; windows never exceed it)."""

    def __init__(self, pretrained: Optional[str] = None, *, model: Any = None, tokenizer: Any = None,
                 eos_id: Optional[int] = None, max_length: Optional[int] = None, batch_size: Any = 8,
                 device: Optional[str] = "cpu", max_gen_toks: int = 256, loaded: Any = None, **extra: Any):
        super().__init__()
        import torch

        unknown = sorted(set(extra) - IGNORED_ARGS)
        if unknown:
            raise TypeError(f"attnbench model: unknown argument(s) {', '.join(unknown)}; it takes pretrained, "
                            f"batch_size, device, max_gen_toks (or model, tokenizer, eos_id, max_length)")

        if pretrained is not None and loaded is None:
            loaded = load_lm(str(pretrained))
        if loaded is not None:
            model = loaded.model if model is None else model
            tokenizer = loaded.tokenizer if tokenizer is None else tokenizer
            eos_id = loaded.eos_id if eos_id is None else eos_id
            max_length = loaded.max_length if max_length is None else max_length
            self.meta = dict(getattr(loaded, "meta", {}) or {})
        else:
            self.meta = {}
        if model is None or tokenizer is None or eos_id is None or max_length is None:
            raise ValueError("AttnbenchLM needs pretrained=CHECKPOINT, or model, tokenizer, eos_id and max_length")
        self._device = torch.device(device or "cpu")
        self.model = model.to(self._device).eval()
        self.tokenizer = tokenizer
        self._eos_id = int(eos_id)
        self._max_length = int(max_length)
        self.batch_size = _batch_size(batch_size)
        self.max_gen_toks = int(max_gen_toks)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: Optional[dict] = None) -> "AttnbenchLM":
        """``--model_args`` (``arg_dict``) over lm-eval's own settings (``--batch_size``, ``--device``): a key in
        both is taken from the model arguments (lm-eval's base class would pass it twice)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**extra, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: Optional[dict] = None) -> "AttnbenchLM":
        """``"pretrained=CHECKPOINT,batch_size=8,device=cpu"`` (lm-eval's ``--model_args``)."""
        from lm_eval import utils

        return cls.create_from_arg_obj(utils.simple_parse_args_string(arg_string), additional_config)

    # --- what TemplateLM asks for ---------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self._eos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return str(self.meta.get("config_hash") or "attnbench")

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        # lm-eval passes disable_tqdm=False explicitly (TQDM_DISABLE cannot override it): no bar in a log file
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not sys.stderr.isatty())

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
        """The tokenizer's ids of ``string``; no special tokens (the empty context is lm-eval's prefix token, the
        end of text)."""
        return list(self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens)).ids)

    def tok_decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        return self.tokenizer.decode(list(tokens))

    def _logits(self, rows: list[list[int]]):
        """The model's logits over right-padded ``rows``: [B, T_max, V] (causal: the padding changes nothing
        before it)."""
        import torch

        width = max(len(r) for r in rows)
        batch = torch.full((len(rows), width), self._eos_id, dtype=torch.long)
        for i, r in enumerate(rows):
            batch[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        with torch.inference_mode():
            return self.model(batch.to(self._device))

    def _windows(self, ctx: Sequence[int], cont: Sequence[int]) -> list[tuple[list[int], list[int]]]:
        """(input, targets) pieces that score ``cont`` after ``ctx``: inputs of at most ``max_length`` tokens, the
        context truncated from the left as lm-eval's HF model does; a continuation longer than ``max_length`` is
        scored in consecutive pieces, each with the ``max_length`` tokens before it as input."""
        full = list(ctx) + list(cont)
        out = []
        start = len(ctx)
        while start < len(full):
            end = min(start + self._max_length, len(full))
            lo = max(0, end - 1 - self._max_length)
            out.append((full[lo:end - 1], full[start:end]))
            start = end
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """``requests``: ``((context, continuation) or None, context_ids, continuation_ids)``. Log-probability of
        the continuation after the context and whether greedy decoding would produce it (see :meth:`_windows`).
        Batched, longest first, right-padded (causal: padding never changes earlier positions)."""
        import torch

        pieces = []  # (request index, input, targets)
        for i, (_, ctx, cont) in enumerate(requests):
            if not ctx or not cont:
                raise ValueError("lm-eval request with an empty context or continuation")
            pieces += [(i, inp, tgt) for inp, tgt in self._windows(ctx, cont)]
        pieces.sort(key=lambda p: -len(p[1]))
        ll = [0.0] * len(requests)
        greedy = [True] * len(requests)
        for start in range(0, len(pieces), self.batch_size):
            chunk = pieces[start:start + self.batch_size]
            logits = self._logits([inp for _, inp, _ in chunk])
            for b, (i, inp, tgt) in enumerate(chunk):
                n, c = len(inp), len(tgt)
                lp = torch.log_softmax(logits[b, n - c:n].float(), dim=-1)  # the positions predicting the targets
                target = torch.tensor(tgt, dtype=torch.long, device=lp.device)
                ll[i] += float(lp.gather(-1, target[:, None]).sum())
                greedy[i] = greedy[i] and bool((lp.argmax(-1) == target).all())
        out = list(zip(ll, greedy))
        for req, answer in zip(requests, out):
            if req[0] is not None:
                self.cache_hook.add_partial("loglikelihood", req[0], answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole document: lm-eval's disjoint rolling windows of at most ``max_length``
        tokens (each prediction with as much context as the window allows), the first conditioned on the end of
        text token; summed per document."""
        from lm_eval import utils

        windows, owner = [], []
        for r, req in enumerate(requests):
            (string,) = req.args
            for ctx, cont in map(utils.make_disjoint_window,
                                 utils.get_rolling_token_windows(token_list=self.tok_encode(string),
                                                                 prefix_token=self.prefix_token_id,
                                                                 max_seq_len=self._max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(r)
        scores = self._loglikelihood_tokens(windows) if windows else []
        totals = [0.0] * len(requests)
        for r, (ll, _) in zip(owner, scores):
            totals[r] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding (the whole prefix recomputed each step, the last ``max_length`` tokens of it) until one of
        the ``until`` strings appears, the end of text token, or ``max_gen_toks`` new tokens."""
        out = []
        for req in requests:
            context, gen_kwargs = req.args
            gen_kwargs = dict(gen_kwargs or {})
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
            ids = self.tok_encode(context) or [self.prefix_token_id]
            new: list[int] = []
            text = ""
            for _ in range(max_new):
                tok = int(self._logits([(ids + new)[-self._max_length:]])[0, -1].argmax())
                if tok == self._eos_id:
                    break
                new.append(tok)
                text = self.tok_decode(new)
                if any(u and u in text for u in until):
                    break
            for u in until:
                if u:
                    text = text.split(u)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out


# --- running tasks ------------------------------------------------------------------------------------------
LOCAL_TASKS = ("attnbench_heldout", "attnbench_cloze")  # what local_tasks.write_local_tasks writes

PathList = Optional[str | os.PathLike | Sequence[str | os.PathLike]]


class EvalError(AttnbenchError):
    """A one-line reason why lm-eval could not run (an unknown task, a hub task while offline, ...)."""


def _tasks_list(tasks: str | Sequence[str]) -> list[str]:
    items = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    return [t.strip() for t in items if t and t.strip()]


def _paths(include_path: PathList) -> list[str]:
    if include_path is None:
        return []
    items = [include_path] if isinstance(include_path, (str, os.PathLike)) else list(include_path)
    return [str(p) for p in items if p is not None]


def task_manager(tasks: Sequence[str], include_path: PathList = None):
    """lm-eval's TaskManager over ``include_path`` (a folder or several; later ones win); lm-eval's own tasks are
    indexed too (5 s) only when some requested task is not among the local ones."""
    from lm_eval.tasks import TaskManager

    paths = _paths(include_path)
    if paths:
        local = TaskManager(include_path=paths, include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    return TaskManager(include_path=paths or None)


def local_task_names(include_path: PathList) -> list[str]:
    """The tasks defined under ``include_path`` (lm-eval's own not included)."""
    paths = _paths(include_path)
    if not paths:
        return []
    from lm_eval.tasks import TaskManager

    return sorted(TaskManager(include_path=paths, include_defaults=False).all_tasks)


_HUB_MARKERS = ("offline", "couldn't reach", "connection", "hf_hub_offline", "hf_datasets_offline", "network",
                "name resolution", "max retries", "localentrynotfound", "cannot find the requested files")


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def _as_eval_error(exc: BaseException, offline: bool) -> Optional[EvalError]:
    """An exception of lm-eval's task loading as one line; None when it is not about a task's data."""
    msg = _one_line(exc)
    low = (type(exc).__name__ + " " + str(exc)).lower()
    if any(m in low for m in _HUB_MARKERS):
        if offline:
            return EvalError(f"a task's data is not available offline ({msg}); pass --online (the HF hub must be "
                             f"reachable) or use the local tasks {', '.join(LOCAL_TASKS)}")
        return EvalError(f"a task's data could not be downloaded ({msg}); is the HF hub reachable?")
    return None


def _unknown_error(unknown: Sequence[str], include_path: PathList) -> EvalError:
    local = local_task_names(include_path)
    return EvalError(f"unknown lm-eval task(s) {', '.join(unknown)}; local tasks: "
                     f"{', '.join(local) if local else '(none: no --include-path and no held-out corpus)'}; "
                     f"`lm_eval ls tasks` lists lm-eval's own")


def check_lm_eval_tasks(tasks: str | Sequence[str], include_path: PathList = None, *,
                        offline: bool = True) -> list[str]:
    """The task names, after checking that lm-eval knows each (:class:`EvalError` naming the unknown ones and the
    local tasks) and, ``offline``, that the data of every task can be had without the hub (local files or a cached
    copy; else :class:`EvalError` saying to pass ``--online``): loads each task's data once to know."""
    names = _tasks_list(tasks)
    if not names:
        raise EvalError("no task given")
    with hub_mode(offline), _quiet_lm_eval():
        tm = task_manager(names, include_path)
        unknown = [t for t in names if t not in tm.all_tasks]
        if unknown:
            raise _unknown_error(unknown, include_path)
        if offline:  # load each task's data once: a dataset that is neither local nor cached fails here
            try:
                tm.load(names)
            except Exception as exc:  # noqa: BLE001 - one line
                err = _as_eval_error(exc, offline)
                if err is None:
                    raise
                raise err from exc
    return names


def simplify(results: dict) -> dict:
    """lm-eval's ``results["results"]`` (``"metric,filter"`` keys, ``"N/A"`` stderrs) -> ``{task: {metric: value}}``
    (the filter kept as ``metric:filter`` when it is not ``none``; a missing or non-finite value is None)."""
    out: dict[str, dict[str, Any]] = {}
    for task, row in (results.get("results") or {}).items():
        metrics: dict[str, Any] = {}
        for key, value in row.items():
            if "," not in key:
                continue  # alias, samples ...
            metric, filt = key.split(",", 1)
            name = metric if filt == "none" else f"{metric}:{filt}"
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
                metrics[name] = float(value)
            else:
                metrics[name] = None
        out[task] = metrics
    return out


def sample_counts(results: dict) -> dict[str, int]:
    """Documents scored per task (lm-eval's ``n-samples``, after ``limit``)."""
    n = results.get("n-samples") or {}
    return {t: int(c.get("effective", c.get("original", 0))) for t, c in n.items()}


@contextlib.contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """No ``datasets`` progress bars ("Generating test split") and no lm-eval warning about the num_fewshot that
    attnbench set itself, within the block."""
    try:
        from datasets.utils import logging as ds_logging
    except ImportError:  # pragma: no cover - lm-eval depends on datasets
        yield
        return
    import logging

    def chosen_fewshot(record: logging.LogRecord) -> bool:  # attnbench passes num_fewshot on purpose: not news
        return not str(record.msg).startswith("Overwriting default num_fewshot")

    evaluator_log = logging.getLogger("lm_eval.evaluator")
    was = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    evaluator_log.addFilter(chosen_fewshot)
    try:
        yield
    finally:
        evaluator_log.removeFilter(chosen_fewshot)
        if was:
            ds_logging.enable_progress_bar()


def evaluate_checkpoint(path_or_loaded: Any, tasks: str | Sequence[str], *, include_path: PathList = None,
                        limit: Optional[float] = None, batch_size: int = 8, device: str = "cpu",
                        num_fewshot: int = 0, offline: bool = True, bootstrap_iters: int = 1000,
                        random_seed: int = 0) -> dict:
    """Run lm-eval's ``tasks`` (names, or a comma list) on a checkpoint (a directory, a ``LoadedLM`` or an
    :class:`AttnbenchLM`) through ``lm_eval.simple_evaluate``. Returns the store's metrics: ``{"lm_eval": {task:
    {metric: value}}, "n": {task: documents}, "lm_eval_version": str, "tasks": [...], "num_fewshot": int,
    "limit": ...}``; lm-eval computes every number. ``offline`` keeps the HF hub off for the call. Raises
    :class:`EvalError` (one line) for an unknown task or a task whose data cannot be had."""
    import lm_eval

    names = _tasks_list(tasks)
    if not names:
        raise EvalError("no task given")
    if isinstance(path_or_loaded, AttnbenchLM):
        lm = path_or_loaded
    elif isinstance(path_or_loaded, (str, os.PathLike)):
        lm = AttnbenchLM(pretrained=str(path_or_loaded), batch_size=batch_size, device=device)
    else:
        lm = AttnbenchLM(loaded=path_or_loaded, batch_size=batch_size, device=device)

    with hub_mode(offline), _quiet_lm_eval():
        tm = task_manager(names, include_path)
        unknown = [t for t in names if t not in tm.all_tasks]
        if unknown:
            raise _unknown_error(unknown, include_path)
        try:
            res = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=num_fewshot, limit=limit,
                                          task_manager=tm, log_samples=False, bootstrap_iters=bootstrap_iters,
                                          random_seed=random_seed, numpy_random_seed=random_seed,
                                          torch_random_seed=random_seed, fewshot_random_seed=random_seed)
        except Exception as exc:  # noqa: BLE001 - a task whose data cannot be had becomes one line
            err = _as_eval_error(exc, offline)
            if err is None:
                raise
            raise err from exc
    if res is None:
        raise EvalError("lm-eval returned no results")
    return {"lm_eval": simplify(res), "n": sample_counts(res), "lm_eval_version": lm_eval.__version__,
            "tasks": names, "num_fewshot": num_fewshot, "limit": limit}

