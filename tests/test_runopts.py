"""The options every suite's ``run`` shares: declared once (:func:`attnbench.cli.kit.run_command`), the same on every
suite's command, parsed into one :class:`attnbench.engine.context.RunOptions`, and carried to the run (``--threads`` into
every record, ``--nproc`` to torchrun, ``--launcher`` to the job launcher, ``--plugin`` before any spec)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from attnbench.cli import kit as clikit
from attnbench.cli.main import app
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions, run_options, work_dir
from attnbench.results.store import Store

from .test_engine_cli import PRESET

SUITES = ("lra", "vision", "adala", "mixa", "lm", "scaling", "claims")
FLAGS = {"seed": "--seed", "seeds": "--seeds", "force": "--force", "db": "--db", "out": "--out", "nproc": "--nproc",
         "shard": "--shard", "launcher": "--launcher", "jobs": "--jobs", "partition": "--partition",
         "gpus_per_job": "--gpus-per-job", "job_minutes": "--job-minutes", "threads": "--threads",
         "compile": "--compile", "plugin": "--plugin"}


def run_commands() -> dict:
    return dict(typer.main.get_command(app).commands["run"].commands)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_every_suite_run_command_takes_the_same_shared_options_from_one_declaration():
    commands = run_commands()
    assert set(SUITES) <= set(commands)
    assert set(clikit.SHARED) == set(FLAGS)
    seen = {}
    for name, cmd in commands.items():
        declared = [o for p in cmd.params for o in p.opts]
        assert len(declared) == len(set(declared)), f"{name}: an option declared twice"
        shared = {p.name: (tuple(p.opts), p.default, p.multiple, p.is_flag) for p in cmd.params
                  if p.name in FLAGS}
        assert {k: v[0] for k, v in shared.items()} == {k: (f,) for k, f in FLAGS.items()}, name
        seen[name] = shared
    first = seen[SUITES[0]]
    assert all(s == first for s in seen.values())  # names, defaults, types: one declaration


def test_run_options_seeds_and_replace():
    assert RunOptions().seeds == [0] and RunOptions().seed == 0
    assert RunOptions(seed=3).seeds == [3]
    o = RunOptions(seeds=[2, 5])
    assert o.seed == 2 and o.seeds == [2, 5]
    assert o.replace(seed=7).seeds == [7] and o.replace(seeds=[4]).seed == 4
    assert run_options(None, db="x.db", out="w").db == "x.db"
    with pytest.raises(AttnbenchError, match="only one seed|one seed per command"):
        o.only_seed()
    with pytest.raises(AttnbenchError, match="twice"):
        RunOptions(seeds=[1, 1])
    with pytest.raises(AttnbenchError, match="--threads"):
        RunOptions(threads=-1)
    assert RunOptions(out="somewhere").work("lra") == Path("somewhere")
    assert work_dir("lra").parts[-3:] == ("results", "runs", "lra")


def test_seed_with_seeds_is_a_one_line_error(tmp_path):
    db = tmp_path / "x.db"
    for suite in SUITES:
        r = invoke("run", suite, "--seed", "1", "--seeds", "0,1", "--db", str(db))
        assert r.exit_code == 2 and "--seed and --seeds" in r.output, (suite, r.output)
        assert "Traceback" not in r.output
    r = invoke("run", "lra", "--attn", "softmax", "--seeds", "0,x", "--db", str(db))
    assert r.exit_code == 2 and "comma-separated integers" in r.output
    assert not db.exists()
    from attnbench.cli.kit import _parse_seeds

    assert _parse_seeds("0-3,8") == [0, 1, 2, 3, 8] and _parse_seeds("5") == [5] and _parse_seeds("2-2") == [2]
    for bad in ("1-x", "-", "3-"):
        with pytest.raises(AttnbenchError, match="or ranges"):
            _parse_seeds(bad)


def test_nproc_of_a_one_process_suite_says_why(tmp_path):
    for suite in ("claims", "scaling"):
        r = invoke("run", suite, "--nproc", "2", "--db", str(tmp_path / "x.db"))
        assert r.exit_code == 2 and "--nproc 2:" in r.output and "--shard" in r.output, r.output


def test_a_smoke_refuses_the_options_it_cannot_use(tmp_path):
    for suite in SUITES:
        r = invoke("run", suite, "--smoke", "--shard", "1/2", "--launcher", "slurm", "--db", str(tmp_path / "x.db"))
        assert r.exit_code == 2 and "drop --launcher, --shard" in r.output, (suite, r.output)


def test_a_gpu_precision_preset_on_the_cpu_is_refused_before_any_data(tmp_path):
    """A preset that trains in bf16 (autocast, CUDA only) is one line naming its file and the CPU routes, from every
    training suite's runner (RunContext.check_trainable), before its data are looked for."""
    import tomllib

    mixa_tiny = (Path(__file__).parents[1] / "suites" / "mixa" / "presets" / "tiny.toml").read_text()
    adala_tiny = (Path(__file__).parents[1] / "suites" / "adala" / "presets" / "tiny.toml").read_text()
    for name, text in (("mixa", mixa_tiny), ("adala", adala_tiny)):
        assert tomllib.loads(text)["vision"] == "tiny"
        (tmp_path / f"{name}-cifar.toml").write_text(text.replace('vision = "tiny"', 'vision = "cifar10"', 1))
    cases = [("vision", "cifar10", "--attn", "softmax"), ("lm", "340m", "--attn", "deltanet"),
             ("mixa", str(tmp_path / "mixa-cifar.toml")),
             ("adala", str(tmp_path / "adala-cifar.toml"), "--attn", "nala")]
    for suite, preset, *args in cases:
        r = invoke("run", suite, "--preset", preset, *args, "--db", str(tmp_path / "x.db"),
                   "--out", str(tmp_path / "out"))
        error = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
        assert r.exit_code == 2 and len(error) == 1, (suite, r.output)
        assert "precision 'bf16' is autocast on CUDA only" in error[0] and "`--smoke` to run the" in error[0], error
        assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


def test_threads_is_set_for_the_run_and_reaches_every_record(tmp_path):
    import torch

    before = torch.get_num_threads()
    want = before + 1  # a count the run would not have by itself
    preset = tmp_path / "toy.toml"
    preset.write_text(PRESET)
    db = tmp_path / "t.db"
    try:
        r = invoke("run", "lra", "--attn", "softmax", "--tasks", "listops", "--preset", str(preset), "--db", str(db),
                   "--out", str(tmp_path / "w"), "--threads", str(want))
    finally:
        torch.set_num_threads(before)
    assert r.exit_code == 0, r.output[-3000:]
    with Store(db) as s:
        (m,) = s.measurements(suite="lra")
        (run,) = s.runs()
    assert m.status == "ok" and m.metrics["threads"] == want
    assert run["host"]["threads"] == want  # the run's environment names it too
    # the machine line and the GFLOP/s stored with the run are measured at the run's count, not torch's default
    assert f"{want} thread(s)" in r.output, r.output[:500]
    assert run["host"]["machine"]["torch_threads"] == want


def test_mixa_takes_nproc_and_launcher_to_torchrun_and_the_job_launcher(tmp_path, monkeypatch):
    from attnbench.engine import sweep
    from attnbench.engine.train import dist

    db = tmp_path / "m.db"
    Store(db).close()  # the table printed after a launch reads it
    relaunched, launched = [], []
    monkeypatch.setattr(dist, "relaunch_under_torchrun",
                        lambda nproc, argv, console=None: relaunched.append(nproc) or 0)
    monkeypatch.setattr(sweep, "launch_jobs", lambda argv, **kw: launched.append(kw) or [])
    r = invoke("run", "mixa", "--nproc", "2", "--db", str(db))
    assert r.exit_code == 0 and relaunched == [2], r.output[-2000:]
    r = invoke("run", "mixa", "--launcher", "slurm", "--jobs", "3", "--out", str(tmp_path / "w"), "--db", str(db))
    assert r.exit_code == 0, r.output[-2000:]
    (kw,) = launched
    assert kw["jobs"] == 3 and kw["launcher"] == "slurm" and Path(kw["folder"]) == tmp_path / "w" / "jobs"
    r = invoke("run", "mixa", "--nproc", "0", "--db", str(db))
    assert r.exit_code == 2 and "--nproc must be >= 1" in r.output


def test_a_plugin_is_loaded_before_the_specs_are_read(tmp_path, monkeypatch):
    """Both commands in this process, the registry and the plug-in state restored after each (loading a plug-in
    changes the registry of the process that loads it)."""
    from .helpers import invoke_isolated

    example = Path(__file__).resolve().parents[1] / "examples" / "my_attention.py"
    if not example.is_file():
        pytest.skip("examples/my_attention.py not present")
    args = ["run", "lra", "--attn", "my_window,nalla", "--db", str(tmp_path / "p.db"), "--out", str(tmp_path / "w")]

    def run(*extra):
        return invoke_isolated(monkeypatch, [*args, *extra], cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})

    without, with_plugin = run(), run("--plugin", str(example))
    assert without.exit_code == 2 and "my_window" in without.output, without.output
    # with the plug-in my_window is known: the error is about the typo alone
    assert with_plugin.exit_code == 2 and "nalla" in with_plugin.output, with_plugin.output
    assert "'my_window'" not in with_plugin.output.split("nalla")[0]
    assert not (tmp_path / "p.db").exists()


def test_compile_reaches_the_trainer_and_every_record_but_not_the_identity(tmp_path, monkeypatch):
    """``--compile``: the trainer calls the model through torch.compile (stubbed here: compiling is slow and its
    numbers are torch's business), the record says so, and the cell keeps the eager run's config hash (an
    execution setting, as the thread count: the finished eager cell is skipped)."""
    import torch

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compiled.append(m) or m)
    preset = tmp_path / "toy.toml"
    preset.write_text(PRESET)
    db = tmp_path / "t.db"
    args = ("run", "lra", "--attn", "softmax", "--tasks", "listops", "--preset", str(preset), "--db", str(db),
            "--out", str(tmp_path / "w"))
    r = invoke(*args, "--compile")
    assert r.exit_code == 0, r.output[-3000:]
    assert len(compiled) == 1
    with Store(db) as s:
        (m,) = s.measurements(suite="lra")
    assert m.metrics["compile"] is True
    r = invoke(*args)
    assert r.exit_code == 0 and "already finished" in r.output, r.output[-3000:]


def test_compile_on_a_suite_that_trains_nothing_is_one_line():
    r = invoke("run", "scaling", "--attn", "softmax", "--compile")
    error = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 2 and len(error) == 1 and "--compile" in error[0], r.output
