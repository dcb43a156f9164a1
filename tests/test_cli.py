"""The CLI end to end: list and check, and their exit codes."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import attnbench
from attnbench.cli.main import app

runner = CliRunner()


def test_list_shows_every_mechanism():
    result = runner.invoke(app, ["list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for name in attnbench.names():
        assert name in result.output


def test_piped_list_keeps_every_name_on_one_line_at_80_columns():
    result = runner.invoke(app, ["list"], env={"COLUMNS": "80"})  # CliRunner's stdout is not a terminal
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for name in attnbench.names():
        assert any(line.split("\t")[0] == name for line in lines), name
    assert runner.invoke(app, ["list", "--format", "json"]).output.lstrip().startswith("[")
    assert runner.invoke(app, ["list", "--format", "xml"]).exit_code == 2


def test_check_passes_for_a_subset():
    result = runner.invoke(app, ["check", "--attn", "nala,mirrorla,stella"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "agree with their references" in result.output


def test_check_unknown_name_is_a_clear_error():
    result = runner.invoke(app, ["check", "--attn", "nalla"], env={"COLUMNS": "250"})
    assert result.exit_code == 2
    assert "did you mean 'nala'" in result.output


def test_check_reports_a_disagreement(monkeypatch):
    cls = attnbench.get_attention("linear")
    monkeypatch.setattr(cls, "forward_torch", lambda self, q, k, v: cls.forward_reference(self, q, k, v) * 1.01)
    result = runner.invoke(app, ["check", "--attn", "linear"], env={"COLUMNS": "250"})
    assert result.exit_code == 1
    assert "mismatch" in result.output


def test_check_covers_the_delta_rule_op(monkeypatch):
    """`attnbench check` runs the delta-rule op's impls against the recurrence (fla: skipped without CUDA) and
    reports a broken chunked form."""
    result = runner.invoke(app, ["check", "--attn", "delta_rule,gated_delta_rule"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "gated_delta_rule" in result.output and "needs CUDA" in result.output
    import attnbench.ops.delta as delta

    chunked = delta.delta_rule_chunked
    monkeypatch.setattr(delta, "delta_rule_chunked", lambda *a, **kw: (chunked(*a, **kw)[0] * 1.01, None))
    result = runner.invoke(app, ["check", "--attn", "delta_rule"], env={"COLUMNS": "250"})
    assert result.exit_code == 1 and "mismatch" in result.output


def test_data_generators_write_files_the_readers_parse(tmp_path):
    from attnbench.suites.lra.data import load_listops, load_pathfinder

    r = runner.invoke(app, ["data", "listops", "--out", str(tmp_path), "--n-train", "40", "--n-val", "10",
                            "--n-test", "10", "--min-length", "10", "--max-length", "60", "--max-depth", "3",
                            "--max-args", "4"])
    assert r.exit_code == 0, r.output
    assert len(load_listops(tmp_path, "train", max_length=64).labels) == 40
    r = runner.invoke(app, ["data", "pathfinder", "--out", str(tmp_path), "--n", "20", "--contour-length", "6"])
    assert r.exit_code == 0, r.output
    ds = load_pathfinder(tmp_path, "train", difficulty="easy")
    assert len(ds.labels) > 0


def test_help_shows_plain_flags_without_a_type_label():
    for cmd in (["run", "lra", "--help"], ["run", "scaling", "--help"], ["check", "--help"], ["table", "--help"]):
        out = runner.invoke(app, cmd, env={"COLUMNS": "200"}).output
        flagged = [line for line in out.splitlines() if "<bool>" in line and "--help" not in line]
        assert flagged == [], flagged
        # every option has a help text: a row whose text column is empty ends right after its type label
        bare = [line for line in out.splitlines() if line.rstrip(" │").endswith(("<int>", "<str>", "<float>"))]
        assert bare == [], bare


def test_table_shows_the_users_runs_before_the_committed_ones(tmp_path):
    from attnbench.results.store import Store

    db = tmp_path / "mine.db"
    with Store(db) as s:
        run = s.start_run(suite="lra", setting="lra/tiny", config={})
        s.add(run.record(task="listops", attention="softmax", status="ok", params={"seed": 0},
                         metrics={"score": 30.0, "test_acc": 0.3, "n_test": 1000, "majority_test_acc": 0.1}, seed=0))
        s.finish_run(run.run_id, "ok")
    out = runner.invoke(app, ["table", "lra", "--db", str(db)], env={"COLUMNS": "250"}).output
    assert "your runs" in out and "committed reference results" in out
    assert out.index("your runs") < out.index("committed reference results")
    bad = runner.invoke(app, ["table", "lrb", "--db", str(db)], env={"COLUMNS": "250"})
    assert bad.exit_code != 0 and "did you mean 'lra'" in bad.output


def test_list_reads_the_builtins_source_as_the_live_registry_describes_them():
    from attnbench.api import catalog, registry

    calls = []
    live_describe = registry.describe
    try:
        registry.describe = lambda name: calls.append(name) or live_describe(name)
        static = catalog.builtins()
    finally:
        registry.describe = live_describe
    assert calls == [], f"described live, not from their source text: {calls}"
    assert static == catalog.live(), "the static reading of a built-in differs from its live description"


def test_list_imports_no_torch():
    code = ("import sys; from typer.testing import CliRunner; from attnbench.cli.main import app; "
            "r = CliRunner().invoke(app, ['list', '--format', 'tsv']); "
            "assert r.exit_code == 0 and 'relu_quadratic' in r.output, r.output; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_builtin_the_static_reader_cannot_resolve_is_described_live(tmp_path, monkeypatch):
    from attnbench.api import catalog, registry
    from attnbench.attention.linear import LinearAttention

    (tmp_path / "computed_mech.py").write_text(
        "from attnbench.attention.linear import LinearAttention\n\n"
        "class Computed(LinearAttention):\n    name = 'computed'\n    paper = ' '.join(['computed', 'paper'])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(catalog._NotStatic):
        catalog._describe_static("computed_mech", "Computed")
    monkeypatch.setitem(registry.BUILTIN_ATTENTIONS, "computed", "computed_mech:Computed")
    try:
        (row,) = [d for d in catalog.builtins() if d["name"] == "computed"]
    finally:
        registry._unregister("attention", "computed")
    assert row["paper"] == "computed paper" and row["impls"] == list(LinearAttention.impls)


@pytest.mark.parametrize("args, expect", [(["--help"], "run"), (["run", "--help"], "lra"),
                                          (["list"], "relu_quadratic")])
def test_help_and_list_answer_without_importing_torch(args, expect):
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; import attnbench.cli.main as c; "
            f"r = CliRunner().invoke(c.app, {args!r}); assert r.exit_code == 0 and {expect!r} in r.output, r.output; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


# --- first contact (issue 27) -------------------------------------------------------------------------------------
def test_check_formats_keep_every_number_whole(monkeypatch):
    import json

    from attnbench.checks import verify

    rows = [verify.Verdict("mirrorla_cross_head_variance_aware", True, "triton", 1023, "float32",
                           fwd_err=2.2345e-7, bwd_err=1.9876e-6, bound=4.4e-6, status="ok", ref_err=3.1e-8,
                           worst="dq"),
            verify.Verdict("nala", False, "fla", 257, "float32", None, None, 0.0, "skipped",
                           detail="needs a GPU (Triton kernels; --interpret runs them on the CPU)")]
    monkeypatch.setattr(verify, "verify_all", lambda names, dtype: rows)   # the output path, not the math
    numbers = ["2.2e-07", "2.0e-06", "3.1e-08", "4.4e-06", "1023"]
    for fmt in ("json", "tsv", "md", "table"):
        r = runner.invoke(app, ["check", "--format", fmt], env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        if fmt == "json":
            (table,) = json.loads(r.stdout)
            assert table["rows"][0]["fwd err"] == "2.2e-07" and "1 agree" in r.stderr
            continue
        shown = numbers if fmt != "table" else ["2.2e-07", "1023", "causal"]  # the form before the errors
        assert all(n in r.output for n in shown), (fmt, r.output)
        assert "…" not in r.output
        if fmt == "table":  # a terminal of 80 columns: nothing wider, columns dropped (and named) rather than cut
            table = r.output.splitlines()[:-1]   # the summary line after the table is one line when piped
            assert max(map(len, table)) <= 80 and "Not shown at this width" in r.output
    assert runner.invoke(app, ["check", "--format", "xml"]).exit_code == 2


def test_table_of_a_store_that_does_not_exist_is_an_error(tmp_path):
    r = runner.invoke(app, ["table", "lra", "--db", str(tmp_path / "typo.db")])
    assert r.exit_code == 2 and "no such results store" in r.output and len(r.output.strip().splitlines()) == 1


def test_lra_data_dir_that_does_not_exist_is_one_line_and_records_nothing(tmp_path):
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["run", "lra", "--attn", "softmax", "--data-dir", str(tmp_path / "nope"), "--db", str(db)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "--data-dir" in r.output and "no such directory" in r.output and "Looked for" not in r.output
    assert not db.exists()


@pytest.mark.parametrize("point,msg", [
    ("mqar d=33", "--point 'mqar d=33' is not a point of preset tiny: expected one of 'mqar d=32', "),
    (" , ", "--point is empty"),
])
def test_a_bad_recall_point_is_one_line_and_records_nothing(tmp_path, point, msg):
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["run", "recall", "--attn", "softmax", "--point", point, "--db", str(db)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and msg in r.output, r.output
    assert not db.exists()


def test_an_lra_run_with_no_data_for_any_task_fails_and_is_recorded_failed(tmp_path):
    from attnbench.results.store import Store

    (tmp_path / "empty").mkdir()
    db = tmp_path / "x.db"
    r = runner.invoke(app, ["run", "lra", "--attn", "softmax", "--data-dir", str(tmp_path / "empty"), "--db", str(db),
                            "--out", str(tmp_path / "out")])
    assert r.exit_code == 1 and "nothing to run" in r.output and "━" not in r.output, r.output  # no bar when piped
    with Store(db) as s:
        (run,) = s.runs()
    assert run["status"] == "failed" and "nothing to run" in run["note"]


def test_run_claims_writes_no_committed_file(tmp_path):
    import subprocess

    from attnbench.results.paths import project_root
    from attnbench.results.store import Store

    root = project_root()
    before = subprocess.run(["git", "status", "--porcelain", "--", "results"], cwd=root, capture_output=True,
                            text=True).stdout
    db = tmp_path / "c.db"
    r = runner.invoke(app, ["run", "claims", "--only", "nala-nonneg", "--attn", "nala", "--db", str(db)],
                      env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    with Store(db) as s:
        figs = [m.metrics["figure"] for m in s.measurements(suite="claims") if "figure" in m.metrics]
    assert figs and all(f.startswith("results/runs/claims/") for f in figs), figs
    after = subprocess.run(["git", "status", "--porcelain", "--", "results"], cwd=root, capture_output=True,
                           text=True).stdout
    assert after == before
    r = runner.invoke(app, ["run", "claims", "--update-committed", "--out", str(tmp_path), "--db", str(db)])
    assert r.exit_code == 2 and "--update-committed" in r.output


def test_list_and_table_at_80_columns_keep_names_and_numbers_whole():
    r = runner.invoke(app, ["list", "--format", "table"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(map(len, lines)) <= 80
    body = [ln for ln in lines if ln[:1] and ln[:1] in "┏┃┡│└"]
    assert body and all(ln.rstrip()[-1] in "┓┃┩│┘" for ln in body), "a row lost its right edge (cropped)"
    for name in attnbench.names():
        assert any(f" {name} " in ln for ln in lines), name
    tsv = runner.invoke(app, ["list", "--format", "tsv"])  # every option whole: wrapped between options, never cut
    options = [o.strip() for row in tsv.output.splitlines()[1:] for o in row.split("\t")[-1].split(", ")]
    assert len(options) > 30 and all(o in r.output for o in options), [o for o in options if o not in r.output]
    r = runner.invoke(app, ["table", "vision"], env={"COLUMNS": "80"})       # piped: markdown, rows whole
    assert r.exit_code == 0 and "| attention | impl | top-1 |" in r.output


def test_no_library_progress_bars_when_stderr_is_not_a_terminal(monkeypatch):
    import subprocess
    import sys

    code = ("import os, attnbench.cli.kit; from tqdm import tqdm; "
            "print(os.environ.get('TQDM_DISABLE'), tqdm(range(1)).disable)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in __import__("os").environ.items() if k != "TQDM_DISABLE"})
    assert r.stdout.split() == ["1", "True"], r.stdout + r.stderr
    pytest.importorskip("lm_eval")
    from lm_eval.api.model import TemplateLM

    from attnbench.suites.lm.evaluate import AttnbenchLM

    seen = {}
    monkeypatch.setattr(TemplateLM, "loglikelihood", lambda self, requests, disable_tqdm=False:
                        seen.setdefault("disable_tqdm", disable_tqdm) and [])
    AttnbenchLM.loglikelihood(object.__new__(AttnbenchLM), [])     # lm-eval passes disable_tqdm=False itself
    assert seen == {"disable_tqdm": not sys.stderr.isatty()}        # captured by pytest: not a terminal


def test_table_names_each_reported_table_in_one_line_and_prints_them_whole_on_request():
    from attnbench.suites.vision.leaderboard import _reported

    titles = [t[0].split(" — ")[0] for t in _reported()]
    short = runner.invoke(app, ["table", "vision"], env={"COLUMNS": "80"})
    assert short.exit_code == 0, short.output
    assert f"{len(titles)} reported table(s)" in short.output and "--reported" in short.output
    for t in titles:
        assert sum(t in ln for ln in short.output.splitlines()) == 1, t   # one line each, no rows
    assert "Published numbers, not measured by attnbench" not in short.output
    whole = runner.invoke(app, ["table", "vision", "--reported"], env={"COLUMNS": "80"})
    assert whole.exit_code == 0 and whole.output.count("Published numbers, not measured by attnbench") == len(titles)
    assert len(short.output.splitlines()) < len(whole.output.splitlines()) / 3
