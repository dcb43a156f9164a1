"""The scaling suite: a plug-in (registration, no torch at import), presets, planning with attention specs, the
sweep (injected OOM and timeout, interruption, resume, reaping killed runs), memory measured for real at small N,
the CLI end to end."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import attnbench
from attnbench.api import registry
from attnbench.api.spec import parse_specs
from attnbench.measure import isolation, memory
from attnbench.results.store import Store
from attnbench.suites.scaling import config as scaling
from attnbench.suites.scaling.config import Grid, PresetError, ScalingPreset, Timing, load_preset
from attnbench.suites.scaling.measure import PointSpec, measure_point
from attnbench.suites.scaling.runner import plan_scaling, run_scaling


def tiny(**kw) -> ScalingPreset:
    base = dict(name="t", attentions=["softmax", "linear"], grid=[Grid(mode="fwd", seq=[128, 256])], heads=2,
                head_dim=16, threads=1, time_budget=60.0, mem_budget_gb=4.0,
                timing=Timing(warmup_ms=1.0, rep_ms=5.0, min_reps=2, max_reps=3),
                check=scaling.Check(seq_len=32))
    base.update(kw)
    return ScalingPreset(**base)


# --- presets -----------------------------------------------------------------------------------------------------
def test_embedded_presets_load_and_are_package_data():
    assert {"cpu-default", "tiny"} <= set(scaling.preset_names())
    p = load_preset()
    assert p.name == scaling.DEFAULT_PRESET and p.grid[0].seq[-1] == 16384
    assert all(isinstance(n, int) for g in p.grid for n in g.seq)


def test_preset_unknown_key_and_bad_type_are_errors(tmp_path):
    good = (tmp_path / "ok.toml")
    good.write_text('name = "x"\nattentions = ["softmax"]\n[[grid]]\nmode = "fwd"\nseq = ["1k", 2048]\n')
    assert load_preset(good).grid[0].seq == [1024, 2048]
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text() + "[timing]\nwarmup = 3\n")
    with pytest.raises(PresetError, match="unknown key.*warmup"):
        load_preset(bad)
    bad.write_text(good.read_text().replace('name = "x"', 'name = "x"\nheads = "four"'))
    with pytest.raises(PresetError, match="heads"):
        load_preset(bad)
    bad.write_text(good.read_text().replace('mode = "fwd"', 'mode = "sideways"'))
    with pytest.raises(PresetError, match="mode"):
        load_preset(bad)
    with pytest.raises(attnbench.UnknownNameError, match="cpu-default"):
        load_preset("cpu-defualt")


def test_parse_seq():
    assert scaling.parse_seq_list("1k,4k, 16k,100") == [1024, 4096, 16384, 100]
    with pytest.raises(ValueError):
        scaling.parse_seq("lots")


def test_plan_overrides_and_missing_names():
    p = tiny(attentions=["softmax", "surely_not_registered"])
    with pytest.warns(UserWarning, match="surely_not_registered"):
        plan = plan_scaling(p)
    assert plan.attentions == ["softmax"] and plan.setting == "scaling/t"
    plan = plan_scaling(p, attentions=["linear"], seq=["1k"], modes=["fwd", "fwd+bwd"], causal=True, heads=4)
    assert plan.setting == "scaling/t[h4]"
    assert {(x.mode, x.causal, x.seq_len) for x in plan.points} == {("fwd", True, 1024), ("fwd+bwd", True, 1024)}
    with pytest.raises(attnbench.UnknownNameError):
        plan_scaling(p, attentions=["sofmax"])


# --- the sweep -----------------------------------------------------------------------------------------------------
def test_injected_oom_and_timeout_do_not_stop_the_sweep(tmp_db):
    names = ["softmax", "linear", "relu_linear"]
    plan = plan_scaling(tiny(attentions=names, time_budget=8.0))
    with Store() as store:
        res = run_scaling(plan, store, inject="oom:softmax:256,timeout:linear:256", progress=False)
        got = {(m.attention, m.params["seq_len"]): m for m in store.measurements(suite="scaling")}
    assert len(res.records) == 6 and not res.interrupted
    assert got[("softmax", 256)].status == "oom" and "memory" in got[("softmax", 256)].error
    assert got[("linear", 256)].status == "timeout"
    # the sweep went on after both failures: the last point was measured
    last = got[("relu_linear", 256)]
    assert last.status == "ok" and last.id > got[("linear", 256)].id
    for n in (128,):
        for a in names:
            m = got[(a, n)]
            assert m.status == "ok", m.error
            mt = m.metrics
            assert mt["time_median_s"] > 0 and mt["reps"] >= 2 and mt["time_iqr_s"] >= 0
            assert mt["peak_tensor_bytes"] > 0 and "RSS" in mt["mem_method"]
            assert (mt["peak_rss_bytes"] is None) == ("rss_note" in mt) and mt["peak_rss_bytes"] != 0
            assert mt["flops"] > 0 and mt["gflops"] > 0
            assert mt["check_err"] <= mt["check_tol"]
            assert m.impl == registry.build(a, heads=2, head_dim=16).resolve_impl("cpu")


def test_larger_n_after_a_failure_is_skipped_and_unsupported_is_recorded(tmp_db):
    bidir_only = [n for n in attnbench.names() if not registry.describe(n)["causal"]]
    names = ["linear"] + bidir_only[:1]
    plan = plan_scaling(tiny(attentions=names, grid=[Grid(mode="fwd", seq=[64, 128, 256], causal=True)]))
    with Store() as store:
        res = run_scaling(plan, store, inject="oom:linear:64", progress=False, child=False)
    by = {(m.attention, m.params["seq_len"]): m.status for m in res.records}
    assert by[("linear", 64)] == "oom"
    assert by[("linear", 128)] == by[("linear", 256)] == "skipped"
    for n in (64, 128, 256):
        if bidir_only:
            assert by[(bidir_only[0], n)] == "unsupported"


def test_incorrect_point_is_not_timed(tmp_db, monkeypatch):
    # a fast form that disagrees with its reference: the gate fails, nothing is timed
    cls = registry.get_attention("linear")
    monkeypatch.setattr(cls, "forward_torch", lambda self, q, k, v: v * 2.0)
    plan = plan_scaling(tiny(attentions=["linear"], grid=[Grid(mode="fwd", seq=[128])]))
    with Store() as store:
        (m,) = run_scaling(plan, store, progress=False, child=False).records
    assert m.status == "incorrect" and "time_median_s" not in m.metrics and m.metrics["check_err"] > m.metrics["check_tol"]


def test_interrupt_keeps_finished_points_and_resume_skips_them(tmp_db, monkeypatch):
    plan = plan_scaling(tiny())
    real, calls = isolation.run_inline, []

    def flaky(target, spec):
        calls.append(spec.seq_len)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(target, spec)

    monkeypatch.setattr(isolation, "run_inline", flaky)
    with Store() as store:
        res = run_scaling(plan, store, progress=False, child=False)
        assert res.interrupted
        assert [m.status for m in res.records] == ["ok", "ok", "interrupted"]
        assert store.runs()[-1]["status"] == "interrupted"
        monkeypatch.setattr(isolation, "run_inline", real)
        again = run_scaling(plan, store, progress=False, child=False)
        assert again.resumed == 2 and [m.status for m in again.records] == ["ok", "ok"]
        forced = run_scaling(plan, store, progress=False, child=False, force=True)
        assert forced.resumed == 0 and len(forced.records) == 4


def test_cli_end_to_end(tmp_path, monkeypatch):
    from attnbench.cli.main import app

    db = tmp_path / "cli.db"
    monkeypatch.delenv("ATTNBENCH_DB", raising=False)
    monkeypatch.chdir(tmp_path)  # no committed results here
    runner = CliRunner()
    args = ["run", "scaling", "--preset", "tiny", "--db", str(db), "--attn", "softmax,linear,nala:lam=2",
            "--seq", "128,256", "--mode", "fwd", "--time-budget", "60"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "scaling/tiny" in r.output and "6 ok" in r.output
    assert "machine:" in r.output and "GFLOP/s" in r.output                 # the machine, printed first
    with Store(db) as s:
        ms = s.measurements(suite="scaling")
        assert len(ms) == 6 and {m.status for m in ms} == {"ok"}
        assert all(m.setting == "scaling/tiny" and m.task == "fwd/bidir" for m in ms)
        assert {m.attention: m.options for m in ms} == {"softmax": {}, "linear": {}, "nala": {"lam": 2.0}}
        machine = s.runs("scaling")[-1]["host"]["machine"]
        assert machine["matmul_fp32_gflops"] > 0 and machine["isa"] and machine["torch_threads"] >= 1
    r = runner.invoke(app, args)  # resume: nothing new
    assert r.exit_code == 0 and "6 cell(s) already finished" in r.output
    r = runner.invoke(app, ["table", "scaling", "--db", str(db)])
    assert r.exit_code == 0 and "softmax" in r.output and "exponent" in r.output and "your runs" in r.output
    assert "nala:lam=2.0" in r.output and "()" not in r.output
    r = runner.invoke(app, ["plot", "scaling", "--db", str(db), "--out", str(tmp_path / "plots")])
    assert r.exit_code == 0, r.output
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert [p.name.rsplit("-", 1)[-1] for p in pngs] == ["memory.png", "time.png"]
    assert all(p.stat().st_size > 1000 for p in pngs)
    r = runner.invoke(app, ["export", "--format", "csv", "--db", str(db), "--suite", "scaling"])
    assert r.exit_code == 0 and r.output.count("\n") == 7 and "metrics.peak_tensor_bytes" in r.output
    r = runner.invoke(app, ["run", "scaling", "--preset", "tiny", "--db", str(db), "--attn", "sofmax"])
    assert r.exit_code != 0 and "softmax" in r.output  # did-you-mean
    r = runner.invoke(app, ["run", "scaling", "--preset", "tiny", "--db", str(db), "--attn", "nala:lamm=2"])
    assert r.exit_code != 0 and "'lam'" in r.output and "Traceback" not in r.output


# --- a plug-in -------------------------------------------------------------------------------------------------------
def test_registered_as_a_suite_without_importing_torch():
    code = ("import sys; from attnbench.api import suites; s = suites.get_suite('scaling'); "
            "assert s.run is not None and s.view is not None and s.ingest is not None; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "from attnbench.cli.main import app; assert 'torch' not in sys.modules, 'torch imported by the CLI'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_lazy_re_exports_of_the_package():
    from attnbench.suites import scaling as pkg

    assert pkg.plan_scaling is plan_scaling and pkg.load_preset is load_preset
    with pytest.raises(AttributeError):
        pkg.no_such_name


def test_plan_with_attention_specs():
    p = tiny(attentions=["softmax"], options={"nala": {"tau": 0.25}})
    plan = plan_scaling(p, attentions=parse_specs("softmax,nala:lam=2,nala:lam=4"))
    assert plan.attentions == ["softmax", "nala:lam=2.0:tau=0.25", "nala:lam=4.0:tau=0.25"]
    opts = {(x.attention, x.options.get("lam")): x.options for x in plan.points}
    assert opts[("nala", 2.0)] == {"lam": 2.0, "tau": 0.25}                   # the spec's over the preset's
    assert len({plan.point_hash(x) for x in plan.points}) == len(plan.points)  # distinct points
    plan = plan_scaling(p, attentions=["nala:lam=2"])                          # text specs work too
    assert plan.points[0].options == {"lam": 2.0, "tau": 0.25}
    with pytest.raises(attnbench.AttnbenchError, match="more than once"):
        plan_scaling(p, attentions=["nala:lam=2", "nala:lam=2.0"])


# --- runs killed by SIGKILL --------------------------------------------------------------------------------------
def test_the_next_start_marks_a_killed_run_interrupted(tmp_db):
    from tests.test_store import start_and_sigkill

    killed = start_and_sigkill(tmp_db)
    plan = plan_scaling(tiny(attentions=["linear"], grid=[Grid(mode="fwd", seq=[64])]))
    with Store() as store:
        run_scaling(plan, store, progress=False, child=False, machine={})
        dead = store.run(killed)
        assert dead["status"] == "interrupted" and "no longer exists" in dead["note"]


# --- memory at small N -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_tensor_memory_is_positive_and_grows_with_n(mode):
    """The primary memory figure is counted at the tensor level: deterministic, > 0 and growing with N at the
    smallest N on any machine (the RSS figure may be below its resolution there: recorded as None, never 0)."""
    for name in ("softmax", "linear"):
        peaks = []
        for n in (64, 128, 256):
            spec = PointSpec(attention=name, seq_len=n, mode=mode, heads=2, head_dim=16, warmup_ms=0.0,
                                   rep_ms=0.0, min_reps=1, max_reps=1, check_seq_len=32)
            out = isolation.run_inline(measure_point, spec)
            assert out.status == "ok", out.error
            mt = out.result["metrics"]
            assert mt["peak_tensor_bytes"] >= mt["output_bytes"]                 # at least the output
            if mode == "fwd+bwd":
                assert mt["peak_tensor_bytes"] >= mt["input_bytes"]              # at least the gradients
            assert (mt["peak_rss_bytes"] is None) == ("rss_note" in mt) and mt["peak_rss_bytes"] != 0
            peaks.append(mt["peak_tensor_bytes"])
            again = isolation.run_inline(measure_point, spec).result["metrics"]["peak_tensor_bytes"]
            assert again == mt["peak_tensor_bytes"]                              # deterministic
        assert peaks[0] < peaks[1] < peaks[2], (name, mode, peaks)


def test_tensor_memory_counts_live_storages_once():
    import torch

    x = torch.randn(100, 100)

    def work():
        a = torch.empty(1000)                  # 4000 B
        b = torch.empty(2000)                  # 8000 B: 12000 live
        del a
        c = x.t().contiguous().view(-1)        # a view of the input is not new; the copy is 40000 B (48000 live)
        return b, c

    meter = memory.tensor_peak(work)
    assert meter.peak == 48000 and meter.allocated == 52000 and meter.count == 3


def test_rss_below_its_resolution_is_none_with_a_reason():
    rss = memory.PeakRSS()
    rss.baseline = 10**15                      # whatever the process did: a rise below one page
    if not memory.PeakRSS.available():
        pytest.skip("no /proc")
    peak, note = rss.measured()
    assert peak is None and "below resolution" in note


# --- on the one sweep: shards, exit codes ------------------------------------------------------------------------
def test_shards_cover_the_grid_once_and_merge(tmp_path):
    from attnbench.results.ingest import ingest

    plan = plan_scaling(tiny(attentions=["softmax", "linear"], grid=[Grid(mode="fwd", seq=[32, 64, 128])]))
    hashes = []
    for k in (1, 2):
        with Store(tmp_path / f"shard-{k}.db") as s:
            res = run_scaling(plan, s, progress=False, child=False, machine={}, shard=(k, 2))
            assert res.exit_code == 0 and all(m.status == "ok" for m in res.records)
            hashes.append({m.config_hash for m in res.records})
    assert not hashes[0] & hashes[1] and hashes[0] | hashes[1] == {plan.point_hash(p) for p in plan.points}
    with Store(tmp_path / "all.db") as s:
        for k in (1, 2):
            ingest(tmp_path / f"shard-{k}.db", s)
        assert s.count("scaling") == 6
        again = run_scaling(plan, s, progress=False, child=False, machine={})
        assert again.resumed == 6 and again.records == []


def test_cli_exit_code_when_a_point_fails(tmp_path, monkeypatch):
    from attnbench.cli.main import app

    monkeypatch.setenv("ATTNBENCH_INJECT", "fail:linear:64")
    r = CliRunner().invoke(app, ["run", "scaling", "--preset", "tiny", "--db", str(tmp_path / "f.db"), "--attn",
                                 "linear", "--seq", "64,128", "--mode", "fwd", "--shard", "1/1"])
    assert r.exit_code == 1, r.output
    assert "1 failed" in r.output and "linear fwd/bidir N=64 fp32" in r.output


# --- the timer ----------------------------------------------------------------------------------------------------
def test_timing_statistics_are_numpys_linear_quantiles():
    import numpy as np

    from attnbench.measure.timing import TimingStats

    for times in ([0.5], [3.0, 1.0], [0.013, 0.011, 0.017, 0.012, 0.030, 0.010, 0.0145]):
        st = TimingStats.of(times, cpu_times=[t / 2 for t in times])
        want = np.quantile(times, [0.2, 0.25, 0.5, 0.75, 0.8])
        assert [st.q20, st.q25, st.median, st.q75, st.q80] == pytest.approx(want, rel=1e-12)
        assert (st.min, st.reps, st.cpu_median) == (min(times), len(times), pytest.approx(np.median(times) / 2))
        assert st.iqr == pytest.approx(want[3] - want[1])


def test_the_cpu_timer_keeps_its_bounds_and_cuda_times_through_triton(monkeypatch):
    import triton.testing

    from attnbench.measure.timing import time_fn

    calls = []
    st = time_fn(lambda: calls.append(1), warmup_ms=0, rep_ms=1, min_reps=3, max_reps=7, estimate_s=1.0)
    assert st.reps == 3 and len(calls) == 3                      # 1 ms of 1 s calls: raised to min_reps
    st = time_fn(lambda: calls.append(1), warmup_ms=0, rep_ms=1e6, min_reps=3, max_reps=7, estimate_s=1e-6)
    assert st.reps == 7 and st.cpu_median is not None            # 1000 s of 1 µs calls: capped at max_reps
    seen = {}

    def fake_do_bench(fn, warmup, rep, return_mode):
        seen.update(warmup=warmup, rep=rep, mode=return_mode)
        return [2.0, 1.0, 3.0]                                    # milliseconds, as do_bench returns them

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    st = time_fn(lambda: None, warmup_ms=25, rep_ms=100, cuda=True)
    assert seen == {"warmup": 25, "rep": 100, "mode": "all"}
    assert (st.median, st.min, st.reps, st.cpu_median) == (pytest.approx(2e-3), pytest.approx(1e-3), 3, None)
