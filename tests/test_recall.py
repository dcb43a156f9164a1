"""The recall suite: its generators against the papers' definitions, its files, presets and mixers, a run whose
leaderboard picks each mixer's learning rate on validation, and the smokes of its GPU presets."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from attnbench.core.errors import AttnbenchError, DataError, UnknownNameError
from attnbench.engine.presets import PresetError
from attnbench.suites.recall import data as rdata
from attnbench.suites.recall.config import load_preset, parse_mixer, parse_mixers, preset_names
from attnbench.suites.recall.tasks import (IGNORE, TASKS, compression, fuzzy_in_context_recall, generate,
                                           in_context_recall, memorization, mqar, noisy_in_context_recall,
                                           selective_copying)


# ------------------------------------------------------------------------------------------------------- MQAR
@pytest.mark.parametrize("random_non_queries", [False, True])
def test_mqar_follows_zoology(random_non_queries):
    V, T, D = 64, 32, 5
    x, y = mqar(200, vocab_size=V, seq_len=T, num_kv_pairs=D, random_non_queries=random_non_queries, seed=3)
    assert x.shape == y.shape == (200, T)
    for xi, yi in zip(x, y):
        keys, values = xi[0:2 * D:2], xi[1:2 * D:2]
        assert len(set(keys)) == D and len(set(values)) == D           # distinct within an example
        assert keys.min() >= 1 and keys.max() < V // 2                 # keys: [1, V/2), token 0 never a key
        assert values.min() >= V // 2 and values.max() < V             # values: the other half
        assert (yi[:2 * D] == IGNORE).all()                             # nothing asked in the context
        asked = np.flatnonzero(yi != IGNORE)
        assert len(asked) == D and ((asked - 2 * D) % 2 == 0).all()     # one query per key, at even offsets
        pairs = dict(zip(keys.tolist(), values.tolist()))
        assert sorted(xi[asked].tolist()) == sorted(keys.tolist())      # every key queried once
        assert all(yi[p] == pairs[xi[p]] for p in asked)                # the target at a query is its value
        rest = np.setdiff1d(np.arange(2 * D, T), asked)
        if not random_non_queries:
            assert (xi[rest] == 0).all()                                # the value is never repeated in the input


def test_mqar_places_queries_by_its_power_law():
    T, D = 128, 8
    _, y = mqar(3000, vocab_size=256, seq_len=T, num_kv_pairs=D, seed=0)
    slots = (np.argwhere(y != IGNORE)[:, 1] - 2 * D) // 2              # slot index of each query
    counts = np.bincount(slots, minlength=(T - 2 * D) // 2)
    space = (T - 2 * D) // 2
    p = 0.01 * np.arange(1, space + 1) ** (0.01 - 1)
    p /= p.sum()
    # slot 0 is drawn first with probability p[0], and can be drawn later: at least that often, and far more often
    # than a late slot
    assert counts[0] / 3000 >= p[0] - 5 * np.sqrt(p[0] / 3000)
    assert counts[0] > 4 * counts[space // 2:].mean()


def test_generators_are_deterministic_by_seed():
    for task in TASKS:
        a, b = generate(task, 6, {}, 1, training=False), generate(task, 6, {}, 1, training=False)
        c = generate(task, 6, {}, 2, training=False)
        assert all(np.array_equal(u, v) for u, v in zip(a, b)), task
        assert not np.array_equal(a[0], c[0]), task


@pytest.mark.parametrize("params,match", [
    (dict(num_kv_pairs=20, seq_len=64), "num_kv_pairs=20 needs seq_len >= 80"),
    (dict(seq_len=63, vocab_size=256), "seq_len must be even"),
    (dict(vocab_size=32, seq_len=64), "vocab_size must exceed seq_len"),
    (dict(pairs=3), "recall task mqar got unknown option\\(s\\) 'pairs'"),
    (dict(num_kv_pairs=4.0), "recall task mqar: option num_kv_pairs=4.0 must be a int"),
])
def test_bad_mqar_parameters_are_one_line_errors(params, match):
    with pytest.raises(AttnbenchError, match=match) as e:
        generate("mqar", 4, params, 0)
    assert "\n" not in str(e.value)


def test_an_unknown_task_names_the_tasks():
    with pytest.raises(AttnbenchError, match="unknown recall task 'mqr'; did you mean 'mqar'"):
        generate("mqr", 2, {}, 0)


# -------------------------------------------------------------------------------------------------------- MAD
def _kv_consistent(x, y, key_of):
    """Every asked value equals the next input token of the sequence (the targets are the shifted sequence)."""
    asked = np.flatnonzero(y != IGNORE)
    assert (y[asked[:-1]] == x[asked[:-1] + 1]).all()
    return asked


def test_in_context_recall_asks_the_values_of_keys_seen_before():
    x, y = in_context_recall(50, vocab_size=16, seq_len=64, seed=0, training=False)
    xt, yt = in_context_recall(50, vocab_size=16, seq_len=64, seed=0, training=True)
    assert x.shape == (50, 63) and np.array_equal(x, xt)
    assert np.array_equal(yt[:, :-1], xt[:, 1:])                       # training: every next token
    for xi, yi in zip(x, y):
        seq = np.append(xi, yi[-1])                                     # the whole sequence
        keys, values = seq[0::2], seq[1::2]
        assert (keys < 8).all() and (values >= 8).all()                 # keys [0, 8), values [8, 16)
        table = {}
        for j, (k, v) in enumerate(zip(keys, values)):
            asked = yi[2 * j] != IGNORE                                 # the target at key position 2j is the value
            assert asked == (k in table) or j == len(keys) - 1
            if k in table:
                assert v == table[k]                                    # a key's value never changes
            table[k] = v
        assert yi[-1] == table[keys[-1]] and keys[-1] in dict(zip(keys[:-1], values[:-1]))  # the probe was shown


def test_noisy_recall_never_asks_noise():
    x, y = noisy_in_context_recall(40, seed=0, training=False)
    seq = np.concatenate([x, y[:, -1:]], axis=1)
    assert (seq[seq >= 16] >= 16).all() and (seq >= 16).mean() > 0.1    # noise tokens [16, 32) appear
    asked = y != IGNORE
    assert (y[asked] < 16).all() and (y[asked] >= 8).all()


def test_fuzzy_recall_asks_value_motifs_of_keys_seen_before():
    x, y = fuzzy_in_context_recall(40, vocab_size=16, seq_len=128, seed=1, training=False)
    assert x.shape == (40, 128)
    pad = 15
    for xi, yi in zip(x, y):
        body = xi[xi != pad]
        assert (xi[:len(xi) - len(body)] == pad).all()                  # left-padded
        assert yi[-1] != IGNORE                                         # the probe's value is asked
        asked = yi[yi != IGNORE]
        assert (asked >= 7).all() and (asked < 15).all()                # value tokens only


def test_selective_copying_asks_the_tokens_in_order():
    x, y = selective_copying(30, vocab_size=16, seq_len=64, num_tokens_to_copy=8, seed=0)
    blank, copy = 14, 15
    for xi, yi in zip(x, y):
        at = int(np.flatnonzero(xi == copy)[0])
        assert at == 64 - 8 - 1 and xi[at - 1] != blank                 # the last token right before the copy token
        tokens = xi[:at][xi[:at] != blank]
        assert np.array_equal(yi[at + 1:], tokens) and (yi[:at + 1] == IGNORE).all()
        assert (xi[at + 1:] == blank).all()
    with pytest.raises(AttnbenchError, match="num_tokens_to_copy=40 needs seq_len > 81"):
        selective_copying(2, seq_len=64, num_tokens_to_copy=40)


def test_compression_asks_every_token_and_memorization_keeps_one_map():
    x, y = compression(5, vocab_size=16, seq_len=32, seed=0)
    assert (x[:, -1] == 15).all() and np.array_equal(x, y) and (x[:, :-1] < 15).all()
    a, ya = memorization(200, vocab_size=64, seq_len=16, seed=0)
    b, yb = memorization(200, vocab_size=64, seq_len=16, seed=5)
    table = {}
    for xs, ys in ((a, ya), (b, yb)):
        assert (xs[:, 1::2] == 63).all() and (ys[:, 0::2] == IGNORE).all()
        for k, v in zip(xs[:, 0::2].ravel(), ys[:, 1::2].ravel()):
            assert table.setdefault(k, v) == v                          # one map, across splits
        assert not np.isin(ys[:, 1::2], xs).any()                       # the values are never in the input
    assert len(set(table.values())) == len(table)                       # one-to-one


# ------------------------------------------------------------------------------------------------------ files
def test_point_files_are_written_once_and_read_back(tmp_path):
    sizes = {"train": 6, "val": 3, "test": 4}
    d = rdata.ensure(tmp_path, "mqar", {"vocab_size": 128, "seq_len": 32, "num_kv_pairs": 4}, sizes, 7)
    assert sorted(p.name for p in d.iterdir()) == ["COMPLETE", "params.json", "test.npz", "train.npz", "val.npz"]
    assert json.loads((d / "params.json").read_text())["seed"] == 7
    test = rdata.load_split(d, "test", 128)
    assert len(test) == 4 and test.answers == 16
    with np.load(d / "test.npz") as f:                                  # the documented format, readable anywhere
        x, y = generate("mqar", 4, {"vocab_size": 128, "seq_len": 32, "num_kv_pairs": 4}, 9, training=False)
        assert np.array_equal(f["inputs"], x) and np.array_equal(f["targets"], y)
    stamp = (d / "train.npz").stat().st_mtime_ns
    assert rdata.ensure(tmp_path, "mqar", {"vocab_size": 128, "seq_len": 32, "num_kv_pairs": 4}, sizes, 7) == d
    assert (d / "train.npz").stat().st_mtime_ns == stamp                # not regenerated
    with pytest.raises(DataError, match="outside the vocabulary"):
        rdata.load_split(d, "test", 64)
    (d / "val.npz").write_bytes(b"not an archive")
    with pytest.raises(DataError, match="val.npz: not a recall split"):
        rdata.load_split(d, "val", 128)


# ---------------------------------------------------------------------------------------------- presets, mixers
def test_presets_load_and_their_points():
    assert preset_names() == ["mad", "tiny", "zoology"]
    tiny = load_preset("tiny")
    assert [p.label for p in tiny.points()] == ["mqar"]
    labels = [p.label for p in tiny.points(sweep=True)]
    assert labels[:3] == ["mqar d=32", "mqar", "mqar d=128"] and "mqar num_kv_pairs=8 d=128" in labels
    assert len(labels) == 9
    mad = load_preset("mad")
    pts = mad.points(sweep=True)
    assert {p.task for p in mad.points()} == {"in_context_recall", "fuzzy_in_context_recall",
                                               "noisy_in_context_recall", "selective_copying", "compression",
                                               "memorization"}
    memo = next(p for p in mad.points() if p.task == "memorization")
    assert memo.n_train == 256 and mad.sizes(memo)["train"] == 256
    assert mad.steps(memo) == 400 and tiny.steps(tiny.points()[0]) == 1500     # 200 epochs at batch 128; fixed
    # the identity of the committed results' cells (results/recall/): a change here orphans them
    assert tiny.identity_hash() == "b5dad72c8b275d3b"
    assert any(p.label == "in_context_recall n_train=800" and p.n_train == 800 for p in pts)
    zoo = load_preset("zoology")
    assert [p.params["seq_len"] for p in zoo.points(sweep=True) if p.hidden == 64] == [64, 128, 256, 512]


def test_a_point_of_the_grid_runs_alone_as_the_same_cells():
    """``--point``: one point of the sweep's grid, whose cells are the ones ``--sweep`` runs there (the same
    identities, so either run finds the other's cells finished); a label not in the grid is a one-line error."""
    from attnbench.suites.recall.train import plan_cells

    tiny, mixers = load_preset("tiny"), parse_mixers("softmax,nala")
    grid = plan_cells(tiny, mixers, tiny.points(sweep=True), seeds=[0, 1], device="cpu")
    alone = plan_cells(tiny, mixers, tiny.points(only=["mqar d=32"]), seeds=[0, 1], device="cpu")
    assert len(alone) == 8 and {c.task for c in alone} == {"mqar d=32"}
    assert {c.config_hash for c in alone} == {c.config_hash for c in grid if c.task == "mqar d=32"}
    assert [p.label for p in tiny.points(only=["mqar", "mqar d=32"])] == ["mqar d=32", "mqar"]  # the grid's order
    with pytest.raises(AttnbenchError, match=r"^--point 'mqar d=33' is not a point of preset tiny: expected one of "
                                             r"'mqar d=32', 'mqar', "):
        tiny.points(only=["mqar d=33"])


def _tiny_text() -> str:
    from importlib import resources

    return (resources.files("attnbench.suites.recall") / "presets" / "tiny.toml").read_text()


def test_a_preset_asking_the_impossible_names_the_point(tmp_path):
    text = _tiny_text()
    bad = tmp_path / "bad.toml"
    for old, new, match in (
            ("sweep = [{ num_kv_pairs = 4 }, { num_kv_pairs = 8 }]", "sweep = [{ num_kv_pairs = 40 }]",
             r"bad.toml: \[\[tasks\]\] #1 sweep #1: recall task mqar: num_kv_pairs=40 needs seq_len >= 160"),
            ("num_kv_pairs = 16\n", "num_kv_pair = 16\n", "unknown key 'num_kv_pair'.*did you mean 'num_kv_pairs'"),
            ("hidden = 64", 'hidden = "64"', r"\[model\]: key 'hidden': expected int, got '64'"),
            ("learning_rates = [1e-3, 3e-3]", "learning_rates = [1e-3, 0]",
             r"learning_rates must be a non-empty list of positive rates, got \[0.001, 0.0\]")):
        assert old in text
        bad.write_text(text.replace(old, new))
        with pytest.raises(PresetError, match=match) as e:
            load_preset(str(bad))
        assert "\n" not in str(e.value)


def test_mixers_are_registry_attentions_or_lm_mixers():
    m = parse_mixer("nala:lam=2")
    assert m.label == "nala:lam=2.0" and m.variant.layer == "transformer" and m.variant.map.name == "nala"
    assert parse_mixer("deltanet+nala").variant.feature_map == "nala"
    assert parse_mixer("softmax").label == "softmax"
    na = parse_mixer("laplacian")
    assert na.variant is None and "no causal form" in na.not_applicable
    with pytest.raises(UnknownNameError, match="'nalla'.*nala.*deltanet"):
        parse_mixer("nalla")
    with pytest.raises(AttnbenchError, match="given twice"):
        parse_mixers("softmax,softmax")


def test_state_sizes_per_layer():
    pre = load_preset("tiny")
    point = pre.points()[0]
    from attnbench.suites.recall.model import build_model

    def state(text):
        cfg = pre.model_config(parse_mixer(text), point)
        mixer = build_model(cfg, point.task).blocks[0].attn
        return mixer.state_size(), getattr(mixer, "state_grows", False)

    d = 64
    assert state("softmax") == (2 * d, True)                            # the KV cache, per token
    assert state("linear") == (d * d + d, False)                        # S and z
    assert state("nala") == (2 * d * d + 2 * d, False)                  # features of 2d
    assert state("deltanet") == (d * d, False)
    assert state("deltanet+nala") == (2 * d * d, False)
    assert state("relu_quadratic") == (2 * d, True)


def test_the_compression_model_decodes_every_position_from_the_last():
    from attnbench.models.lm import LMConfig
    from attnbench.suites.recall.model import build_model

    cfg = LMConfig(layer="transformer", vocab_size=16, hidden=32, layers=2, heads=2, head_dim=16, hidden_ratio=0)
    torch.manual_seed(0)
    model = build_model(cfg, "compression")
    x = torch.randint(0, 15, (3, 12))
    out = model(x)
    assert out.shape == (3, 12, 16)
    y = x.clone()
    y[:, :5] = (y[:, :5] + 1) % 15                                      # earlier tokens change the code
    assert not torch.allclose(model(y), out)


# ---------------------------------------------------------------------------------------------------- the run
def _small(tmp_path, lrs="[1e-3, 3e-2]"):
    text = _tiny_text()
    for a, b in (("n_train = 16000", "n_train = 64"), ("n_val = 250", "n_val = 16"), ("n_test = 1000", "n_test = 16"),
                 ("steps = 1500", "steps = 6"), ("batch_size = 32", "batch_size = 8"), ("eval_every = 250",
                 "eval_every = 3"), ("hidden = 64", "hidden = 16"), ("seq_len = 64", "seq_len = 32"),
                 ("num_kv_pairs = 16\n", "num_kv_pairs = 4\n"), ("vocab_size = 256", "vocab_size = 64"),
                 ("{ num_kv_pairs = 4 }, { num_kv_pairs = 8 }", "{ num_kv_pairs = 2 }, { num_kv_pairs = 8 }")):
        assert a in text, a
        text = text.replace(a, b)
    text = text.replace("learning_rates = [1e-3, 3e-3]", f"learning_rates = {lrs}").replace('name = "tiny"',
                                                                                            'name = "small"')
    p = tmp_path / "small.toml"
    p.write_text(text)
    return str(p)


def test_the_loss_over_the_asked_rows_has_cross_entropy_with_ignore_indexs_gradient_to_the_bit():
    """masked_loss takes the asked rows before the log-softmax: the logits' gradient to the bit, and the loss to
    float32 rounding, of ``cross_entropy(..., ignore_index)`` over every position (what the committed records
    were trained with), so training follows the same weights step by step."""
    import torch.nn.functional as F

    from attnbench.suites.recall.train import masked_loss

    g = torch.Generator().manual_seed(0)
    for B, T, V, p in ((32, 64, 256, 0.25), (3, 17, 11, 0.6), (2, 5, 7, 1.0)):
        logits = torch.randn(B, T, V, generator=g) * 3
        y = torch.randint(0, V, (B, T), generator=g)
        y[torch.rand(B, T, generator=g) >= p] = IGNORE
        a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        mine = masked_loss(a, y)
        ref = F.cross_entropy(b.reshape(-1, V), y.reshape(-1), ignore_index=IGNORE)
        mine.backward()
        ref.backward()
        assert torch.equal(a.grad, b.grad), (B, T, V)
        assert abs(mine.item() - ref.item()) <= 4 * torch.finfo(torch.float32).eps * abs(ref.item()), (B, T, V)


def test_a_run_records_each_rate_and_the_table_shows_each_mixers_best(tmp_path):
    from attnbench.results.store import Store
    from attnbench.suites.recall.leaderboard import measured_tables, plot_recall
    from attnbench.suites.recall.train import run_recall
    from attnbench.views.sources import Source

    db = str(tmp_path / "r.db")
    s = run_recall(mixers=parse_mixers("softmax,deltanet,laplacian"), preset=_small(tmp_path), db=db,
                   out=str(tmp_path / "w"), seeds=[0, 1], progress=False)
    assert s.exit_code() == 0
    assert sorted(o.status for o in s.outcomes) == ["ok"] * 8 + ["skipped"]
    with Store(db) as st:
        recs = st.measurements(suite="recall")
    assert len(recs) == 8 and {r.params["lr"] for r in recs} == {1e-3, 3e-2}
    assert {r.attention: r.impl for r in recs} == {"softmax": "sdpa", "deltanet": "torch"}
    for r in recs:
        m = r.metrics
        assert m["n_test"] == 16 * 4 and 0 <= m["score"] <= 100 and m["state_per_layer"] > 0
    # the leaderboard: each seed at the rate with its best validation accuracy
    (title, header, rows, cap), = measured_tables(recs, "test")
    for row in rows:
        mine = [r for r in recs if r.attention == row[0]]
        picked = [max((r for r in mine if r.seed == s), key=lambda r: (r.metrics["best_val_acc"], r.params["lr"]))
                  for s in (0, 1)]
        assert row[1].startswith(f"{np.mean([r.metrics['score'] for r in picked]):.2f}")
        lrs = sorted({f"{r.params['lr']:.0e}" for r in picked})
        assert sorted(part.split(" ×")[0] for part in row[2].split(" · ")) == lrs, row[2]
    assert "pairs separated" in cap or "no pair" in cap
    assert "Not applicable (no causal form" in cap and "laplacian" in cap
    # records of another difficulty under the same task label (a preset's default changed) are a table of their own
    other = [dataclasses.replace(r, config_hash="other" + r.config_hash, params={
        **r.params, "task_params": {**r.params["task_params"], "num_kv_pairs": 2}}) for r in recs]
    assert [len(t[2]) for t in measured_tables(recs + other, "test")] == [2, 2]
    paths = plot_recall(Source("test", recs), tmp_path / "fig")
    assert len(paths) == 1 and paths[0].stat().st_size > 1000


def test_each_seed_is_scored_at_the_rate_its_validation_picks():
    from attnbench.suites.recall.rates import best_rates

    assert best_rates({1e-3: {0: 0.9, 1: 0.2}, 3e-3: {0: 0.8, 1: 0.95}}) == {0: 1e-3, 1: 3e-3}
    assert best_rates({1e-3: {0: 0.7}, 3e-3: {0: 0.7}}) == {0: 3e-3}                  # a tie: the higher rate
    # seeds 1 and 2 trained at 3e-3 only: their sweep has not finished, they get no rate
    assert best_rates({1e-3: {0: 0.9}, 3e-3: {0: 0.8, 1: 1.0, 2: 1.0}}) == {0: 1e-3}
    assert best_rates({1e-3: {}, 3e-3: {0: 0.1}}) == {} and best_rates({}) == {}


def _planted(mixer, seed, lr, val, score):
    from attnbench.results.records import Measurement

    return Measurement(suite="recall", setting="recall/small", task="mqar", attention=mixer, impl="torch",
                       config_hash=f"{mixer}-{seed}-{lr}", params={"seed": seed, "lr": lr, "task_params": {},
                                                                  "hidden": 16, "n_train": 64, "steps": 6},
                       dtype="float32", device="cpu", seed=seed, status="ok",
                       metrics={"score": score, "best_val_acc": val, "n_test": 4000, "state_per_layer": 256})


def test_the_table_scores_each_seed_at_its_rate_and_leaves_out_unfinished_sweeps():
    from attnbench.suites.recall.leaderboard import measured_tables

    recs = [_planted("linear", 0, 1e-3, 0.9, 90.0), _planted("linear", 0, 3e-3, 0.1, 10.0),     # seed 0: 1e-3
            _planted("linear", 1, 1e-3, 0.2, 20.0), _planted("linear", 1, 3e-3, 0.8, 80.0),     # seed 1: 3e-3
            _planted("linear", 2, 1e-3, 0.99, 99.0),                                             # seed 2: 1 of 2
            _planted("softmax", 0, 1e-3, 1.0, 100.0), _planted("softmax", 1, 3e-3, 1.0, 100.0)]  # none finished
    (_, _, rows, cap), = measured_tables(recs, "test")
    row = {r[0]: r for r in rows}
    assert row["linear"][1].startswith("85.00") and row["linear"][2] == "3e-03 ×1 · 1e-03 ×1"
    assert row["linear"][3] == "1e-03: 55.0 · 3e-03: 45.0"                 # each rate's mean over seeds 0 and 1
    assert row["softmax"][1] == "sweep unfinished"
    assert "Left out until they have trained at every rate: linear (seed 2), softmax (seed 0,1)." in cap


def test_the_ordering_across_seeds_reads_the_seeds_every_row_has():
    """A planned run gives some rows more seeds: the rows' ordering is compared over the seeds all rows share, every
    row kept (a seed only some rows have orders only them); with fewer shared, over the rows that have every seed."""
    from attnbench.suites.recall.leaderboard import order_stability

    def rows(seeds_of):
        return {m: [_planted(m, s, 1e-3, 0.5, score) for s, score in seeds.items()] for m, seeds in seeds_of.items()}

    alike = {"a": {0: 90.0, 1: 91.0}, "b": {0: 80.0, 1: 81.0}, "c": {0: 70.0, 1: 71.0}}
    assert order_stability(rows(alike)) == (" Ordering across seeds: mean Kendall τ 1.00 between the 2 seeds' "
                                            "orderings of the 3 rows (1: the same order).")
    more = {**alike, "a": {**alike["a"], 2: 10.0, 3: 95.0}, "b": {**alike["b"], 2: 99.0, 3: 5.0}}
    assert order_stability(rows(more)) == (" Ordering across seeds: mean Kendall τ 1.00 between the 2 seeds' "
                                           "orderings of the 3 rows (the seeds every row has; 1: the same order).")
    # under two seeds shared: the rows that have every seed (here none of the four), so no ordering is claimed
    assert order_stability(rows({**alike, "d": {5: 1.0}})) == ""
    assert order_stability(rows({**alike, "d": {0: 1.0, 1: 2.0, 5: 3.0}})).endswith("orderings of the 4 rows (the "
                                                                                 "seeds every row has; 1: the same "
                                                                                 "order).")


def test_a_bad_width_is_refused_before_any_data(tmp_path):
    from attnbench.suites.recall.train import run_recall

    p = _small(tmp_path)
    text = open(p).read().replace("heads = 1", "heads = 3")
    open(p, "w").write(text)
    with pytest.raises(AttnbenchError, match="--attn softmax at mqar: recall: width 16 does not split into 3 heads"):
        run_recall(mixers=parse_mixers("softmax"), preset=p, db=str(tmp_path / "x.db"), out=str(tmp_path / "w"),
                   progress=False)
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").rglob("*.npz"))


@pytest.mark.parametrize("preset,attn", [("zoology", "softmax"), ("mad", "gated_deltanet+nala")])
def test_gpu_presets_smoke_on_the_cpu(preset, attn, tmp_path, capsys):
    from attnbench.suites.recall.smoke import run_smoke

    code = run_smoke(load_preset(preset), parse_mixers(attn), db=str(tmp_path / "s.db"), out=str(tmp_path / "w"))
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("full run:") == len(load_preset(preset).points()) * len(attn.split(","))


@pytest.mark.parametrize("layer,extra", [("transformer", {"attention": "nala"}), ("deltanet", {}), ("mamba", {})])
def test_the_block_convolution_carries_its_window_token_by_token(layer, extra):
    """``LMConfig.block_conv`` (the short convolution before every mixer): a sequence fed token by token through the
    caches equals one forward pass over it, in float64."""
    from attnbench.models.lm import LMConfig, build_lm

    cfg = LMConfig(layer=layer, vocab_size=50, hidden=32, layers=2, heads=2, head_dim=16, block_conv=3, **extra)
    torch.manual_seed(0)
    model = build_lm(cfg).double()
    ids = torch.randint(0, 50, (2, 9))
    full, caches, steps = model(ids), model.init_caches(), []
    for t in range(ids.shape[1]):
        out, caches = model(ids[:, t:t + 1], caches=caches)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-12)
    assert all("block_conv" in c for c in caches)
