"""The recall suite's synthetic tasks, generated here from the papers' definitions: Zoology's multi-query
associative recall (Arora et al. 2023, Sec. 3.1 and App. E.1) and MAD's six tasks (Poli et al. 2024, Sec. 3 and
App. B.1).

Every generator takes the number of examples ``n``, its task parameters as keywords and a ``seed``, and returns
``(inputs, targets)``: two int64 arrays ``[n, seq_len]``; ``targets[i, t]`` is the token the model must predict
at position ``t`` of example ``i`` (the loss and the accuracy count only those positions) or :data:`IGNORE`
(-100) where nothing is asked. The same parameters and seed give the same arrays on every machine (numpy's
``Generator`` on PCG64). A parameter the task cannot meet is an :class:`attnbench.core.errors.AttnbenchError`
of one line naming it.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Callable

import numpy as np

from attnbench.api.options import check_options
from attnbench.core.errors import AttnbenchError

IGNORE = -100


def _need(ok: bool, task: str, msg: str) -> None:
    if not ok:
        raise AttnbenchError(f"recall task {task}: {msg}")


def _positive(task: str, **values: int) -> None:
    for k, v in values.items():
        _need(isinstance(v, int) and not isinstance(v, bool) and v >= 1, task, f"{k} must be a positive int, got {v!r}")


def _power_law_slots(rng: np.random.Generator, space: int, k: int, power_a: float) -> np.ndarray:
    """``k`` distinct slots of ``0 .. space-1`` drawn without replacement with probability proportional to
    ``a * (s+1)^(a-1)`` (Zoology's query placement: most queries soon after the context, a long tail)."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return rng.choice(space, size=k, replace=False, p=p / p.sum())


def mqar(n: int, *, vocab_size: int = 8192, seq_len: int = 64, num_kv_pairs: int = 8, power_a: float = 0.01,
         random_non_queries: bool = True, seed: int = 0, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Multi-query associative recall (Zoology, Sec. 4; ``multiquery_ar`` of its repository). Each example first
    lists ``num_kv_pairs`` key-value pairs ``k1 v1 k2 v2 ...`` (keys distinct, drawn from ``[1, V/2)``; values
    distinct, from ``[V/2, V)``); the rest of the sequence queries every key once, at the even offsets ``2 s_i``
    of the query region with slots ``s_i`` drawn without replacement by a power law
    (:func:`_power_law_slots`, exponent ``power_a``). The target at a query key is its value (which the input
    never repeats); every other position is not asked. The rest of the query region is 0, or uniform random
    tokens with ``random_non_queries`` (the generator's default; Zoology's paper configurations turn it off).
    Needs an even ``seq_len >= 4 * num_kv_pairs`` and ``vocab_size > seq_len``. ``training`` changes nothing."""
    _positive("mqar", n=n, vocab_size=vocab_size, seq_len=seq_len, num_kv_pairs=num_kv_pairs)
    D, T, V = num_kv_pairs, seq_len, vocab_size
    _need(T % 2 == 0, "mqar", f"seq_len must be even (query slots are pairs of positions), got {T}")
    _need(4 * D <= T, "mqar", f"num_kv_pairs={D} needs seq_len >= {4 * D} (2 tokens per pair in the context and "
          f"a slot of 2 per query), got seq_len={T}; lower num_kv_pairs or raise seq_len")
    _need(V > T, "mqar", f"vocab_size must exceed seq_len, got vocab_size={V}, seq_len={T}")
    _need(0 < power_a <= 1, "mqar", f"power_a must be in (0, 1], got {power_a}")
    rng = np.random.default_rng(seed)
    half, context = V // 2, 2 * D
    space = (T - context) // 2
    inputs = np.zeros((n, T), dtype=np.int64)
    targets = np.full((n, T), IGNORE, dtype=np.int64)
    for i in range(n):
        keys = rng.choice(np.arange(1, half), size=D, replace=False)
        values = rng.choice(np.arange(half, V), size=D, replace=False)
        inputs[i, 0:context:2], inputs[i, 1:context:2] = keys, values
        at = context + 2 * _power_law_slots(rng, space, D, power_a)
        inputs[i, at], targets[i, at] = keys, values
    if random_non_queries:
        free = inputs == 0
        inputs[free] = rng.integers(0, V, size=int(free.sum()))
    return inputs, targets


# ------------------------------------------------------------------------------------------------------------ MAD
# MAD's generators (athms/mad-lab, mad/data/instances.py) in their multi-query form (the benchmark's). Three
# choices differ from that code, each so that every example asks what it can answer: the slot that is never noise
# is one that is generated; fuzzy recall's probe pair is always placed in the context (MAD's loop can end before
# it, leaving about 2.5% of its test sequences at length 128 unanswerable); selective copying draws its blanks
# from the seeded generator (MAD's from numpy's global one).

def _recall_targets(seq: list, asked: list, training: bool) -> tuple[np.ndarray, np.ndarray]:
    """Shift by one: inputs ``seq[:-1]``; targets the next token everywhere when training (MAD trains the recall
    tasks as language modelling), else only where ``asked``."""
    s = np.asarray(seq, dtype=np.int64)
    if training:
        return s[:-1], s[1:].copy()
    t = np.where(np.asarray(asked, dtype=bool), s, IGNORE)
    return s[:-1], t[1:]


def in_context_recall(n: int, *, vocab_size: int = 16, seq_len: int = 128, noise_vocab_size: int = 0,
                      frac_noise: float = 0.0, seed: int = 0, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's in-context recall (Poli et al. 2024, Sec. 3; App. B.1), multi-query. Keys ``[0, m/2)``, values
    ``[m/2, m)`` with ``m = vocab_size - noise_vocab_size``; noise ``[m, vocab_size)``. ``seq_len / 2 - 1`` slots,
    each a key (uniform, with replacement) and its value (drawn at the key's first occurrence, then fixed), or,
    with probability ``frac_noise``, two noise tokens (one slot is never noise); then a probe: a key already
    shown and its value. Asked: the value of every key seen before, and the probe's. Inputs and targets have
    ``seq_len - 1`` positions."""
    _positive("in_context_recall", n=n, vocab_size=vocab_size, seq_len=seq_len)
    m = vocab_size - noise_vocab_size
    _need(seq_len % 2 == 0 and seq_len >= 4, "in_context_recall", f"seq_len must be even and >= 4, got {seq_len}")
    _need(noise_vocab_size >= 0 and m >= 2, "in_context_recall", f"vocab_size={vocab_size} leaves {m} tokens for "
          f"keys and values after noise_vocab_size={noise_vocab_size}; need at least 2")
    _need(0.0 <= frac_noise < 1.0 and (frac_noise == 0 or noise_vocab_size > 0), "in_context_recall",
          f"frac_noise must be in [0, 1) and needs noise_vocab_size > 0, got {frac_noise}, {noise_vocab_size}")
    rng = np.random.default_rng(seed)
    half, slots = m // 2, seq_len // 2 - 1
    xs, ys = [], []
    for _ in range(n):
        seq, asked, kv = [], [], {}
        clean = int(rng.integers(slots))
        for i in range(slots):
            if i != clean and rng.random() < frac_noise:
                seq += list(rng.integers(m, vocab_size, size=2))
                asked += [False, False]
                continue
            k = int(rng.integers(half))
            seen = k in kv
            if not seen:
                kv[k] = int(rng.integers(half, m))
            seq += [k, kv[k]]
            asked += [False, seen]
        k = int(rng.choice(list(kv)))
        seq += [k, kv[k]]
        asked += [False, True]
        x, y = _recall_targets(seq, asked, training)
        xs.append(x)
        ys.append(y)
    return np.stack(xs), np.stack(ys)


def noisy_in_context_recall(n: int, *, vocab_size: int = 32, seq_len: int = 128, noise_vocab_size: int = 16,
                            frac_noise: float = 0.2, seed: int = 0,
                            training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's noisy in-context recall: :func:`in_context_recall` with noise slots (its baseline: 16 noise tokens
    of 32, a fifth of the slots noise)."""
    return in_context_recall(n, vocab_size=vocab_size, seq_len=seq_len, noise_vocab_size=noise_vocab_size,
                             frac_noise=frac_noise, seed=seed, training=training)


def fuzzy_in_context_recall(n: int, *, vocab_size: int = 16, seq_len: int = 128, k_motif_size: int = 3,
                            v_motif_size: int = 3, noise_vocab_size: int = 0, frac_noise: float = 0.0, seed: int = 0,
                            training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's fuzzy in-context recall, multi-query: keys and values are motifs, ordered runs of distinct tokens
    (keys of ``1..k_motif_size`` tokens when training, exactly ``k_motif_size`` at test; values of
    ``1..v_motif_size``) from ``[0, m/2)`` and ``[m/2, m)``, ``m = vocab_size - 1 - noise_vocab_size`` (token
    ``vocab_size - 1`` pads). Pairs (a key motif's value drawn at its first occurrence, then fixed) fill the
    context, a probe pair among them at a random place; then the probe key and its value. Asked: the value tokens
    of every key seen before, and the probe's. Left-padded to ``seq_len``."""
    _positive("fuzzy_in_context_recall", n=n, vocab_size=vocab_size, seq_len=seq_len, k_motif_size=k_motif_size,
              v_motif_size=v_motif_size)
    pad, m = vocab_size - 1, vocab_size - 1 - noise_vocab_size
    half = m // 2
    _need(half >= k_motif_size and m - half >= v_motif_size, "fuzzy_in_context_recall",
          f"vocab_size={vocab_size} gives {half} key and {m - half} value tokens: too few for motifs of "
          f"{k_motif_size} and {v_motif_size} distinct tokens")
    _need(seq_len >= 4 * (k_motif_size + v_motif_size), "fuzzy_in_context_recall",
          f"seq_len={seq_len} is too short for motifs of {k_motif_size} + {v_motif_size} tokens; need >= "
          f"{4 * (k_motif_size + v_motif_size)}")
    _need(0.0 <= frac_noise < 1.0 and (frac_noise == 0 or noise_vocab_size > 0), "fuzzy_in_context_recall",
          f"frac_noise must be in [0, 1) and needs noise_vocab_size > 0, got {frac_noise}, {noise_vocab_size}")
    rng = np.random.default_rng(seed)
    key_sizes = np.arange(1, k_motif_size + 1) if training else np.array([k_motif_size])

    def motif(lo: int, hi: int, size: int) -> tuple:
        return tuple(int(t) for t in rng.choice(np.arange(lo, hi), size=size, replace=False))

    xs, ys = [], []
    for _ in range(n):
        pk = motif(0, half, int(rng.choice(key_sizes)))
        pv = motif(half, m, int(rng.integers(1, v_motif_size + 1)))
        P = len(pk) + len(pv)
        probe_at = int(rng.integers(max(1, seq_len - 2 * P)))
        values, seq, asked, placed = {pk: pv}, [], [], False
        while len(seq) < seq_len - P - (k_motif_size + v_motif_size):
            if len(seq) >= probe_at and not placed:
                seq += [*pk, *pv]
                asked += [False] * P
                placed = True
            elif rng.random() < frac_noise:
                size = int(rng.choice(key_sizes)) + int(rng.integers(1, v_motif_size + 1))
                seq += list(rng.integers(m, vocab_size - 1, size=size))
                asked += [False] * size
            else:
                k = motif(0, half, int(rng.choice(key_sizes)))
                seen = k in values and (k != pk or placed)
                if k not in values:
                    values[k] = motif(half, m, int(rng.integers(1, v_motif_size + 1)))
                placed = placed or k == pk
                seq += [*k, *values[k]]
                asked += [False] * len(k) + [seen] * len(values[k])
        if not placed:
            seq += [*pk, *pv]
            asked += [False] * P
        seq += [*pk, *pv]
        asked += [False] * len(pk) + [True] * len(pv)
        _need(len(seq) <= seq_len + 1, "fuzzy_in_context_recall", f"seq_len={seq_len} too short for the probe")
        fill = seq_len + 1 - len(seq)
        x, y = _recall_targets([pad] * fill + seq, [False] * fill + asked, training)
        xs.append(x)
        ys.append(y)
    return np.stack(xs), np.stack(ys)


def selective_copying(n: int, *, vocab_size: int = 16, seq_len: int = 256, num_tokens_to_copy: int = 16,
                      seed: int = 0, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's selective copying: ``num_tokens_to_copy`` tokens from ``[0, vocab_size - 2)`` with blanks
    (``vocab_size - 2``) scattered before them (each blank before a token chosen uniformly, so the last token
    comes right before the copy token), the copy token (``vocab_size - 1``), then blanks at which the tokens are
    asked, in their order. No shift; ``training`` changes nothing."""
    _positive("selective_copying", n=n, vocab_size=vocab_size, seq_len=seq_len, num_tokens_to_copy=num_tokens_to_copy)
    T = num_tokens_to_copy
    _need(seq_len > 2 * T + 1, "selective_copying", f"num_tokens_to_copy={T} needs seq_len > {2 * T + 1}, got "
          f"{seq_len}")
    _need(vocab_size >= 3, "selective_copying", f"vocab_size must be >= 3 (blank and copy tokens), got {vocab_size}")
    rng = np.random.default_rng(seed)
    blank, copy = vocab_size - 2, vocab_size - 1
    B = seq_len - 2 * T - 1
    inputs = np.full((n, seq_len), blank, dtype=np.int64)
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    for i in range(n):
        tokens = rng.integers(0, blank, size=T)
        body = np.insert(tokens, rng.integers(0, T, size=B), blank)
        inputs[i, :T + B], inputs[i, T + B] = body, copy
        targets[i, T + B + 1:] = tokens
    return inputs, targets


def compression(n: int, *, vocab_size: int = 16, seq_len: int = 32, seed: int = 0,
                training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's compression: ``seq_len - 1`` uniform tokens of ``[0, vocab_size - 1)`` and the compression token
    (``vocab_size - 1``); every input token is asked, at its own position, from the last position's hidden state
    alone (the recall model's autoencoder head). No shift."""
    _positive("compression", n=n, vocab_size=vocab_size, seq_len=seq_len)
    _need(vocab_size >= 2 and seq_len >= 2, "compression", f"vocab_size and seq_len must be >= 2, got {vocab_size}, "
          f"{seq_len}")
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.integers(0, vocab_size - 1, size=(n, seq_len - 1)),
                        np.full((n, 1), vocab_size - 1)], axis=1).astype(np.int64)
    return x, x.copy()


def memorization(n: int, *, vocab_size: int = 256, seq_len: int = 32, map_seed: int = 12345, seed: int = 0,
                 training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """MAD's memorization: one fixed map of keys ``[0, (V-1)/2)`` to values ``[(V-1)/2, V-1)`` (a random
    one-to-one pairing drawn from ``map_seed``, the same for every split); ``seq_len / 2`` slots of a key
    (uniform, with replacement) and the insert token (``V - 1``), at which its value is asked. The values never
    appear in the input: they are learnt in the weights. No shift."""
    _positive("memorization", n=n, vocab_size=vocab_size, seq_len=seq_len)
    _need(seq_len % 2 == 0 and vocab_size >= 3, "memorization", f"seq_len must be even and vocab_size >= 3, got "
          f"{seq_len}, {vocab_size}")
    half = (vocab_size - 1) // 2
    mrng = np.random.default_rng(map_seed)
    keys, values = mrng.permutation(half), mrng.permutation(np.arange(half, 2 * half))
    table = np.empty(half, dtype=np.int64)
    table[keys] = values
    rng = np.random.default_rng(seed)
    k = rng.integers(0, half, size=(n, seq_len // 2))
    inputs = np.full((n, seq_len), vocab_size - 1, dtype=np.int64)
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    inputs[:, 0::2] = k
    targets[:, 1::2] = table[k]
    return inputs, targets


#: MAD's six tasks
MAD_TASKS = ("in_context_recall", "fuzzy_in_context_recall", "noisy_in_context_recall", "selective_copying",
             "compression", "memorization")

#: task name -> generator
TASKS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "mqar": mqar, **{name: globals()[name] for name in MAD_TASKS}}


def task_parameters(task: str) -> dict:
    """A task's parameters and their defaults (its generator's keywords, without ``n`` and ``seed``)."""
    sig = inspect.signature(TASKS[task])
    return {k: p.default for k, p in sig.parameters.items() if k not in ("n", "seed", "training")}


def generate(task: str, n: int, params: dict, seed: int, training: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``n`` examples of ``task`` with ``params`` (checked: unknown names and wrong types are errors); a training
    split where ``training`` (MAD's recall tasks then ask every next token)."""
    if task not in TASKS:
        close = difflib.get_close_matches(task, TASKS, n=1)
        raise AttnbenchError(f"unknown recall task {task!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                             + f" (tasks: {', '.join(TASKS)})")
    params = check_options(f"recall task {task}", params, task_parameters(task))
    return TASKS[task](n, **params, seed=seed, training=training)


__all__ = ["IGNORE", "MAD_TASKS", "TASKS", "generate", "task_parameters", "mqar", *MAD_TASKS]
