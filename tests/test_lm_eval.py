"""lm-eval over attnbench LMs: the registered ``attnbench`` model, the local tasks, the store and the CLI.

Every number checked here is computed by lm-eval from this model's answers; the tests recompute the expected values
independently (uniform model: byte perplexity = V ** (tokens / bytes); a bigram model's rolling log-likelihood =
the sum of its bigram log-probabilities; a continuation's log-likelihood = the sum of log-softmax of a direct
forward pass).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import string
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parent.parent
MAX_LEN = 24


# --- toy pieces ---------------------------------------------------------------------------------------------
def make_docs() -> list[str]:
    """Documents of Python standard-library source (what the offline tiny preset trains on), 40 lines each."""
    docs = []
    for mod in (textwrap, string):
        lines = inspect.getsource(mod).split("\n")
        docs += ["\n".join(lines[i:i + 40]) for i in range(0, len(lines), 40)]
    return [d for d in docs if d.strip()]


def make_tokenizer(docs):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


class Bigram(torch.nn.Module):
    """``logits[t] = table[ids[t]]``: causal, depends on the last token only."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, ids):
        return self.table[ids]


class TinyGRU(torch.nn.Module):
    """Causal and dependent on the whole context (left truncation changes its answers)."""

    def __init__(self, vocab: int):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, 16)
        self.rnn = torch.nn.GRU(16, 16, batch_first=True)
        self.out = torch.nn.Linear(16, vocab)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, ids):
        return self.out(self.rnn(self.emb(ids))[0])


@pytest.fixture(scope="module")
def toy():
    docs = make_docs()
    tok = make_tokenizer(docs)
    eos = tok.token_to_id("<eos>")
    vocab = tok.get_vocab_size()
    counts = torch.ones(vocab, vocab)
    for d in docs:
        ids = [eos] + tok.encode(d).ids
        for a, b in zip(ids, ids[1:]):
            counts[a, b] += 1
    table = counts.log() - counts.sum(1, keepdim=True).log()
    return {"docs": docs, "tok": tok, "eos": eos, "V": vocab, "table": table}


def short_docs(toy) -> list[str]:
    """6 documents of 12 lines: the held-out corpus of the real checkpoint (its cloze task: ~60 items)."""
    return ["\n".join(d.split("\n")[:12]) for d in toy["docs"][:6]]


def lm_of(toy, model, max_length=MAX_LEN, batch_size=8):
    from attnbench.suites.lm.evaluate import AttnbenchLM

    return AttnbenchLM(model=model, tokenizer=toy["tok"], eos_id=toy["eos"], max_length=max_length,
                       batch_size=batch_size)


@pytest.fixture(scope="module")
def tasks_dir(toy, tmp_path_factory):
    from attnbench.suites.lm.local_tasks import write_local_tasks

    return write_local_tasks(tmp_path_factory.mktemp("tasks"), toy["docs"], n_cloze=40)


@pytest.fixture(scope="module")
def scores(toy, tasks_dir):
    from attnbench.suites.lm.evaluate import evaluate_checkpoint

    out = {}
    for name, table in (("uniform", torch.zeros(toy["V"], toy["V"])), ("bigram", toy["table"])):
        out[name] = evaluate_checkpoint(lm_of(toy, Bigram(table)), "attnbench_heldout,attnbench_cloze",
                                        include_path=tasks_dir)
    return out


# --- local tasks ----------------------------------------------------------------------------------------------
def test_local_tasks_files(toy, tasks_dir, tmp_path):
    import yaml

    from attnbench.suites.lm.local_tasks import write_local_tasks

    files = sorted(p.name for p in tasks_dir.iterdir())
    assert files == ["attnbench_cloze.jsonl", "attnbench_cloze.yaml", "attnbench_heldout.jsonl",
                     "attnbench_heldout.yaml"]
    for name in ("attnbench_heldout", "attnbench_cloze"):
        cfg = yaml.safe_load((tasks_dir / f"{name}.yaml").read_text())
        data = Path(cfg["dataset_kwargs"]["data_files"]["test"])
        assert cfg["task"] == name and cfg["dataset_path"] == "json" and data.is_absolute() and data.is_file()
    held = [json.loads(x)["text"] for x in (tasks_dir / "attnbench_heldout.jsonl").read_text().splitlines()]
    assert held == toy["docs"]
    items = [json.loads(x) for x in (tasks_dir / "attnbench_cloze.jsonl").read_text().splitlines()]
    assert len(items) == 40
    for it in items:
        assert len(it["choices"]) == 4 and len(set(it["choices"])) == 4 and 0 <= it["label"] < 4
        true = it["choices"][it["label"]]
        assert any(it["context"] + true in d for d in toy["docs"])  # the true next line of some document
    # deterministic in the seed
    again = write_local_tasks(tmp_path / "a", toy["docs"], n_cloze=40)
    other = write_local_tasks(tmp_path / "b", toy["docs"], n_cloze=40, seed=1)
    cloze = (tasks_dir / "attnbench_cloze.jsonl").read_text()
    assert (again / "attnbench_cloze.jsonl").read_text() == cloze
    assert (other / "attnbench_cloze.jsonl").read_text() != cloze
    with pytest.raises(ValueError, match="no held-out documents"):
        write_local_tasks(tmp_path / "c", ["", "  "])


# --- scores through lm-eval -----------------------------------------------------------------------------------
def test_scores_are_sane(toy, scores):
    import lm_eval

    for res in scores.values():
        held, cloze = res["lm_eval"]["attnbench_heldout"], res["lm_eval"]["attnbench_cloze"]
        assert math.isfinite(held["word_perplexity"]) and held["word_perplexity"] > 1
        assert held["byte_perplexity"] > 1 and held["bits_per_byte"] > 0
        assert 0 <= cloze["acc"] <= 1 and 0 <= cloze["acc_norm"] <= 1 and cloze["acc_stderr"] > 0
        assert res["n"] == {"attnbench_heldout": len(toy["docs"]), "attnbench_cloze": 40}
        assert res["lm_eval_version"] == lm_eval.__version__
    # the bigram model knows the corpus: fewer bits per byte than the uniform one
    assert scores["bigram"]["lm_eval"]["attnbench_heldout"]["bits_per_byte"] < \
        scores["uniform"]["lm_eval"]["attnbench_heldout"]["bits_per_byte"] - 1


def test_uniform_model_perplexity_is_the_uniform_expectation(toy, scores):
    """Every token costs log V nats under uniform logits, and rolling windows predict each token exactly once."""
    V, docs, tok = toy["V"], toy["docs"], toy["tok"]
    tokens = sum(len(tok.encode(d).ids) for d in docs)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    words = sum(len(re.split(r"\s+", d)) for d in docs)
    held = scores["uniform"]["lm_eval"]["attnbench_heldout"]
    assert held["byte_perplexity"] == pytest.approx(math.exp(tokens * math.log(V) / nbytes), rel=1e-5)
    assert held["bits_per_byte"] == pytest.approx(tokens * math.log2(V) / nbytes, rel=1e-5)
    assert held["word_perplexity"] == pytest.approx(math.exp(tokens * math.log(V) / words), rel=1e-4)


def test_rolling_loglikelihood_is_the_bigram_sum(toy):
    """Windows of MAX_LEN tokens: a bigram model still sees each token's true predecessor (EOS for the first)."""
    from lm_eval.api.instance import Instance

    doc = toy["docs"][0]
    ids = toy["tok"].encode(doc).ids
    assert len(ids) > 3 * MAX_LEN
    prev = [toy["eos"]] + ids[:-1]
    table = torch.log_softmax(toy["table"], -1)
    expected = float(sum(table[a, b] for a, b in zip(prev, ids)))
    req = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(doc,), idx=0)
    for bs in (1, 8):
        (got,) = lm_of(toy, Bigram(toy["table"]), batch_size=bs).loglikelihood_rolling([req])
        assert got == pytest.approx(expected, rel=1e-5)


def test_loglikelihood_is_the_log_softmax_sum(toy):
    from lm_eval.api.instance import Instance

    model = TinyGRU(toy["V"]).eval()
    lm = lm_of(toy, model, max_length=MAX_LEN, batch_size=3)
    tok = toy["tok"]
    pairs = [("def f(x):", " return x"), ("import os\n", "import sys"), ("a = 1", " + 2"),
             (toy["docs"][1][:300], "\n    pass")]  # the last one is longer than MAX_LEN: truncated from the left
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i) for i, p in enumerate(pairs)]
    got = lm.loglikelihood(reqs)
    for (ctx, cont), (ll, greedy) in zip(pairs, got):
        n_sp = len(ctx) - len(ctx.rstrip())  # lm-eval's TemplateLM moves trailing whitespace to the continuation
        ctx, cont = (ctx[:-n_sp], ctx[-n_sp:] + cont) if n_sp else (ctx, cont)
        c_ids = tok.encode(ctx).ids
        whole = tok.encode(ctx + cont).ids
        cont_ids = whole[len(c_ids):]
        full = whole[-(MAX_LEN + 1):]
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([full[:-1]])).float(), -1)[0]
        n = len(cont_ids)
        rows = logp[len(full) - 1 - n:]
        assert ll == pytest.approx(float(rows.gather(-1, torch.tensor(cont_ids)[:, None]).sum()), rel=1e-5)
        assert greedy == bool((rows.argmax(-1) == torch.tensor(cont_ids)).all())
    assert len(tok.encode(pairs[3][0]).ids) > MAX_LEN


def test_generate_until_is_greedy_and_stops(toy):
    from lm_eval.api.instance import Instance

    tok = toy["tok"]
    x, y, z = (tok.encode(c).ids[0] for c in "xyz")
    table = torch.full((toy["V"], toy["V"]), -10.0)
    table[:, x] = 0.0  # from anywhere to x, then x -> y -> z -> x ...
    table[x], table[y], table[z] = -10.0, -10.0, -10.0
    table[x, y] = table[y, z] = table[z, x] = 0.0
    lm = lm_of(toy, Bigram(table))

    def gen(until, n):
        return lm.generate_until([Instance("generate_until", {}, ("def f():", {"until": until, "max_gen_toks": n}),
                                           0)])[0]

    assert gen([], 7) == "xyzxyzx"
    assert gen(["zx"], 50) == "xy"
    assert gen("y", 50) == "x"
    with torch.no_grad():
        lm.model.table[y, toy["eos"]] = 5.0  # end of text after y
    assert gen([], 50) == "xy"


# --- the registered model over a real checkpoint, offline, through lm-eval's own CLI --------------------------
@pytest.fixture(scope="module")
def checkpoint(toy, tmp_path_factory):
    artifact = pytest.importorskip("attnbench.suites.lm.artifact")
    from attnbench.models.lm import LMConfig, build_lm

    root = tmp_path_factory.mktemp("ckpt")
    held = root / "heldout.jsonl"
    held.write_text("".join(json.dumps({"text": d}) + "\n" for d in short_docs(toy)))
    torch.manual_seed(0)
    model = build_lm(LMConfig(vocab_size=toy["V"], hidden=32, layers=1, heads=2, head_dim=8, hidden_ratio=2.0))
    path = artifact.save_lm(root / "model", model, toy["tok"], eos_id=toy["eos"], max_length=MAX_LEN,
                            meta={"setting": "lm/test", "variant": "deltanet+silu", "config_hash": "abc123",
                                  "heldout": str(held)})
    return path


def test_registered_model_loads_a_checkpoint(checkpoint):
    from lm_eval.api.registry import get_model

    from attnbench.suites.lm.evaluate import AttnbenchLM

    assert get_model("attnbench") is AttnbenchLM
    assert get_model("dummy").__name__ == "DummyLM"  # lm-eval's own models still resolve
    lm = AttnbenchLM.create_from_arg_string(f"pretrained={checkpoint},batch_size=4", {"device": None})
    assert lm.batch_size == 4 and lm.max_length == MAX_LEN and lm.meta["variant"] == "deltanet+silu"
    with pytest.raises(TypeError, match="pretained"):
        AttnbenchLM.create_from_arg_string(f"pretained={checkpoint}")


def test_lm_eval_cli_offline_subprocess(checkpoint, toy, tmp_path):
    """lm-eval's own command line, `--model attnbench`, the local tasks, with the offline flags set."""
    from attnbench.suites.lm.local_tasks import write_local_tasks

    inc = write_local_tasks(tmp_path / "tasks", short_docs(toy), n_cloze=12)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "attnbench.suites.lm.eval_cli", "run", "--model", "attnbench", "--model_args",
           f"pretrained={checkpoint},batch_size=4", "--device", "cpu", "--tasks", "attnbench_heldout,attnbench_cloze",
           "--include_path", str(inc), "--output_path", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (res_file,) = list(out.rglob("results*.json"))
    res = json.loads(res_file.read_text())
    held, cloze = res["results"]["attnbench_heldout"], res["results"]["attnbench_cloze"]
    assert math.isfinite(held["word_perplexity,none"]) and held["word_perplexity,none"] > 1
    assert held["bits_per_byte,none"] > 0 and 0 <= cloze["acc,none"] <= 1
    assert res["n-samples"]["attnbench_heldout"]["effective"] == 6
    assert res["n-samples"]["attnbench_cloze"]["effective"] == 12


# --- attnbench eval lm: the store and the one-line errors -----------------------------------------------------
@pytest.fixture(scope="module")
def cli_app():
    import typer

    from attnbench.suites.lm.eval_cli import eval_command

    app = typer.Typer()
    app.command("lm")(eval_command)
    app.command("other")(lambda: None)  # two commands: typer keeps `lm` as a subcommand
    return app


def test_eval_command_records_and_skips(cli_app, checkpoint, tmp_path):
    from typer.testing import CliRunner

    from attnbench.results.store import Store

    db = str(tmp_path / "s.db")
    runner = CliRunner()
    r = runner.invoke(cli_app, ["lm", str(checkpoint), "--db", db, "--batch-size", "4"])
    assert r.exit_code == 0, r.output
    with Store(db) as store:
        (m,) = store.measurements(suite="lm")
    assert (m.setting, m.task, m.attention, m.status) == ("lm/test", "lm-eval", "deltanet+silu", "ok")
    assert m.params["checkpoint_hash"] == "abc123" and m.params["tasks"] == ["attnbench_heldout", "attnbench_cloze"]
    assert m.metrics["n"]["attnbench_heldout"] == 6 and m.metrics["lm_eval"]["attnbench_heldout"]["bits_per_byte"] > 0
    assert 0 <= m.metrics["lm_eval"]["attnbench_cloze"]["acc"] <= 1
    assert (Path(str(checkpoint) + ".lm_eval_tasks") / "attnbench_heldout.yaml").is_file()
    r = runner.invoke(cli_app, ["lm", str(checkpoint), "--db", db])
    assert r.exit_code == 0 and "finished earlier" in r.output
    r = runner.invoke(cli_app, ["lm", str(checkpoint), "--db", db, "--tasks", "attnbench_heldout", "--limit", "2"])
    assert r.exit_code == 0, r.output
    with Store(db) as store:
        records = store.measurements(suite="lm")
    assert len(records) == 2 and records[-1].params["limit"] == 2 and records[-1].metrics["n"] == \
        {"attnbench_heldout": 2}


def _one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def test_eval_command_errors(cli_app, checkpoint, tmp_path):
    from typer.testing import CliRunner

    runner = CliRunner()
    db = str(tmp_path / "e.db")
    r = runner.invoke(cli_app, ["lm", str(tmp_path / "nope"), "--db", db])
    assert r.exit_code == 2 and str(tmp_path / "nope") in _one_error_line(r.output)
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in ("config.json", "model.pt", "tokenizer.json"):
        (broken / f).write_text("{not json")
    r = runner.invoke(cli_app, ["lm", str(broken), "--db", db])
    assert r.exit_code == 2 and "config.json: damaged" in _one_error_line(r.output)
    r = runner.invoke(cli_app, ["lm", str(checkpoint), "--tasks", "attnbench_heldout,no_such_task", "--db", db])
    line = _one_error_line(r.output)
    assert r.exit_code == 2 and "no_such_task" in line and "attnbench_cloze, attnbench_heldout" in line


def test_hub_task_offline_is_one_line(tmp_path):
    """A task whose data lives on the hub, offline: the message says to pass --online or use the local tasks."""
    from attnbench.suites.lm.evaluate import EvalError, check_lm_eval_tasks

    (tmp_path / "hubtask.yaml").write_text(
        "task: attnbench_hubonly\ndataset_path: attnbench-nonexistent/none\noutput_type: loglikelihood_rolling\n"
        "test_split: test\ndoc_to_text: ''\ndoc_to_target: text\nmetric_list:\n  - metric: bits_per_byte\n")
    with pytest.raises(EvalError) as e:
        check_lm_eval_tasks(["attnbench_hubonly"], tmp_path, offline=True)
    msg = str(e.value)
    assert "\n" not in msg and "--online" in msg and "attnbench_heldout" in msg


def test_hub_mode_switches_imported_libraries():
    """The HF libraries read the offline variables once, at import: hub_mode also flips their constants, and
    restores them."""
    import datasets.config
    import huggingface_hub.constants as hub

    from attnbench.suites.lm.evaluate import hub_mode

    before = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE, os.environ.get("HF_DATASETS_OFFLINE"))
    for offline in (True, False):
        with hub_mode(offline):
            assert datasets.config.HF_HUB_OFFLINE is offline and hub.HF_HUB_OFFLINE is offline
            assert os.environ["HF_DATASETS_OFFLINE"] == os.environ["HF_HUB_OFFLINE"] == ("1" if offline else "0")
        assert (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE, os.environ.get("HF_DATASETS_OFFLINE")) == before


def test_eval_cli_imports_without_torch_or_lm_eval():
    code = ("import sys, attnbench.suites.lm.eval_cli; "
            "print(sorted(m for m in ('torch', 'lm_eval', 'datasets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
