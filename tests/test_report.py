"""Views over the store: exponent fit, the scaling view (leaderboard, memory tables, plots), committed reference
results, exports, the generic view, ingest (pytest-benchmark, jsonl, another store; errors naming the file)."""

from __future__ import annotations

import csv
import io
import json
import math
import random

import pytest
from rich.console import Console

from attnbench.api import suites as suite_registry
from attnbench.core.errors import AttnbenchError
from attnbench.results.ingest import import_records, ingest
from attnbench.results.records import read_jsonl, write_jsonl
from attnbench.results.store import Store
from attnbench.suites.scaling import leaderboard as scaling_leaderboard
from attnbench.suites.scaling.ingest import ingest_pytest_benchmark
from attnbench.views import sources as view_sources
from attnbench.views import tables as tbl
from attnbench.views.export import export, select
from attnbench.views.render import _is_text, _one_line, fit_columns, render_tables
from attnbench.views.rows import fit_exponent
from attnbench.views.sources import committed_records, latest, load_sources, Source

NS = [1024, 2048, 4096, 8192]


def test_fit_exponent_on_synthetic_costs():
    rng = random.Random(0)
    for k in (1.0, 2.0, 1.5):
        costs = [3e-7 * n ** k * math.exp(rng.gauss(0, 0.02)) for n in NS]
        assert fit_exponent(NS, costs) == pytest.approx(k, abs=0.05)
    assert fit_exponent(NS, [5.0] * 4) == pytest.approx(0.0, abs=1e-12)
    assert fit_exponent([1024], [1.0]) is None
    assert fit_exponent(NS, [None, 0, -1, 2.0]) is None      # one usable point only


def _populate(store: Store, setting: str = "scaling/syn", device_name: str = "Test CPU", rss_below: int = 0) -> str:
    """softmax ~N^2 (oom at the largest N), linear ~N: a synthetic sweep. Tensor bytes ~N; the RSS figure is
    below its resolution at the ``rss_below`` smallest N."""
    env = {"device": "cpu", "device_name": device_name, "git_commit": "abc123", "git_dirty": False,
           "packages": {"torch": "x"}}
    run = store.start_run(suite="scaling", setting=setting, env=env)
    recs = []
    for name, k, mk in (("softmax", 2, 1), ("linear", 1, 1)):
        for n in NS:
            status = "oom" if (name == "softmax" and n == NS[-1]) else "ok"
            metrics = {} if status != "ok" else {
                "time_median_s": 1e-9 * n ** k, "time_iqr_s": 1e-10 * n ** k, "peak_tensor_bytes": 100 * n ** mk,
                "tensor_mem_method": "synthetic count", "peak_rss_bytes": 120 * n ** mk, "gflops": 10.0,
                "mem_method": "synthetic RSS"}
            if status == "ok" and n in NS[:rss_below]:
                metrics.update(peak_rss_bytes=None, rss_note="below resolution: synthetic")
            recs.append(run.record(task="fwd/bidir", attention=name, status=status, impl="x", dtype="fp32",
                                   params={"seq_len": n, "mode": "fwd", "causal": False}, metrics=metrics))
    store.add_many(recs)
    store.finish_run(run.run_id, "ok")
    return run.run_id


def test_scaling_board_exponents_ratios_and_order(tmp_db):
    with Store() as s:
        _populate(s)
        recs = s.measurements()
    (board,) = scaling_leaderboard.scaling_boards(recs)
    assert board.ns == NS and board.title.startswith("scaling/syn · fwd/bidir · fp32 · cpu (Test CPU)")
    sm, lin = board.rows
    assert sm.label == "softmax" and lin.label == "linear"      # the baseline first
    assert sm.time_exp == pytest.approx(2.0) and lin.time_exp == pytest.approx(1.0)
    assert lin.mem_exp == pytest.approx(1.0) and lin.rss_exp == pytest.approx(1.0)
    assert board.ratio(lin, 4096, "time_median_s") == pytest.approx(1 / 4096)
    assert board.ratio(lin, 8192, "time_median_s") is None       # softmax oom there
    out = io.StringIO()
    tbl.print_tables("scaling", [Source("your runs (x)", recs)], console=Console(file=out, width=200))
    text = out.getvalue()
    assert "oom" in text and "2.00" in text and "1.00" in text and "time —" in text
    assert "peak memory (tensor bytes above the inputs) —" in text and "peak memory (process RSS" in text


def test_latest_record_per_point_wins(tmp_db):
    with Store() as s:
        _populate(s)
        _populate(s)
        recs = s.measurements()
    assert len(recs) == 16 and len(latest(recs)) == 8
    assert {r.run_id for r in latest(recs)} == {recs[-1].run_id}


def test_exports(tmp_db, tmp_path):
    with Store() as s:
        _populate(s)
        recs = s.measurements()
    text = export(recs, "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 8 and rows[0]["suite"] == "scaling" and "metrics.time_median_s" in rows[0]
    assert json.loads(rows[0]["packages"]) == {"torch": "x"}
    out = tmp_path / "e.jsonl"
    export(recs, "jsonl", out)
    assert [r.to_dict() for r in read_jsonl(out)] == [r.to_dict() for r in recs]
    md = export(recs, "markdown", tmp_path / "e.md", label="committed reference results")
    assert (tmp_path / "e.md").read_text() == md
    assert "| attention | impl | N=1k |" in md and "| device | cpu (Test CPU) |" in md and "abc123" in md
    assert "| softmax |" in md and "oom" in md
    with pytest.raises(ValueError, match="format"):
        export(recs, "xml")


def test_committed_reference_results_beside_the_users_runs(tmp_path, monkeypatch):
    proj = tmp_path / "checkout"
    (proj / "results" / "scaling").mkdir(parents=True)
    (proj / "pyproject.toml").write_text("")
    monkeypatch.chdir(proj)
    monkeypatch.delenv("ATTNBENCH_DB", raising=False)
    monkeypatch.setattr(view_sources, "PACKAGE_ROOT", tmp_path / "elsewhere")
    # a fresh checkout: no database, only the committed export
    with Store(tmp_path / "ref.db") as s:
        run_id = _populate(s, device_name="Reference CPU")
        write_jsonl(s.measurements(), proj / "results" / "scaling" / "cpu-reference.jsonl")
    assert not (proj / "results" / "attnbench.db").exists()
    out = io.StringIO()
    assert tbl.table("scaling", console=Console(file=out, width=200)) == 3   # time, tensor and RSS memory
    text = out.getvalue()
    assert "committed reference results" in text and "Reference CPU" in text
    assert not (proj / "results" / "attnbench.db").exists()        # reading never creates a store
    # the user runs something: both are shown, the user's labelled as theirs; the committed run not twice
    with Store() as s:
        _populate(s, setting="scaling/mine", device_name="My CPU")
        other = run_id
        # the committed run is in this store too (the reference was exported from it): shown once, as committed
        assert import_records(read_jsonl(proj / "results" / "scaling" / "cpu-reference.jsonl"), s) == (8, 0)
        assert import_records(read_jsonl(proj / "results" / "scaling" / "cpu-reference.jsonl"), s) == (0, 1)
    sources = load_sources("scaling")
    assert [src.committed for src in sources] == [False, True]  # the user's runs first
    assert all(m.run_id != other for m in sources[0].records)
    out = io.StringIO()
    tbl.table("scaling", console=Console(file=out, width=200))
    text = out.getvalue()
    assert "committed reference results" in text and "your runs" in text and "My CPU" in text
    paths = tbl.plot("scaling", out=tmp_path / "p", source="committed")
    assert paths and all(p.name.startswith("cpu-reference-") for p in paths)


def test_plots_written_and_non_empty(tmp_db, tmp_path):
    with Store() as s:
        _populate(s)
        recs = s.measurements()
    paths = scaling_leaderboard.plot_scaling(Source("x", recs), tmp_path / "plots")
    assert {p.name.rsplit("-", 1)[-1] for p in paths} == {"time.png", "memory.png"}
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


PB = {
    "machine_info": {"node": "box", "processor": "x86_64", "machine": "x86_64", "python_version": "3.11.7",
                     "cpu": {"brand_raw": "Bench CPU", "count": 2}},
    "commit_info": {"id": "deadbeef", "dirty": True, "branch": "main"},
    "datetime": "2026-01-02T03:04:05.000000+00:00",
    "version": "5.3.1",
    "benchmarks": [
        {"group": "fwd/bidir fp32 N=1024", "name": "test_attention[N1024-linear]",
         "fullname": "benchmarks/test_attention_bench.py::test_attention[N1024-linear]", "params": {},
         "extra_info": {"attnbench": 1, "attention": "linear", "impl": "torch", "task": "fwd/bidir", "mode": "fwd",
                        "causal": False, "seq_len": 1024, "batch": 1, "heads": 4, "head_dim": 64, "dtype": "fp32",
                        "device": "cpu", "threads": 2, "flops": 2_000_000, "options": {}, "check_err": 1e-7,
                        "check_tol": 1e-3, "packages": {"torch": "2.14.1"}},
         "stats": {"min": 0.001, "max": 0.003, "mean": 0.0015, "stddev": 0.0002, "rounds": 20, "median": 0.0014,
                   "iqr": 0.0003, "q1": 0.0012, "q3": 0.0015, "ops": 666.0, "total": 0.03, "iterations": 1}},
        {"group": None, "name": "test_other", "fullname": "tests/x.py::test_other", "params": None, "extra_info": {},
         "stats": {"min": 1.0, "max": 1.0, "mean": 1.0, "stddev": 0.0, "rounds": 1, "median": 1.0, "iqr": 0.0,
                   "q1": 1.0, "q3": 1.0, "ops": 1.0, "total": 1.0, "iterations": 1}},
    ],
}


def test_ingest_pytest_benchmark(tmp_db, tmp_path):
    f = tmp_path / "pb.json"
    f.write_text(json.dumps(PB))
    with Store() as s:
        run_id, n = ingest_pytest_benchmark(f, s)
        assert n == 2
        assert ingest_pytest_benchmark(f, s) == (run_id, 0)            # idempotent
        (m,) = s.measurements(suite="scaling")
        assert m.attention == "linear" and m.setting == "pytest-benchmark[b1,h4,d64]" and m.task == "fwd/bidir"
        assert m.params["seq_len"] == 1024 and m.metrics["time_median_s"] == 0.0014
        assert m.metrics["gflops"] == pytest.approx(2e6 / 0.0014 / 1e9)
        assert m.git_commit == "deadbeef" and m.git_dirty and m.device_name == "Bench CPU"
        assert m.packages["torch"] == "2.14.1" and m.source == "pytest-benchmark"
        (o,) = s.measurements(suite="pytest-benchmark")
        assert o.attention == "test_other"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with Store() as s, pytest.raises(ValueError, match="pytest-benchmark"):
        ingest_pytest_benchmark(bad, s)


def test_ingest_cli(tmp_db, tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    f = tmp_path / "pb.json"
    f.write_text(json.dumps(PB))
    r = CliRunner().invoke(app, ["ingest", str(f)])
    assert r.exit_code == 0 and "ingested 2" in r.output
    r = CliRunner().invoke(app, ["export", "--format", "jsonl", "--suite", "scaling", "--run", "latest"])
    assert r.exit_code == 0 and json.loads(r.output.splitlines()[0])["attention"] == "linear"


def test_generic_view_for_other_suites(tmp_db):
    # a suite without a view of its own: the mean score per attention and task over its seeds
    with Store() as s:
        run = s.start_run(suite="demo", setting="demo/tiny", env={"device": "cpu", "device_name": "CPU"})
        s.add_many([run.record(task=t, attention=a, status=st, seed=seed, metrics={"score": sc}, dtype="fp32")
                    for t, a, st, seed, sc in [("listops", "linear", "ok", 0, 0.30), ("listops", "linear", "ok", 1, 0.34),
                                               ("listops", "softmax", "oom", 0, None), ("text", "linear", "ok", 0, 0.6)]])
    out = io.StringIO()
    assert tbl.table("demo", console=Console(file=out, width=200)) == 1
    text = out.getvalue()
    assert "demo/tiny" in text and "0.3200 (seeds ± 0.2541, n=2)" in text and "oom" in text
    md = export(select(suite="demo"), "markdown")
    assert "| linear | 0.3200 (seeds ± 0.2541, n=2) | 0.6 |" in md


# --- the core names no suite; each suite's view comes from the registry -----------------------------------------
def test_view_comes_from_the_suite_registry_and_the_core_names_no_suite():
    import inspect

    from attnbench.results import store

    assert tbl.view_of("scaling").plot is scaling_leaderboard.plot_scaling
    assert suite_registry.get_suite("scaling").ingest is not None
    assert tbl.view_of("demo") is tbl.GENERIC                       # records of an unregistered suite
    for module in (tbl, store):
        assert "scaling" not in inspect.getsource(module), module.__name__


def test_unknown_suite_with_no_results_is_a_did_you_mean(tmp_db):
    with pytest.raises(AttnbenchError, match="scaling"):
        tbl.table("sclaing", console=Console(file=io.StringIO()))
    with pytest.raises(AttnbenchError, match="scaling"):
        tbl.plot("sclaing", out="unused")


# --- memory tables ---------------------------------------------------------------------------------------------
def test_memory_tables_name_their_figure_and_show_below_resolution(tmp_db):
    with Store() as s:
        _populate(s, rss_below=1)
        recs = s.measurements()
    md = export(recs, "markdown")
    titles = [line for line in md.splitlines() if line.startswith("#### ")]
    assert len(titles) == 3 and not any("()" in t for t in titles)
    assert "#### peak memory (tensor bytes above the inputs) — scaling/syn" in md
    assert "#### peak memory (process RSS above the inputs) — scaling/syn" in md
    for header in [line for line in md.splitlines() if line.startswith("| attention |")]:
        assert "()" not in header and "exponent (1k-8k)" in header
    # tensor bytes: 100 N at N = 1k -> 100 KiB, softmax's the same: ratio 1
    assert "| linear | 100 KiB · 1× |" in md
    # RSS below its resolution at the smallest N: "< res.", explained, never "0 B"
    assert "| linear | < res. |" in md and "not a zero" in md and "0 B" not in md
    (board,) = scaling_leaderboard.scaling_boards(recs)
    assert board.rows[1].rss_exp == pytest.approx(1.0)   # fitted over the points that have the figure


def test_records_from_before_the_tensor_figure_show_as_rss(tmp_db):
    with Store() as s:
        run = s.start_run(suite="scaling", setting="scaling/old", env={"device": "cpu"})
        s.add_many([run.record(task="fwd/bidir", attention="linear", status="ok", dtype="fp32",
                               params={"seq_len": n}, metrics={"time_median_s": 1e-6 * n, "peak_mem_bytes": 10 * n,
                                                                "mem_method": "child-process peak RSS"})
                    for n in (1024, 2048)])
        recs = s.measurements()
    md = export(recs, "markdown")
    assert "process RSS" in md and "tensor bytes" not in md and "10 KiB" in md
    paths = scaling_leaderboard.plot_scaling(Source("x", recs), tmp_db.parent / "old-plots")
    assert {p.name.rsplit("-", 1)[-1] for p in paths} == {"time.png", "memory.png"}


def test_plot_legend_is_outside_the_axes_and_covers_no_point(tmp_db):
    with Store() as s:
        _populate(s)
        recs = s.measurements()
    (board,) = scaling_leaderboard.scaling_boards(recs)
    for what in ("time", "memory"):
        fig = scaling_leaderboard.scaling_figure(board, what)
        fig.canvas.draw()
        (ax,) = fig.axes
        legend = ax.get_legend().get_window_extent()
        axes = ax.get_window_extent()
        assert legend.y1 <= axes.y0, what                                   # below the axes
        for line in ax.get_lines():
            for x, y in ax.transData.transform(line.get_xydata()):
                assert not legend.contains(x, y), (what, line.get_label())
        import matplotlib.pyplot as plt

        plt.close(fig)


# --- ingest: the store's own formats, then each suite's; errors name the file ----------------------------------
def test_ingest_errors_name_the_file(tmp_db, tmp_path):
    cases = {
        "bad.json": b"this is not JSON",                      # a damaged pytest-benchmark file
        "cut.json": json.dumps(PB).encode()[:200],              # truncated
        "other.json": b'{"some": "thing"}',                   # JSON, but nobody's format
        "random.bin": bytes(random.Random(0).randrange(256) for _ in range(512)),
        "binary.jsonl": b"\xff\xfe\x00garbage",
        "text.txt": b"hello\n",
    }
    with Store() as s:
        for name, data in cases.items():
            f = tmp_path / name
            f.write_bytes(data)
            with pytest.raises(AttnbenchError) as info:
                ingest(f, s)
            msg = str(info.value)
            assert str(f) in msg and "\n" not in msg, (name, msg)
        with pytest.raises(AttnbenchError, match="no such file"):
            ingest(tmp_path / "missing.json", s)
        assert s.count() == 0


def test_ingest_cli_bad_file_is_one_line_naming_it(tmp_db, tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    bad = tmp_path / "bad.json"
    bad.write_text("not json at all")
    r = CliRunner().invoke(app, ["ingest", str(bad)])
    assert r.exit_code != 0
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and str(bad) in lines[0], r.output
    assert "Traceback" not in r.output


def test_ingest_another_store_run_by_run_idempotent(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "shard-2.db"
    with Store(a) as s:
        _populate(s, setting="scaling/one")
    with Store(b) as s:
        _populate(s, setting="scaling/two")
        live = s.start_run(suite="scaling", setting="scaling/two")          # a shard job still running
        s.add(live.record(task="fwd/bidir", attention="linear", status="ok", params={"seq_len": 1}))
    with Store(a) as s:
        msg = ingest(b, s)
        assert "merged 9 record(s) of 2 new run(s)" in msg and str(b) in msg
        assert s.count() == 17
        assert {r["run_id"]: r["status"] for r in s.runs()}[live.run_id] == "running"
        assert "merged 0 record(s)" in ingest(b, s)                         # idempotent
        assert s.count() == 17
    with Store(b) as s:                                                       # the shard goes on, then finishes
        s.add(live.record(task="fwd/bidir", attention="linear", status="ok", params={"seq_len": 2}))
        s.finish_run(live.run_id, "ok")
    with Store(a) as s:
        assert "merged 1 record(s) of 0 new run(s)" in ingest(b, s)
        assert s.count() == 18
        assert {r["run_id"]: r["status"] for r in s.runs()}[live.run_id] == "ok"
        mine = sorted((m.config_hash, m.status, m.metrics.get("time_median_s")) for m in s.measurements())
    with Store(b) as s:
        theirs = sorted((m.config_hash, m.status, m.metrics.get("time_median_s")) for m in s.measurements())
    assert set(theirs) <= set(mine)
    with Store(a) as s, pytest.raises(AttnbenchError, match="store being ingested into"):
        ingest(a, s)


# --- every table whole at 80 columns and when piped (issue 27) --------------------------------------------------
SUITES_WITH_RESULTS = ("lra", "vision", "mixa", "adala", "lm", "claims", "scaling")


def _all_tables(suite: str) -> list:
    view = tbl.view_of(suite)
    tables = [t for src in load_sources(suite) for t in tbl.source_tables(view, src)]
    return tables + (view.extra_data() if view.extra_data else [])


def _console(width: int, terminal: bool):
    import io

    return Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None, soft_wrap=False)


def _as_your_runs(suite: str) -> list:
    """The committed records of ``suite`` as a user's store would give them (the "your runs" tables)."""
    return [Source("your runs (x.db)", src.records, path=None) for src in load_sources(suite)]


@pytest.mark.parametrize("suite", SUITES_WITH_RESULTS)
@pytest.mark.parametrize("whose", ["committed", "yours"])
def test_every_table_is_whole_at_80_columns_and_when_piped(suite, whose, tmp_db):
    sources = _as_your_runs(suite) if whose == "yours" else load_sources(suite)
    view = tbl.view_of(suite)
    tables = [t for src in sources for t in tbl.source_tables(view, src)]
    tables += view.extra_data() if view.extra_data and whose == "committed" else []
    assert tables, suite

    def show(console):
        if whose == "committed":
            tbl.table(suite, console=console, reported=True)
        else:
            tbl.print_tables(suite, sources, console=console)

    # on an 80-column terminal: no line longer than 80, every shown cell of a number column on one line, whole
    con = _console(80, terminal=True)
    show(con)
    out = con.file.getvalue()
    lines = out.splitlines()
    from rich.cells import cell_len  # columns on the terminal: a combining mark (the p̄ of a caption) takes none

    assert max(cell_len(ln) for ln in lines) <= 80, suite
    framed = [ln for ln in lines if ln[:1] and ln[:1] in "┏┃┡│└"]
    assert all(ln.rstrip()[-1] in "┓┃┩│┘" for ln in framed), (suite, "a table lost its right edge (cropped)")
    for t in tables:
        for i in fit_columns(t, 80):
            for row in t[2]:
                cell = str(row[i])
                if _is_text(t[1][i]):
                    assert all(w in out for w in cell.split()), (suite, t[1][i], cell)
                else:
                    for part in cell.splitlines():
                        assert any(part in ln for ln in lines), (suite, t[0], t[1][i], part)
    # piped: markdown, each row on one line with every cell whole, whatever the width
    con = _console(80, terminal=False)
    show(con)
    out = con.file.getvalue()
    assert "| --- " not in out and "|---" in out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ")]
    for t in tables:
        for row in t[2]:
            cells = [_one_line(c).replace("|", "\\|") for c in row]
            assert any(all(f" {c} " in ln for c in cells) for ln in rows), (suite, t[0], row)


def test_narrow_tables_drop_named_columns_and_never_fold_a_number():
    t = ("demo", ["attention", "impl", "top-1", "wall", "note"],
         [["softmax", "sdpa", "94.44 ± 2.8 ≈", "123 s", "a long note that may wrap between its words"]], "caption")
    con = _console(40, terminal=True)
    (shown,) = render_tables([t], console=con)
    out = con.file.getvalue()
    assert "impl" not in shown and "wall" not in shown and shown[:2] == ["attention", "top-1"]   # impl, wall go first
    assert "94.44 ± 2.8 ≈" in out and max(map(len, out.splitlines())) <= 40
    assert "Not shown at this width: impl, wall" in " ".join(out.split())
    for fmt, probe in (("tsv", "softmax\tsdpa\t94.44 ± 2.8 ≈\t123 s"), ("json", '"top-1": "94.44 ± 2.8 ≈"'),
                       ("md", "| softmax | sdpa | 94.44 ± 2.8 ≈ | 123 s |")):
        con = _console(40, terminal=True)
        render_tables([t], console=con, fmt=fmt)
        assert probe in con.file.getvalue(), fmt
    with pytest.raises(ValueError, match="--format must be one of"):
        render_tables([t], console=_console(40, True), fmt="xml")


# --- tables name their machine and source; marks; baselines; unfinished runs ---------------------------------------
def test_titles_name_the_machine_and_whether_the_results_are_committed(tmp_db):
    recs = committed_records("lra")
    view = tbl.view_of("lra")
    committed = tbl.source_tables(view, Source("committed reference results (x)", recs, committed=True))
    mine = tbl.source_tables(view, Source("your runs (x.db)", recs))
    for title in [t[0] for t in committed + mine]:
        assert recs[0].device_name in title, title
    assert all(t[0].endswith("· committed results") for t in committed)
    assert all(t[0].endswith("· your runs") for t in mine)
    eff = [t for t in mine if t[0].startswith("LRA efficiency")]
    assert eff and recs[0].device_name in eff[0][0]
    # a run whose process measured its machine (every `attnbench run`) records the GFLOP/s; the titles show it
    from attnbench.results.store import Run

    run = Run("r", "lra", "lra/tiny", "attnbench", {}, {"device": "cpu", "device_name": "Some CPU",
                                                          "host": {"machine": {"matmul_fp32_gflops": 214.4}}}, "now")
    rec = run.record(task="listops", attention="nala", status="ok", metrics={"score": 30.0})
    assert rec.metrics["matmul_fp32_gflops"] == 214.4
    import dataclasses

    measured = [dataclasses.replace(r, device_name="Some CPU", metrics={**r.metrics, "matmul_fp32_gflops": 214.4})
                for r in recs]
    titles = [t[0] for t in tbl.source_tables(view, Source("your runs (x.db)", measured))]
    assert all("Some CPU" in t and "fp32 matmul 214 GFLOP/s" in t for t in titles), titles


def test_mixa_table_marks_the_best_and_the_insignificant():
    import dataclasses

    recs = committed_records("mixa")
    (t, *_) = tbl.view_of("mixa").data(Source("committed reference results", recs, committed=True))
    top1 = [row[2] for row in t[2] if row[2] != "-"]
    assert sum(c.endswith("^") for c in top1) == 1 and any(c.endswith("≈") for c in top1)
    assert "^ best" in t[3] and "Δ: points vs the teacher, ≈" in t[3]
    # a record timed while another attnbench process ran is marked, and the caption says what the mark means
    marked = [dataclasses.replace(r, metrics={**r.metrics, "concurrent_attnbench": [{"pid": 1, "argv": "x"}]})
              for r in recs]
    (t, *_) = tbl.source_tables(tbl.view_of("mixa"), Source("your runs", marked))
    assert any("‡" in c for row in t[2] for c in row) and "‡ timed while other attnbench processes" in t[3]


def test_the_users_lra_table_without_softmax_shows_the_committed_baseline():
    recs = [r for r in committed_records("lra") if r.attention != "softmax"]
    (acc, *_) = tbl.view_of("lra").data(Source("your runs (x.db)", recs))
    first = acc[2][0]
    assert first[0].startswith("softmax (committed; ") and recs[0].device_name in first[0]
    assert not first[2].endswith(("^", "≈"))           # another run on another machine: outside the marks
    (acc, *_) = tbl.view_of("lra").data(Source("committed reference results", recs, committed=True))
    assert not any(row[0].startswith("softmax (committed") for row in acc[2])


def test_a_table_with_no_finished_cell_says_so_instead_of_unknowns():
    import dataclasses

    recs = [dataclasses.replace(r, status="interrupted", metrics={}) for r in committed_records("vision")]
    for suite in ("vision", "mixa"):
        rs = [dataclasses.replace(r, status="interrupted", metrics={}) for r in committed_records(suite)]
        tables = tbl.view_of(suite).data(Source("your runs", rs or recs))
        cap = tables[0][3]
        assert "?" not in cap and "No cell of this table has finished ok yet" in cap, (suite, cap)
