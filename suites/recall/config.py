"""Recall presets (TOML data in ``presets/*.toml``) and the mixers of ``attnbench run recall --attn``.

A preset file has::

    name, description, source, setting
    mixers = "softmax,linear,..."     # the default --attn
    learning_rates = [1e-3, 3e-3]     # every mixer and seed trains at each; a seed's score is at the rate best on
                                      # its validation (suites/recall/rates.py)
    epochs = 200                      # optional: steps = epochs x training examples // batch at each point
                                      # (MAD's protocol); 0 or absent: [train] steps everywhere
    widths = [64, 128]                # --sweep: the model widths of the difficulty sweep
    [data]                            # DataConfig: examples per split, data seed
    [[tasks]]                         # one or more: name = a task of suites/recall/tasks.py, its parameters,
                                      # and sweep = [{...}, ...]: the difficulty points --sweep adds
    [model]                           # attnbench.models.lm.LMConfig fields shared by every mixer (head_dim is
                                      # hidden / heads)
    [train]                           # attnbench.engine.train.TrainConfig (lr: each of learning_rates)

A mixer (``--attn``) is a causal attention mechanism of the registry, a built-in or a plug-in, with options
(``softmax``, ``nala:lam=2``: a Transformer block holding it), or a token mixer of the language-model suite,
``LAYER[+NAME][:key=value...]`` (:mod:`attnbench.models.variants`: ``deltanet``, ``gated_deltanet+nala``,
``gla``, ``retnet``, ``mamba``). A mechanism without a causal form is not applicable (a recall model reads left
to right): it is listed with the reason, and trains nothing.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

from attnbench.api.registry import get_attention
from attnbench.api.spec import check_distinct, split_spec
from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.engine import presets
from attnbench.engine.presets import PresetError, check_keys, coerce
from attnbench.engine.presets import preset_names as _preset_names
from attnbench.engine.train.config import TrainConfig
from attnbench.models.lm import LMConfig
from attnbench.models.variants import LAYERS, Variant, parse_variant

from .tasks import TASKS, generate, task_parameters

#: LMConfig fields a preset's [model] may set; the vocabulary comes from the task, head_dim from hidden / heads
MODEL_FIELDS = ("hidden", "layers", "heads", "expand_v", "use_gate", "use_short_conv", "conv_size", "block_conv",
                "hidden_ratio", "intermediate_size", "tie_embeddings", "norm_eps", "init_std", "qk_norm",
                "key_width", "chunk_size", "rope_theta", "ssm_state", "ssm_expand", "dt_rank")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Examples per split and the data seed (the splits use ``seed``, ``seed + 1``, ``seed + 2``)."""
    n_train: int
    n_val: int
    n_test: int
    seed: int = 0

    def __post_init__(self) -> None:
        for k in ("n_train", "n_val", "n_test"):
            if getattr(self, k) < 1:
                raise ValueError(f"data.{k} must be >= 1, got {getattr(self, k)}")

    @property
    def sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """One task of a preset: its generator's parameters, and the difficulty points ``--sweep`` adds."""
    name: str
    params: dict
    sweep: tuple = ()       # (dict, ...): parameters overriding ``params`` (``n_train`` among them)
    n_train: int = 0        # training examples of this task (0: [data] n_train)


@dataclasses.dataclass(frozen=True)
class Point:
    """What one group of cells trains on: a task at one difficulty, a model width."""
    task: str
    params: dict            # the generator's parameters (the task's, with the point's overrides)
    hidden: int
    label: str              # the record's task: "mqar" at the preset's default, else "mqar num_kv_pairs=16 d=128"
    n_train: int            # training examples

    @property
    def vocab_size(self) -> int:
        return int(self.params.get("vocab_size", task_parameters(self.task)["vocab_size"]))


@dataclasses.dataclass(frozen=True)
class Mixer:
    """A mixer of the table: its label (the record's attention), the LM variant that builds it, or the reason it
    does not apply."""
    label: str
    variant: Optional[Variant]
    not_applicable: str = ""


@dataclasses.dataclass(frozen=True)
class RecallPreset(presets.SuitePreset):
    suite = "recall"

    data: DataConfig
    model: dict[str, Any]
    train: TrainConfig
    mixers: str = "softmax"
    learning_rates: list[float] = dataclasses.field(default_factory=lambda: [1e-3])
    widths: list[int] = dataclasses.field(default_factory=list)
    epochs: int = 0
    tasks: tuple = dataclasses.field(default=(), metadata={"from_file": False})

    def __post_init__(self) -> None:
        if not self.learning_rates or any(lr <= 0 for lr in self.learning_rates):
            raise ValueError(f"learning_rates must be a non-empty list of positive rates, got {self.learning_rates}")
        if any(w < 1 for w in self.widths):
            raise ValueError(f"widths must be positive, got {self.widths}")
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0 (0: [train] steps), got {self.epochs}")

    def identity(self) -> dict[str, Any]:
        out = {"data": dataclasses.asdict(self.data), "model": self.model, "train": self.train.to_dict()}
        return {**out, "epochs": self.epochs} if self.epochs else out

    def steps(self, point: Point) -> int:
        """Training steps at ``point``: ``epochs`` passes over its training examples, or [train] steps."""
        if not self.epochs:
            return self.train.steps
        return max(1, self.epochs * (point.n_train // self.train.batch_size))

    def points(self, sweep: bool = False, only: Sequence[str] = ()) -> list[Point]:
        """Each task at its default difficulty and the preset's width; with ``sweep``, every difficulty point of
        each task (its default included) at every width of ``widths`` (the preset's width when none); ``only``
        (``--point``): those of the whole grid whose labels (the records' task) it names, in the grid's order."""
        if only:
            grid = self.points(sweep=True)
            unknown = [label for label in only if label not in {p.label for p in grid}]
            if unknown:
                raise AttnbenchError(f"--point {unknown[0]!r} is not a point of preset {self.name}: expected one of "
                                     + ", ".join(repr(p.label) for p in grid))
            return [p for p in grid if p.label in only]
        base_w = int(self.model.get("hidden", LMConfig.hidden))
        out: list[Point] = []
        for t in self.tasks:
            variants = [{}] + [dict(s) for s in t.sweep] if sweep else [{}]
            widths = (self.widths or [base_w]) if sweep else [base_w]
            seen = set()
            base = {**t.params, "n_train": t.n_train or self.data.n_train}
            for over in variants:
                params = {**base, **over}
                n_train = params.pop("n_train")
                for w in widths:
                    changed = {k: v for k, v in {**params, "n_train": n_train}.items() if base.get(k) != v}
                    label = " ".join([t.name, *(f"{k}={v}" for k, v in sorted(changed.items())),
                                      *([f"d={w}"] if w != base_w else [])])
                    if label not in seen:
                        seen.add(label)
                        out.append(Point(t.name, params, w, label, n_train))
        return out

    def model_config(self, mixer: Mixer, point: Point) -> LMConfig:
        """The model of ``mixer`` at ``point``: the preset's [model] at the point's width, the task's
        vocabulary, head size ``hidden / heads``."""
        v = mixer.variant
        fields = {**self.model, "hidden": point.hidden, **dict(v.model_options)}
        heads = int(fields.get("heads", 1))
        if point.hidden % heads:
            raise AttnbenchError(f"recall: width {point.hidden} does not split into {heads} heads")
        fields["head_dim"] = point.hidden // heads
        if v.map is not None and v.map.kind == "attention":
            slot = dict(attention=v.map.name, attention_options=dict(v.map.options))
        else:
            slot = dict(feature_map=v.feature_map, feature_options=dict(v.map_options))
        return LMConfig(layer=v.layer, vocab_size=point.vocab_size, **slot, **fields)

    def sizes(self, point: Point) -> dict[str, int]:
        """Examples per split at ``point``."""
        return {**self.data.sizes, "train": point.n_train}


def preset_names() -> list[str]:
    return _preset_names(__package__)


def _read_tasks(data: dict, file: str) -> dict[str, Any]:
    """``[[tasks]]``: each a task name, its parameters (checked by a trial generation of one example) and its
    ``sweep`` points."""
    tables = data.get("tasks")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise PresetError(f"{file}: [[tasks]]: give at least one task table (name = one of {', '.join(TASKS)})")
    out = []
    for i, table in enumerate(tables):
        where = f"{file}: [[tasks]] #{i + 1}"
        table = dict(table)
        name = table.pop("name", None)
        if name not in TASKS:
            raise PresetError(f"{where}: name must be one of {', '.join(TASKS)}, got {name!r}")
        sweep = table.pop("sweep", [])
        if not isinstance(sweep, list) or not all(isinstance(s, dict) for s in sweep):
            raise PresetError(f"{where}: sweep must be a list of tables of parameters, got {sweep!r}")
        n_train = table.pop("n_train", 0)
        allowed = [*task_parameters(name), "n_train"]
        check_keys(table, allowed, where)
        for j, over in enumerate([{}] + sweep):
            check_keys(over, allowed, f"{where} sweep #{j}")
            params = {k: v for k, v in {**table, **over}.items() if k != "n_train"}
            if not isinstance(over.get("n_train", n_train), int) or over.get("n_train", n_train) < 0:
                raise PresetError(f"{where} sweep #{j}: n_train must be a non-negative int")
            try:
                generate(name, 1, params, 0)
            except AttnbenchError as e:
                raise PresetError(f"{where}" + (f" sweep #{j}" if j else "") + f": {e}") from None
        out.append(TaskConfig(name, table, tuple(sweep), n_train))
    return {"tasks": tuple(out)}


def _read(data: dict, file: str) -> dict[str, Any]:
    if "model" not in data or not isinstance(data["model"], dict):
        raise PresetError(f"{file}: top level: missing table [model]")
    model = dict(data["model"])
    check_keys(model, MODEL_FIELDS, f"{file}: [model]")
    hints = typing.get_type_hints(LMConfig)
    for k, v in model.items():   # checked, kept as written (an int for a float field stays an int: same identity)
        coerce(hints[k], v, f"{file}: [model]: key {k!r}")
    return {"model": model, **_read_tasks(data, file)}


def load_preset(name_or_path: str | Path) -> RecallPreset:
    """An embedded preset (``tiny``, ``zoology``, ``mad``) or a ``.toml`` file."""
    return presets.load(RecallPreset, __package__, name_or_path, kind="recall", own=("model", "tasks"), read=_read)


def parse_mixer(text: str) -> Mixer:
    """One ``--attn`` item: an LM layer (``deltanet+nala``) or a registered attention (``nala:lam=2``)."""
    head, _ = split_spec(text, what="--attn", syntax="NAME[:key=value...] or LAYER[+NAME][:key=value...]")
    if head.partition("+")[0] in LAYERS:
        v = parse_variant(text)
        return Mixer(v.label, v)
    try:
        cls = get_attention(head)
    except UnknownNameError as e:
        raise UnknownNameError(f"--attn {text!r}: {e}; or a language-model mixer: {', '.join(LAYERS)}") from None
    if not cls.causal_form:
        return Mixer(text, None, f"{head} has no causal form (bidirectional only), and a recall model reads "
                                 f"left to right")
    v = parse_variant(f"transformer+{text}")
    return Mixer(v.map.label, v)


def parse_mixers(text: str) -> list[Mixer]:
    items = [t.strip() for t in (text or "").split(",")]
    if not any(items):
        raise AttnbenchError("--attn: give at least one mixer, e.g. softmax,nala,deltanet+nala")
    if not all(items):
        raise AttnbenchError(f"--attn {text!r}: an empty mixer between commas")
    out = [parse_mixer(i) for i in items]
    check_distinct([m.label for m in out], "--attn: mixer(s) given twice: {}")
    return out


__all__ = ["DataConfig", "Mixer", "Point", "RecallPreset", "TaskConfig", "load_preset", "parse_mixer",
           "parse_mixers", "preset_names"]
