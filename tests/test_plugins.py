"""Plug-ins (#23): a mechanism defined outside the repository, loaded by --plugin / ATTNBENCH_PLUGINS / entry points
in every process of a run, checked by the registry's contract, recorded with its source hash.

The in-process tests restore the registry, the plug-in state and ATTNBENCH_PLUGINS afterwards (``fresh``): nothing
registered here leaks into the registry-wide tests. The end-to-end tests run the CLI in subprocesses on a copy of
examples/my_attention.py outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attnbench.api import plugins, registry
from attnbench.api.plugins import PluginError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "my_attention.py"


def write(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


HEADER = """\
    import torch
    from attnbench import register_attention, register_feature_map
    from attnbench.attention.base import Attention, FeatureMap
    """


def sdpa_attention(name: str, *, broken: bool = False) -> str:
    """A plug-in attention: softmax attention whose fast form is SDPA (``broken``: the fast form forgets the mask)."""
    causal = "False" if broken else "self.causal"
    return HEADER + f"""
    @register_attention
    class Mine(Attention):
        name = {name!r}

        def forward_reference(self, q, k, v):
            s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            if self.causal:
                n = q.shape[-2]
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            return s.softmax(-1) @ v

        def forward_torch(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal={causal})
    """


# --- loading ----------------------------------------------------------------------------------------------------------
def test_a_file_registers_its_mechanisms_once_and_is_exported_for_children(fresh, tmp_path):
    src = shutil.copy(EXAMPLE, tmp_path / "my_attention.py")
    loaded = plugins.activate([str(src)])
    assert {"my_window", "my_softplus"} <= set(registry.names()) and "my_softplus" in registry.feature_map_names()
    assert os.environ[plugins.ENV] == str(Path(src).resolve())
    cls = registry.get_attention("my_window")
    assert plugins.activate([str(src)]) == loaded and registry.get_attention("my_window") is cls  # idempotent
    p = plugins.plugin_for("attention", "my_window")
    assert p.source == str(Path(src).resolve()) and len(p.sha256) == 64
    # the feature map became a full mechanism through the shared op, its options those of the map
    assert registry.options_of(registry.get_attention("my_softplus")) == {"beta": 1.0}
    attn = registry.build("my_softplus", heads=2, head_dim=8, causal=True, beta=2.0)
    assert attn.feature_map.beta == 2.0 and "triton" in attn.impls_for(True)
    with pytest.raises(Exception, match="beat"):
        registry.build("my_softplus", heads=2, head_dim=8, beat=2.0)


def test_a_module_a_folder_and_an_entry_point_load_too(fresh, tmp_path):
    pkg = tmp_path / "site"
    pkg.mkdir()
    write(pkg / "modplug.py", sdpa_attention("from_module"))
    folder = tmp_path / "folder"
    folder.mkdir()
    write(folder / "a.py", sdpa_attention("from_folder"))
    write(pkg / "epplug.py", sdpa_attention("from_entry_point"))
    dist = pkg / "epplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: epplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{plugins.GROUP}]\nmine = epplug\n")
    fresh.syspath_prepend(str(pkg))
    fresh.setattr(plugins, "_ENTRY_POINTS_DONE", False)
    plugins.activate(["modplug", str(folder)])
    assert {"from_module", "from_folder", "from_entry_point"} <= set(registry.names())
    assert plugins.plugin_for("attention", "from_module").source == "modplug"
    assert plugins.plugin_for("attention", "from_entry_point").kind == "entry point"
    exported = os.environ[plugins.ENV].split(os.pathsep)
    assert "modplug" in exported and str(folder.resolve()) in exported and "epplug" not in exported


def test_environment_variable_is_loaded_on_first_lookup(fresh, tmp_path):
    src = write(tmp_path / "envplug.py", sdpa_attention("from_env"))
    fresh.setenv(plugins.ENV, str(src))
    assert "from_env" in registry.names()


# --- errors: one line, naming what and where ---------------------------------------------------------------------------
def test_a_clash_names_both_sources(fresh, tmp_path):
    clash = write(tmp_path / "clash.py", sdpa_attention("softmax"))
    with pytest.raises(PluginError) as e:
        plugins.activate([str(clash)])
    msg = str(e.value)
    assert "\n" not in msg and str(clash) in msg and "built-in attnbench.attention.softmax" in msg
    a = write(tmp_path / "one.py", sdpa_attention("twice"))
    b = write(tmp_path / "two.py", sdpa_attention("twice"))
    plugins.activate([str(a)])
    with pytest.raises(PluginError, match=f"plug-in {b}.*clashes.*plug-in {a}"):
        plugins.activate([str(b)])


def test_an_import_failure_is_one_line_with_file_and_line(fresh, tmp_path):
    bad = write(tmp_path / "bad.py", "import math\n\nx = 1 / 0\n")
    with pytest.raises(PluginError) as e:
        plugins.load(str(bad))
    msg = str(e.value)
    assert "\n" not in msg and f"{bad}, line 3" in msg and "ZeroDivisionError" in msg and plugins.TRACEBACK_ENV in msg
    syntax = write(tmp_path / "syntax.py", "def f(:\n")
    with pytest.raises(PluginError, match=r"syntax\.py, line 1: SyntaxError"):
        plugins.load(str(syntax))
    fresh.setenv(plugins.TRACEBACK_ENV, "1")
    with pytest.raises(PluginError, match="Traceback"):
        plugins.load(str(bad))
    with pytest.raises(PluginError, match="no such file"):
        plugins.load(str(tmp_path / "absent.py"))
    with pytest.raises(PluginError, match="no module named 'no_such_plugin_module'"):
        plugins.load("no_such_plugin_module")
    assert not any(p.source.endswith(("bad.py", "syntax.py")) for p in plugins.loaded())  # nothing half-loaded


def test_a_class_that_misses_the_protocol_says_what_is_missing(fresh, tmp_path):
    no_fast = write(tmp_path / "nofast.py", HEADER + """
    @register_attention
    class NoFast(Attention):
        name = "nofast"
        def forward_reference(self, q, k, v):
            return v
    """)
    with pytest.raises(PluginError, match=r"'nofast'.*missing method forward_torch\(q, k, v\) for impl 'torch'"):
        plugins.load(str(no_fast))
    no_phi = write(tmp_path / "nophi.py", HEADER + """
    @register_feature_map
    class NoPhi(FeatureMap):
        name = "nophi"
    """)
    with pytest.raises(PluginError, match=r"missing method phi\(x\)"):
        plugins.load(str(no_phi))
    not_module = write(tmp_path / "plain.py", HEADER + """
    @register_attention
    class Plain:
        name = "plain"
    """)
    with pytest.raises(PluginError, match="must be a class deriving from attnbench.attention.base.Attention"):
        plugins.load(str(not_module))
    assert not {"nofast", "nophi", "plain"} & set(registry.names() + registry.feature_map_names())


# --- provenance: the source hash is part of the cell's identity -------------------------------------------------------
def test_point_identity_carries_the_plugin_hash_and_builtins_do_not_change(fresh, tmp_path):
    from attnbench.results.provenance import config_hash
    from attnbench.results.records import point_hash

    kw = dict(suite="scaling", setting="s", task="t", options={}, params={"n": 1}, dtype="fp32", device="cpu")
    plain = {k: v for k, v in kw.items()}
    # a built-in's identity is exactly the pre-plug-in formula (committed results keep matching)
    assert point_hash(attention="softmax", **kw) == config_hash({**plain, "attention": "softmax"})
    src = write(tmp_path / "p.py", sdpa_attention("hashed"))
    plugins.activate([str(src)])
    assert point_hash(attention="softmax", **kw) == config_hash({**plain, "attention": "softmax"})
    sha = plugins.plugin_for("attention", "hashed").sha256
    assert point_hash(attention="hashed", **kw) == config_hash({**plain, "attention": "hashed",
                                                                 "plugins": {"hashed": sha}})
    assert point_hash(attention="deltanet+hashed", **kw) != config_hash({**plain, "attention": "deltanet+hashed"})
    assert plugins.provenance("hashed") == {f"plugin:{src.resolve()}": f"sha256:{sha}"}
    # a cell that names the plug-in only in its params (MixA's per-layer specs) carries it too
    mixed = dict(kw, params={"n": 1, "specs": ["softmax", "hashed"]})
    assert point_hash(attention="mix", **mixed) == config_hash({**mixed, "attention": "mix",
                                                                 "plugins": {"hashed": sha}})


def test_the_benchmarks_load_a_plugin_and_a_broken_one_is_one_line(tmp_path):
    bench = [sys.executable, "-m", "pytest", str(ROOT / "benchmarks"), "-q", "-p", "no:cacheprovider",
             "--benchmark-disable", "--attn-seq", "64"]
    env = {k: v for k, v in os.environ.items() if k != plugins.ENV}
    ok = subprocess.run([*bench, "--attn-plugin", str(EXAMPLE), "--attn-names", "my_window"], cwd=tmp_path,
                        env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "1 passed" in ok.stdout, ok.stdout[-2000:] + ok.stderr[-2000:]
    broken = write(tmp_path / "broken.py", "x = 1 / 0\n")
    bad = subprocess.run([*bench, "--attn-plugin", str(broken)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 4 and "broken.py, line 1: ZeroDivisionError" in bad.stderr, bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr


# --- the contract -------------------------------------------------------------------------------------------------------
def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Benchmark your own attention")
    return text[start:text.index("\n## ", start + 1)]


def test_the_readme_test_snippet_runs_the_example_through_the_pytest_helper(fresh):
    """The README section's test file, as written: the example meets the contract through attnbench.checks.contract."""
    section = readme_section()
    snippet = section.split("```python\n")[2].split("```")[0]
    assert "attnbench.checks.contract.check_attention" in snippet and "examples/my_attention.py" in snippet
    fresh.chdir(ROOT)
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert tests
    for fn in tests:
        fn()
    # the section's commands are those this file runs (through the CLI, on a copy of the example outside the
    # repository): check, a run of each suite with the plug-in, and the table that shows it
    commands = section.split("```bash\n")[1].split("```")[0]
    for cmd in ("attnbench check --plugin", "attnbench run lra --plugin", "attnbench run vision --plugin",
                "attnbench run scaling --plugin", "attnbench run lm --plugin", "attnbench table lra"):
        assert cmd in commands


def test_check_catches_a_fast_form_that_disagrees_with_its_reference(fresh, tmp_path):
    """A planted bug (the causal fast form forgets its mask): `check` exits 1 with one line per failure naming the
    mechanism, the form and the impl; the pytest helper fails the same way."""
    from typer.testing import CliRunner

    import attnbench.checks.contract
    from attnbench.cli.main import app

    bad = write(tmp_path / "planted.py", sdpa_attention("planted", broken=True))
    result = CliRunner().invoke(app, ["check", "--plugin", str(bad), "--attn", "planted", "--format", "md"])
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("FAIL planted")]
    assert lines and all("[causal]" in ln for ln in lines), result.output
    assert any("impl 'torch' vs reference" in ln and "disagrees with its reference" in ln for ln in lines)
    assert any("no look-ahead" in ln for ln in lines)
    assert not any("[bidir]" in ln for ln in result.output.splitlines() if ln.startswith("FAIL"))
    with pytest.raises(pytest.fail.Exception, match="planted \\[causal\\] no look-ahead"):
        attnbench.checks.contract.check_attention("planted")
    good = CliRunner().invoke(app, ["list", "--plugin", str(EXAMPLE), "--format", "json"])
    assert good.exit_code == 0 and '"my_window"' in good.output and str(EXAMPLE) in good.output


def test_check_passes_the_example_and_fails_its_planted_variants(tmp_path, monkeypatch):
    """``attnbench check --plugin`` on the example itself exits 0 (both mechanisms, the map's own clause too); three
    planted copies exit 1 naming the broken clause: a fast form that ignores its ``window`` option, one that is
    wrong only under no_grad, and a feature map whose fast ``phi`` is not its reference. The example runs in a
    process of its own; the planted copies in this one (a process start less each), each plug-in gone after it."""
    from .helpers import invoke_isolated

    src = EXAMPLE.read_text()
    ok = _cli(["check", "--plugin", str(EXAMPLE), "--attn", "my_window,my_softplus", "--format", "md"], cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert "my_window" in ok.stdout and "my_softplus" in ok.stdout and "FAIL" not in ok.stdout
    planted = {
        "option": (src.replace("left, right = self.window - 1, (0 if self.causal else self.window - 1)",
                               "left, right = 15, (0 if self.causal else 15)"), "my_window",
                   "options off their defaults", "window=17"),
        "no_grad": (src.replace("        return torch.einsum(\"bhnw,bhndw->bhnd\", scores.softmax(-1), vw)",
                                "        out = torch.einsum(\"bhnw,bhndw->bhnd\", scores.softmax(-1), vw)\n"
                                "        return out if torch.is_grad_enabled() else out.flip(-2)"),
                    "my_window", "under no_grad", "no_grad output"),
        "map": (src.replace("return F.softplus(x, beta=self.beta)", "return F.softplus(x, beta=self.beta) + 0.01"),
                "my_softplus", "vs reference", "disagrees with its reference"),
    }
    for what, (text, name, clause, detail) in planted.items():
        assert text != src, what  # the planting found its line
        bad = write(tmp_path / f"planted_{what}.py", text)
        run = invoke_isolated(monkeypatch, ["check", "--plugin", str(bad), "--attn", name, "--format", "md"])
        fails = [ln for ln in run.output.splitlines() if ln.startswith(f"FAIL {name}")]
        assert run.exit_code == 1 and any(clause in ln and detail in ln for ln in fails), (what, run.output[-3000:])


# --- every process of a run loads the plug-in -------------------------------------------------------------------------
def _child_names(payload):
    from attnbench.api import registry as reg

    return {"names": reg.names(), "out": reg.build(payload, heads=2, head_dim=8)(*torch.ones(3, 1, 2, 3, 8)).shape}


def test_children_see_the_plugin_without_a_flag(fresh, tmp_path):
    from attnbench.measure.isolation import run_in_child

    src = shutil.copy(EXAMPLE, tmp_path / "my_attention.py")
    plugins.activate([str(src)])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", "import attnbench; print(sorted(attnbench.names()))"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "'my_window'" in out.stdout, out.stderr[-2000:]
    child = run_in_child(_child_names, "my_window", timeout=120)  # the scaling suite's isolated child
    assert child.status == "ok", child.error
    assert "my_softplus" in child.result["names"] and tuple(child.result["out"]) == (1, 2, 3, 8)


# --- end to end: one command per suite puts the plug-in beside the built-ins --------------------------------------------
def _cli(args, *, cwd, env=None, timeout=300):
    base = {k: v for k, v in os.environ.items() if k != plugins.ENV}
    env = {**base, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "attnbench.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc


def _records(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute("select attention, status, config_hash, packages, metrics from measurements").fetchall()


@pytest.fixture
def outside(tmp_path):
    """The example copied to a folder outside the repository."""
    src = tmp_path / "my_attention.py"
    shutil.copy(EXAMPLE, src)
    return src


def table_section(markdown: str, setting: str) -> str:
    """The first table of ``attnbench table ... --format md`` whose title names ``setting``, with its caption."""
    sections = markdown.split("\n#### ")
    found = [sec for sec in sections if setting in sec.splitlines()[0]]
    assert found, f"no table titled with {setting!r} in:\n{markdown[:3000]}"
    return found[0]


def in_table(suite: str, db: str, setting: str, rows: list[str], *, cwd: Path) -> None:
    """The user's table of ``suite`` (no committed results) has every row of ``rows`` in the table of ``setting``:
    the plug-in beside the built-ins, measured in the same run."""
    table = _cli(["table", suite, "--db", db, "--format", "md", "--no-committed"], cwd=cwd)
    assert table.returncode == 0, table.stdout[-2000:] + table.stderr[-2000:]
    section = table_section(table.stdout, setting)
    for row in rows:
        assert f"| {row} |" in section, (row, section)


# (suite, its arguments, the table setting, rows): each suite's tiny preset through its real pipeline (--smoke),
# the plug-in beside a built-in; run in this process, the plug-in gone after it, and the table read by a process of
# its own (the --nproc run is test_lra_run's two-process test; the submitit run is the scaling test below)
SUITE_RUNS = [
    ("lra", ["--attn", "softmax,my_window", "--tasks", "listops"], "lra/tiny-smoke", ["softmax", "my_window"]),
    ("vision", ["--attn", "softmax,my_softplus"], "vision/tiny-smoke", ["softmax", "my_softplus"]),
    ("claims", ["--only", "memory", "--attn", "nala,my_window"], "claims/cpu-smoke", ["my_window", "nala"]),
    ("lm", ["--attn", "deltanet+my_softplus"], "lm/tiny-smoke", ["deltanet+my_softplus"]),
]


@pytest.mark.parametrize("suite,args,setting,rows", SUITE_RUNS, ids=[r[0] for r in SUITE_RUNS])
def test_each_suite_puts_the_plugin_in_its_table(outside, tmp_path, monkeypatch, suite, args, setting, rows):
    from .helpers import invoke_isolated

    run = invoke_isolated(monkeypatch, ["run", suite, "--plugin", str(outside), *args, "--smoke", "--db", "s.db"],
                          cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert run.exit_code == 0, run.output[-3000:]
    plugged = [r for r in _records(tmp_path / "s.db") if "my_" in r[0]]  # the smoke's planned stop is a record too
    assert any(r[1] == "ok" for r in plugged) and all(f"plugin:{outside}" in r[3] for r in plugged)
    in_table(suite, "s.db", setting, rows, cwd=tmp_path)


def test_scaling_under_submitit_reruns_a_cell_when_the_plugin_changes(outside, tmp_path, monkeypatch):
    """The plug-in only through ATTNBENCH_PLUGINS (no flag): submitit's job process and the scaling suite's isolated
    child load it; an unchanged file skips the cell, an edited one reruns it under a new identity (these two runs
    in this process, the plug-in loaded afresh for each and gone after it; the cell still in an isolated child)."""
    pytest.importorskip("submitit")
    from .helpers import invoke_isolated

    env = {plugins.ENV: str(outside)}
    args = ["run", "scaling", "--preset", "tiny", "--attn", "my_window", "--seq", "32", "--db", "s.db", "--out", "w"]
    first = _cli([*args, "--launcher", "submitit-local"], cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    ((_, status, hash1, packages1, _),) = _records(tmp_path / "s.db")
    assert status == "ok" and f"plugin:{outside}" in packages1

    def here():
        return invoke_isolated(monkeypatch, args, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"})

    again = here()
    assert again.exit_code == 0 and "already finished" in again.output and len(_records(tmp_path / "s.db")) == 1
    outside.write_text(outside.read_text() + "\n# edited: a new version of the mechanism\n")
    edited = here()
    assert edited.exit_code == 0, edited.output[-3000:]
    rows = _records(tmp_path / "s.db")
    assert len(rows) == 2 and rows[1][1] == "ok" and rows[1][2] != hash1 and rows[1][3] != packages1


def test_an_lm_with_a_plugin_feature_map_loads_in_a_fresh_process(fresh, outside, tmp_path):
    """``deltanet+my_softplus``: the plug-in's map in the delta rule; the checkpoint names its plug-in, so lm-eval's
    process (or anyone's ``load_lm``) loads it without a flag."""
    from tokenizers import Tokenizer, models

    from attnbench.models.lm import LMConfig, build_lm
    from attnbench.suites.lm.artifact import save_lm

    plugins.activate([str(outside)])
    model = build_lm(LMConfig(vocab_size=16, hidden=32, layers=1, heads=2, head_dim=8, hidden_ratio=2.0,
                              feature_map="my_softplus", feature_options={"beta": 2.0}))
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 16)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    path = save_lm(tmp_path / "ckpt", model, tok, eos_id=0, max_length=8, meta={"variant": "deltanet+my_softplus"})
    meta = json.loads((path / "config.json").read_text())["meta"]
    assert meta["plugins"] == {str(outside): "sha256:" + plugins.plugin_for("feature map", "my_softplus").sha256}
    env = {k: v for k, v in os.environ.items() if k != plugins.ENV}
    code = ("import torch; from attnbench.suites.lm.artifact import load_lm; m = load_lm(%r); "
            "print(m.model.cfg.feature_map, tuple(m.model(torch.zeros(1, 3, dtype=torch.long)).shape))" % str(path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "my_softplus (1, 3, 16)" in out.stdout, out.stderr[-2000:]
    outside.write_text(outside.read_text() + "\n# edited after training\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "restore that version of the file, or retrain" in out.stderr, out.stderr[-2000:]
