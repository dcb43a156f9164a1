"""The LM suite: the DeltaNet / Gated DeltaNet model against its token-by-token recurrence (forward and
gradients, SiLU and NaLa maps), the 340M configs' parameter counts against an independent count, the tiny
preset learning its corpus, resume after a kill, two gloo processes, and one-line errors."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch
from rich.console import Console

from attnbench.core.errors import AttnbenchError
from attnbench.engine.train.trainer import TrainHooks
from attnbench.models.lm import LMConfig, build_lm
from attnbench.results.store import Store
from attnbench.suites.lm.config import load_preset, parse_variants
from attnbench.suites.lm.data import DataConfig, DataError, load_corpus
from attnbench.suites.lm.train import run_lm

QUIET = Console(file=open(os.devnull, "w"), width=200)
VARIANTS = ("deltanet", "deltanet+nala", "gated_deltanet", "gated_deltanet+nala")


def tiny_cfg(variant: str, **kw) -> LMConfig:
    (v,) = parse_variants(variant)
    gated = v.layer == "gated_deltanet"
    base = dict(vocab_size=61, hidden=24, layers=2, heads=2, head_dim=8, expand_v=2.0 if gated else 1.0,
                use_gate=gated, chunk_size=4)
    base.update(dict(v.model_options))
    base.update(kw)
    return LMConfig(layer=v.layer, feature_map=v.feature_map, feature_options=dict(v.map_options), **base)


# --- the model against its recurrence ---------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS + ("gated_deltanet+nala:qk_norm=k:key_width=match",
                                                "deltanet+nala:sign_split=true:use_short_conv=false"))
def test_forward_equals_the_token_by_token_recurrence(variant):
    torch.manual_seed(0)
    model = build_lm(tiny_cfg(variant)).double()
    ids = torch.randint(0, 61, (2, 13))                     # 13: not a multiple of the chunk (4)
    full = model(ids)                                        # the exact chunked form
    caches, steps = model.init_caches(), []
    for t in range(ids.shape[1]):
        logits, caches = model(ids[:, t:t + 1], caches=caches, impl="recurrent")
        steps.append(logits)
    err = (full - torch.cat(steps, 1)).abs().max().item()
    assert err < 1e-10, f"{variant}: chunked forward differs from the recurrence by {err:.3g}"
    # a sequence fed in two pieces with the cache equals it fed at once (conv window and state carried)
    caches = model.init_caches()
    a, caches = model(ids[:, :6], caches=caches)
    b, _ = model(ids[:, 6:], caches=caches)
    assert (torch.cat([a, b], 1) - full).abs().max().item() < 1e-10


@pytest.mark.parametrize("variant", VARIANTS)
def test_gradients_of_the_chunked_form_equal_the_recurrences(variant):
    torch.manual_seed(1)
    model = build_lm(tiny_cfg(variant)).double()
    ids = torch.randint(0, 61, (2, 11))
    grads = []
    for impl in ("torch", "recurrent"):
        model.zero_grad()
        logits = model(ids[:, :-1], impl=impl)
        torch.nn.functional.cross_entropy(logits.reshape(-1, 61), ids[:, 1:].reshape(-1)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        err = (g - grads[1][name]).abs().max().item()
        assert err < 1e-10 * (1 + g.abs().max().item()), f"{variant}: grad of {name} differs by {err:.3g}"


def test_nala_doubles_the_state_or_matches_it_by_option():
    double = build_lm(tiny_cfg("deltanet+nala")).blocks[0].attn
    match = build_lm(tiny_cfg("deltanet+nala:key_width=match")).blocks[0].attn
    silu = build_lm(tiny_cfg("deltanet")).blocks[0].attn
    assert double.key_dim == 2 * silu.key_dim and match.key_dim == silu.key_dim
    assert double.q_proj.weight.shape == silu.q_proj.weight.shape
    assert match.q_proj.weight.shape[0] == silu.q_proj.weight.shape[0] // 2


def test_keys_are_unit_norm_for_the_delta_rule_unless_turned_off():
    torch.manual_seed(0)
    seen = {}
    for norm in ("l2", "none"):
        m = build_lm(tiny_cfg("deltanet+nala", qk_norm=norm)).double()
        import attnbench.ops.delta as delta

        orig = delta.delta_rule

        def spy(q, k, *a, **kw):
            seen[norm] = k.norm(dim=-1)
            return orig(q, k, *a, **kw)

        delta.delta_rule = spy
        try:
            m(torch.randint(0, 61, (1, 9)))
        finally:
            delta.delta_rule = orig
    assert torch.allclose(seen["l2"], torch.ones_like(seen["l2"]), atol=1e-3)  # eps 1e-12 under tiny norms
    assert not torch.allclose(seen["none"], torch.ones_like(seen["none"]), atol=1e-2)


# --- the 340M configs ---------------------------------------------------------------------------------------
def independent_count(layer: str, V=32000, C=1024, L=24, H=8, d=128, ev=1.0, gate=False, K=4, ratio=4) -> int:
    """Parameters of flame's config counted from the layer definitions (field.md §1.1, §1.4), not the model."""
    dv = int(d * ev)
    inter = int(C * ratio * 2 / 3)
    inter = 256 * ((inter + 255) // 256)
    mixer = C * H * d * 2 + C * H * dv + C * H                 # q, k, v, b projections
    mixer += (H * d * 2 + H * dv) * K                          # depthwise short convolutions (no bias)
    mixer += dv + H * dv * C                                   # per-head output RMSNorm, o_proj
    if layer == "gated_deltanet":
        mixer += C * H + 2 * H                                 # a_proj, A_log, dt_bias
    if gate:
        mixer += C * H * dv                                    # g_proj
    block = mixer + 3 * C * inter + 2 * C                      # SwiGLU, two RMSNorms
    return V * C + L * block + C + C * V                       # embedding, blocks, final norm, untied head


def test_the_340m_configs_instantiate_on_meta_with_their_true_parameter_counts():
    pre = load_preset("340m")
    dn = build_lm(pre.model_config(parse_variants("deltanet")[0], 32000), "meta")
    gdn = build_lm(pre.model_config(parse_variants("gated_deltanet")[0], 32000), "meta")
    assert next(dn.parameters()).device.type == "meta"
    assert dn.num_params() == independent_count("deltanet") == 374_362_112
    assert gdn.num_params() == independent_count("gated_deltanet", L=21, H=6, d=256, ev=2.0, gate=True) == 512_272_124
    # NaLa with key_width=double keeps the parameter count; match shrinks the q/k projections
    dn_nala = build_lm(pre.model_config(parse_variants("deltanet+nala")[0], 32000), "meta")
    dn_match = build_lm(pre.model_config(parse_variants("deltanet+nala:key_width=match")[0], 32000), "meta")
    assert dn_nala.num_params() == dn.num_params()
    assert dn.num_params() - dn_match.num_params() == 24 * (2 * 1024 * 8 * 64 + 2 * 8 * 64 * 4)


# --- training ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_preset(tmp_path_factory):
    """The tiny preset cut down: 0.6 MB of stdlib source, BPE 512, 64-token windows, 160 steps."""
    pre = load_preset("tiny")
    data = dataclasses.replace(pre.data, max_train_bytes=600_000, max_eval_bytes=40_000, vocab_size=512, seq_len=64,
                               eval_windows=16)
    train = dataclasses.replace(pre.train, steps=160, batch_size=8, warmup=10, eval_every=40)
    model = {**pre.model, "hidden": 64}
    layers = {"deltanet": {**pre.layers["deltanet"], "heads": 2, "head_dim": 32},
              "gated_deltanet": {**pre.layers["gated_deltanet"], "heads": 2, "head_dim": 48}}
    return dataclasses.replace(pre, data=data, train=train, model=model, layers=layers,
                               eval=dataclasses.replace(pre.eval, tasks=[]))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("lmwork")


def records(db, task="pretrain"):
    with Store(db) as s:
        return s.measurements(suite="lm", task=task)


def test_a_tiny_model_learns_its_corpus_well_below_the_unigram_entropy(small_preset, work):
    s = run_lm(variants=parse_variants("gated_deltanet+nala"), preset=small_preset, db=str(work / "a.db"),
               out=str(work), console=QUIET, progress=False)
    assert s.exit_code() == 0, s.line()
    (r,) = records(work / "a.db")
    m = r.metrics
    assert m["test_loss"] < m["unigram_entropy"] - 1.0, (m["test_loss"], m["unigram_entropy"])
    assert m["first_loss"] == pytest.approx(math.log(m["vocab_size"]), abs=0.3)  # starts at chance
    assert m["test_ppl"] == pytest.approx(math.exp(m["test_loss"]))
    assert 0 < m["test_bits_per_byte"] < 8
    from attnbench.suites.lm.artifact import load_lm

    loaded = load_lm(m["checkpoint"])
    assert loaded.meta["variant"] == "gated_deltanet+nala" and loaded.max_length == 64
    ids = torch.tensor([loaded.tokenizer.encode("def f(x):\n    return x\n").ids])
    assert loaded.model(ids).shape == (1, ids.shape[1], loaded.tokenizer.get_vocab_size())


def test_run_lm_scores_its_checkpoints_with_lm_eval_and_the_table_joins_them(small_preset, work):
    pre = dataclasses.replace(small_preset, eval=dataclasses.replace(
        small_preset.eval, tasks=["attnbench_heldout", "attnbench_cloze"], limit=8))
    # the same cell as the learning test (eval settings are not part of a cell's identity): trained there or here
    s = run_lm(variants=parse_variants("gated_deltanet+nala"), preset=pre, db=str(work / "a.db"), out=str(work),
               console=QUIET, progress=False)
    assert s.exit_code() == 0, s.line()
    (e,) = records(work / "a.db", task="lm-eval")
    scores = e.metrics["lm_eval"]
    assert e.attention == "gated_deltanet+nala" and e.setting == "lm/tiny"
    assert 0 < scores["attnbench_heldout"]["bits_per_byte"] < 8
    assert 0 <= scores["attnbench_cloze"]["acc"] <= 1
    import io

    from attnbench.views.tables import table

    buf = io.StringIO()
    table("lm", db=str(work / "a.db"), setting="lm/tiny", fmt="markdown", committed=False,
          console=Console(file=buf, width=300))
    text = buf.getvalue()
    row = next(line for line in text.splitlines() if line.startswith("| gated_deltanet+nala |"))
    assert f"{scores['attnbench_heldout']['bits_per_byte']:.3f}" in row


class Killed(BaseException):  # not an Exception: the sweep records those and goes on
    pass


def test_resume_after_a_kill_continues_bit_exactly(small_preset, work):
    pre = dataclasses.replace(small_preset, train=dataclasses.replace(small_preset.train, steps=12, eval_every=6,
                                                                      checkpoint_every=4))
    v = parse_variants("deltanet+nala")
    ref = run_lm(variants=v, preset=pre, db=str(work / "ref.db"), out=str(work / "ref"), console=QUIET,
                 progress=False).outcomes[0]

    def kill(attn):
        def hook(step, loss):
            if step == 10:
                raise Killed

        return TrainHooks(after_step=hook)

    with pytest.raises(Killed):
        run_lm(variants=v, preset=pre, db=str(work / "k.db"), out=str(work / "k"), console=QUIET, progress=False,
               hooks=kill)
    resumed = run_lm(variants=v, preset=pre, db=str(work / "k.db"), out=str(work / "k"), console=QUIET,
                     progress=False).outcomes[0]
    assert resumed.metrics["resumed_from"] == 8
    for key in ("test_loss", "val_loss", "best_val_loss", "best_step"):
        assert resumed.metrics[key] == ref.metrics[key], key
    a = torch.load(os.path.join(ref.metrics["checkpoint"], "model.pt"))
    b = torch.load(os.path.join(resumed.metrics["checkpoint"], "model.pt"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_diverging_run_stops_with_one_line(small_preset, work):
    pre = dataclasses.replace(small_preset, train=dataclasses.replace(small_preset.train, steps=6, warmup=2,
                                                                      eval_every=6))

    def blow_up(attn):
        return TrainHooks(transform_loss=lambda step, loss: loss * (10.0 if step >= 3 else 1.0))

    s = run_lm(variants=parse_variants("deltanet"), preset=pre, db=str(work / "div.db"), out=str(work / "div"),
               console=QUIET, progress=False, hooks=blow_up)
    (o,) = s.outcomes
    assert s.exit_code() == 1 and o.result.status == "failed"
    assert "diverged" in o.result.error and "\n" not in o.result.error


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")
def test_two_gloo_processes_match_one(tmp_path, small_preset, work):
    toml = tmp_path / "p.toml"
    from importlib import resources

    text = (resources.files("attnbench.suites.lm") / "presets" / "tiny.toml").read_text()
    for a, b in (("steps = 300", "steps = 6"), ("warmup = 30", "warmup = 2"), ("eval_every = 100", "eval_every = 3"),
                 ("max_train_bytes = 4_000_000", "max_train_bytes = 600_000"),
                 ("vocab_size = 2048", "vocab_size = 512"),
                 ("max_eval_bytes = 300_000", "max_eval_bytes = 40_000"), ("seq_len = 128", "seq_len = 64"),
                 ('tasks = ["attnbench_heldout", "attnbench_cloze"]', "tasks = []")):
        assert a in text, a
        text = text.replace(a, b)
    toml.write_text(text)
    # the one-process run here (a process start less), then torchrun's; one corpus cache for both
    one = run_lm(variants=parse_variants("deltanet"), preset=load_preset(toml), db=str(tmp_path / "one.db"),
                 out=str(work / "dist"), console=QUIET, progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    two = subprocess.run([sys.executable, "-m", "attnbench.cli.main", "run", "lm", "--attn", "deltanet", "--preset",
                          str(toml), "--out", str(work / "dist"), "--db", str(tmp_path / "two.db"), "--nproc", "2"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert one.exit_code() == 0 and two.returncode == 0, one.line() + two.stdout[-3000:] + two.stderr[-3000:]
    (a,), (b,) = records(tmp_path / "one.db"), records(tmp_path / "two.db")
    assert b.metrics["world_size"] == 2 and a.config_hash == b.config_hash
    assert b.metrics["best_step"] == a.metrics["best_step"]
    assert b.metrics["test_loss"] == pytest.approx(a.metrics["test_loss"], rel=1e-4)


# --- bad input ---------------------------------------------------------------------------------------------
def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "attnbench.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})


def test_bad_variants_and_presets_fail_in_one_line_before_any_data():
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    def run(*args):  # in this process: the same command, without a torch import per call
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})

    for attn, needle in (("deltanett", "did you mean 'deltanet'"), ("deltanet+nalla", "did you mean 'nala'"),
                         ("gated_deltanet:qk_nrm=k", "did you mean 'qk_norm'"),
                         ("deltanet:qk_norm=sideways", "qk_norm must be one of")):
        r = run("run", "lm", "--attn", attn, "--no-eval", "--db", os.devnull)
        assert r.exit_code == 2 and needle in r.output, (attn, r.output)
        assert "Traceback" not in r.output
    if not torch.cuda.is_available():
        r = run("run", "lm", "--preset", "340m", "--attn", "deltanet")
        assert r.exit_code == 2 and "--smoke" in r.output and "Traceback" not in r.output


def test_damaged_or_missing_corpus_files_are_named(tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": broken\n')
    with pytest.raises(DataError, match="c.jsonl"):
        load_corpus(DataConfig(source="files", path=str(bad)), tmp_path / "cache")
    with pytest.raises(DataError, match="no such file"):
        load_corpus(DataConfig(source="files", path=str(tmp_path / "nope*.jsonl")), tmp_path / "cache")
    wrong = tmp_path / "w.jsonl"
    wrong.write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="text_field"):
        load_corpus(DataConfig(source="files", path=str(wrong)), tmp_path / "cache")
    with pytest.raises(AttnbenchError, match="qk_norm"):
        LMConfig(qk_norm="both")


def test_local_jsonl_corpora_go_through_datasets(tmp_path):
    docs = [f"document {i}: " + " ".join(f"w{(i * j) % 97}" for j in range(200)) for i in range(300)]
    path = tmp_path / "corpus.jsonl"
    import json

    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    corpus = load_corpus(DataConfig(source="files", path=str(path), vocab_size=300, seq_len=32), tmp_path / "cache")
    assert sum(corpus.n_docs.values()) == 300 and all(corpus.n_docs[s] > 0 for s in ("train", "val", "test"))
    assert corpus.tokenizer.decode(list(corpus.window("train", 0))).startswith("document")
    again = load_corpus(DataConfig(source="files", path=str(path), vocab_size=300, seq_len=32), tmp_path / "cache")
    assert (again.train == corpus.train).all()


def test_a_variant_past_flas_key_limit_is_refused_on_cuda_before_any_work():
    from attnbench.core.errors import AttnbenchError
    from attnbench.suites.lm.config import load_preset
    from attnbench.suites.lm.train import _check_fla_shapes

    pre = load_preset("340m")
    cuda = torch.device("cuda")  # only resolved, never allocated on
    _check_fla_shapes(pre, parse_variants("deltanet+nala,gated_deltanet,gated_deltanet+nala:key_width=match"), cuda)
    with pytest.raises(AttnbenchError, match=r"gated_deltanet\+nala has key features of 512 per head.*:key_width=match"):
        _check_fla_shapes(pre, parse_variants("gated_deltanet+nala"), cuda)
    _check_fla_shapes(pre, parse_variants("gated_deltanet+nala"), torch.device("cpu"))  # the torch form has no limit
