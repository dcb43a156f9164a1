"""``attnbench doctor`` on the CPU: its plan lists every step (the GPU ones skipped with the reason), its gate refuses
to time a form whose check failed, its budget drops the longest lengths first and says so, a failure exits 1, and
what a node's versions cannot do is one line before any work (FLA's Hopper refusal)."""

from __future__ import annotations

import textwrap

import pytest
from typer.testing import CliRunner

from attnbench.cli.main import app
from attnbench.core.errors import AttnbenchError
from attnbench.ops.delta import fla_gated_backward_refusal
from attnbench.results.store import Store

from .helpers import small_doctor_preset

PLANTED = textwrap.dedent("""\
    import torch
    from attnbench import register_attention
    from attnbench.attention.base import Attention


    @register_attention
    class Planted(Attention):
        name = "planted"

        def forward_reference(self, q, k, v):
            s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            if self.causal:
                n = q.shape[-2]
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
            return s.softmax(-1) @ v

        def forward_torch(self, q, k, v):  # the planted bug: the causal form forgets its mask
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)
    """)


def doctor(*args: str):
    return CliRunner().invoke(app, ["doctor", *args])


@pytest.fixture
def small(tmp_path):
    return small_doctor_preset(tmp_path)


def test_the_plan_lists_every_step_and_the_gpu_ones_are_skipped_with_the_reason():
    r = doctor("--plan", "--preset", "h100", "--attn", "linear,nala", "--device", "cpu", "--smokes", "none")
    assert r.exit_code == 0, r.output[-3000:]
    steps = [ln.split() for ln in r.output.splitlines() if ln.startswith("  ")]
    kinds = {s[0] for s in steps}
    assert kinds == {"contract", "gate", "time"}
    assert sum(s[0] == "contract" for s in steps) == 3  # float32, float16, bfloat16
    text = r.output
    for form in ("sdpa", "attnbench.chunk_linear_attn", "fla.chunk_linear_attn", "fla.chunk_delta_rule",
                 "fla.chunk_gated_delta_rule", "attnbench.delta_rule", "linear", "nala", "nala+compile"):
        assert f"gate {form} at N=256" in text, form
    cuda_only = [ln for ln in text.splitlines() if "fla.chunk_linear_attn" in ln]
    assert cuda_only and all("skipped (needs CUDA)" in ln for ln in cuda_only)
    # every length and mode of the preset is a step of every form, run, skipped or dropped
    times = [ln for ln in text.splitlines() if ln.startswith("  time")]
    assert len(times) == 6 * 2 * 11  # 1k-32k, fwd and fwd+bwd: 7 kernel forms, 2 mechanisms, both compiled
    assert text.splitlines()[0].startswith("machine: ") and text.splitlines()[1].startswith("versions: ")


def test_the_budget_drops_the_longest_lengths_first_and_says_so():
    r = doctor("--plan", "--attn", "linear", "--device", "cpu", "--budget", "0.05")
    assert r.exit_code == 0, r.output[-3000:]
    notes = [ln for ln in r.output.splitlines() if ln.startswith("budget: dropped N=")]
    assert notes and all("to fit the 0.05 min budget" in ln for ln in notes)
    dropped_n = [int(ln.split("N=")[1].split(":")[0]) for ln in notes]
    assert dropped_n == sorted(dropped_n, reverse=True) and dropped_n[0] == 512  # the longest first
    times = [ln for ln in r.output.splitlines() if ln.startswith("  time") and "needs CUDA" not in ln]
    kept = {int(ln.split("N=")[1].split()[0]) for ln in times if ln.endswith("planned")}
    assert not kept or max(kept) < min(dropped_n)  # never a long length kept while a shorter one is dropped
    roomy = doctor("--plan", "--attn", "linear", "--device", "cpu", "--budget", "1000")
    assert roomy.exit_code == 0 and "budget: dropped" not in roomy.output and "dropped (budget" not in roomy.output


def test_the_smokes_come_last_and_get_what_the_budget_leaves():
    args = ("--plan", "--attn", "linear", "--device", "cpu", "--smokes", "lm/tiny,recall/tiny")
    r = doctor(*args, "--budget", "1000")
    kinds = [ln.split()[0] for ln in r.output.splitlines() if ln.startswith("  ")]
    assert r.exit_code == 0 and kinds[-2:] == ["smoke", "smoke"] and "smoke" not in kinds[:-2]
    assert all(ln.endswith("planned") for ln in r.output.splitlines() if ln.startswith("  smoke"))
    tight = doctor(*args, "--budget", "0.05")
    notes = [ln for ln in tight.output.splitlines() if ln.startswith("budget: dropped smoke")]
    assert [n.split()[3] for n in notes] == ["lm/tiny", "recall/tiny"]


def test_the_gate_refuses_to_time_a_wrong_form_and_the_run_exits_1(fresh, tmp_path, small):
    bad = tmp_path / "planted.py"
    bad.write_text(PLANTED)
    db = tmp_path / "d.db"
    r = doctor("--attn", "planted,linear", "--plugin", str(bad), "--device", "cpu", "--db", str(db),
               "--out", str(tmp_path / "out"), "--budget", "10", "--preset", small)
    assert r.exit_code == 1, r.output[-3000:]
    assert "gate     planted: FAILED" in r.output and "refused  time planted N=32 fwd: its gate failed" in r.output
    assert r.output.strip().splitlines()[-1].startswith("doctor: FAILED")
    with Store(db) as s:
        recs = s.measurements(suite="doctor")
    planted = [m for m in recs if m.attention == "planted"]
    assert {m.task for m in planted} == {"contract", "gate", "time"}
    assert all(m.status == "incorrect" for m in planted if m.task in ("gate", "time"))
    assert all("not timed" in m.error for m in planted if m.task == "time")
    timed = [m for m in recs if m.task == "time" and m.status == "ok"]
    assert {m.attention for m in timed} >= {"linear", "sdpa", "attnbench.delta_rule"}  # the others were timed
    assert all(m.metrics["time_median_s"] > 0 and m.metrics["nominal_flops"] > 0 for m in timed)
    summary = (tmp_path / "out" / "doctor.md").read_text()
    assert "doctor: FAILED" in summary and "| planted | fp32 | incorrect |" in summary
    # the table command reads the same records
    t = CliRunner().invoke(app, ["table", "doctor", "--db", str(db), "--format", "md"])
    assert t.exit_code == 0 and "doctor: gates" in t.output, t.output[-2000:]


def test_a_budget_reached_while_running_drops_the_remaining_timings(tmp_path, small):
    db = tmp_path / "d.db"
    r = doctor("--attn", "linear", "--device", "cpu", "--db", str(db), "--out", str(tmp_path / "o"),
               "--budget", "0.001", "--preset", small)
    assert r.exit_code == 0, r.output[-3000:]
    assert "dropped  time" in r.output or "budget: dropped N=" in r.output
    with Store(db) as s:
        recs = s.measurements(suite="doctor", task="time")
    assert recs and all(m.status == "skipped" for m in recs if m.params.get("n") == 64)
    assert r.output.strip().splitlines()[-1].startswith("doctor: OK")


def test_a_doctor_stopped_midway_keeps_its_finished_steps_and_writes_its_summary(tmp_path, small):
    """SIGTERM or Ctrl-C at a deadline (the GPU campaign's --timeout): exit 130, every finished step in the store,
    the run marked interrupted, doctor.md written from what was done."""
    from attnbench.suites.doctor.run import run_doctor

    said = []

    def say(line):
        said.append(line)
        if line.startswith("  gate     linear"):
            raise KeyboardInterrupt  # what SIGTERM raises inside the run (sigterm_as_interrupt)

    db, out = tmp_path / "d.db", tmp_path / "o"
    code = run_doctor(preset=small, attn="linear", device="cpu", db=str(db), out=str(out), say=say)
    assert code == 130
    with Store(db) as s:
        recs = s.measurements(suite="doctor")
        run = s.runs("doctor")[0]
    assert {m.task for m in recs} == {"contract", "gate"}
    assert any(m.task == "gate" and m.attention == "linear" and m.status == "ok" for m in recs)
    assert run["status"] == "interrupted" and "records kept" in run["note"]
    summary = (out / "doctor.md").read_text()
    assert "interrupted after" in summary and said[-1].startswith("doctor: OK") and "interrupted" in said[-1]


def test_bad_options_are_one_line_errors():
    for args, words in ((["--device", "tpu"], "--device must be auto, cpu or cuda"),
                        (["--smokes", "lm/nope"], "--smokes: unknown suite/preset lm/nope"),
                        (["--attn", "nalla"], "nalla"), (["--preset", "h1000"], "h1000")):
        r = doctor("--plan", *args)
        error = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
        assert r.exit_code == 2 and len(error) == 1 and words in error[0], (args, r.output[-1500:])


def test_every_smoke_names_each_preset_of_each_suite():
    from attnbench.suites.doctor.run import every_smoke

    smokes = every_smoke()
    assert {"lm/340m", "lm/tiny", "recall/zoology", "vision/imagenet1k", "claims/-"} <= set(smokes)
    assert not any(s.startswith("doctor/") for s in smokes)


@pytest.mark.parametrize("op,cap,triton,tilelang,refused", [
    ("chunk_gated_delta_rule", (9, 0), "3.6.0", False, True), ("chunk_gated_delta_rule", (9, 0), "3.4.0", False, True),
    ("chunk_gated_delta_rule", (9, 0), "3.7.1", False, False), ("chunk_gated_delta_rule", (9, 0), "3.6.0", True, False),
    ("chunk_gated_delta_rule", (8, 0), "3.6.0", False, False), ("chunk_gated_delta_rule", (9, 0), "3.3.1", False, False),
    # RetNet's chunk_simple_gla keeps float32 states in its backward, which FLA's TileLang backward does not take
    ("chunk_simple_gla", (9, 0), "3.6.0", True, True), ("chunk_simple_gla", (9, 0), "3.7.1", True, False)])
def test_fla_refusal_of_gated_backwards_on_hopper_is_known_before_a_run(op, cap, triton, tilelang, refused):
    line = fla_gated_backward_refusal("cuda", op=op, capability=cap, triton_version=triton, tilelang=tilelang)
    assert bool(line) == refused
    if refused:
        assert "issue 640" in line and "triton>=3.7.1" in line and op in line and "\n" not in line
        assert ("float32" in line) == tilelang and ("or tilelang" in line) == (not tilelang)
    assert fla_gated_backward_refusal("cpu") is None


def test_the_lm_run_stops_before_any_data_on_a_node_that_refuses_a_gated_backward(monkeypatch):
    from attnbench.ops import delta
    from attnbench.suites.lm import train
    from attnbench.suites.lm.config import load_preset, parse_variants

    monkeypatch.setattr(delta, "resolve_delta_impl", lambda device, impl: "fla")
    monkeypatch.setattr(train, "resolve_delta_impl", lambda device, impl: "fla")
    monkeypatch.setattr(delta, "fla_gated_backward_refusal", lambda device, op: "FLA refuses the gated backward")
    pre = load_preset("340m")
    train._check_fla_shapes(pre, parse_variants("deltanet,gla"), "cuda")  # neither runs the gated dqkwg
    for layer in ("gated_deltanet", "retnet"):
        with pytest.raises(AttnbenchError, match=f"{layer}: FLA refuses the gated backward"):
            train._check_fla_shapes(pre, parse_variants(f"deltanet,{layer}"), "cuda")


def test_limitations_name_the_presets_and_the_remedy(monkeypatch):
    import torch

    from attnbench.suites.doctor.node import limitations

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a GPU node compiles its kernels

    env = {"device": "cuda", "capability": [9, 0], "triton": "3.6.0", "flash-linear-attention": "0.6.0",
           "tilelang": None}
    gdn, retnet = limitations(env, torch.device("cuda"))
    assert gdn.startswith("gated_deltanet: ") and "lm 340m's gated_deltanet row" in gdn
    assert retnet.startswith("retnet: ") and "chunk_simple_gla" in retnet
    assert all("pip install 'triton>=3.7.1' or tilelang" in line for line in (gdn, retnet))
    (only,) = limitations({**env, "tilelang": "0.1.15", "tilelang_usable": True}, torch.device("cuda"))
    assert only.startswith("retnet: ") and "float32" in only
    assert limitations({**env, "triton": "3.8.0"}, torch.device("cuda")) == []


def test_the_interpreter_s_numpy_limit_is_said_up_front(monkeypatch):
    import torch

    from attnbench.suites.doctor import node

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(node, "_version", lambda dist: {"numpy": "2.4.6"}.get(dist))
    env = {"device": "cpu", "triton": "3.6.0", "flash-linear-attention": "0.6.0"}
    (line,) = node.limitations(env, torch.device("cpu"))
    assert "NumPy 2.4.6" in line and "numpy<2.4" in line and "9171" in line
    assert node.limitations({**env, "triton": "3.7.0"}, torch.device("cpu")) == []


def test_under_triton_s_interpreter_the_doctor_gates_and_times_attnbench_s_kernel_on_the_cpu(tmp_path, small):
    """The GPU steps that can run on the CPU do: attnbench's Triton kernel under the interpreter (set before triton
    is imported, so in a child process); FLA's chunk kernels query the driver and stay skipped."""
    import os
    import subprocess
    import sys

    db = tmp_path / "d.db"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "attnbench.cli.main", "doctor", "--attn", "linear", "--device", "cpu",
                        "--db", str(db), "--out", str(tmp_path / "o"), "--budget", "10", "--preset", small], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "gate     attnbench.chunk_linear_attn: ok" in r.stdout
    with Store(db) as s:
        recs = s.measurements(suite="doctor")
    ours = [m for m in recs if m.attention == "attnbench.chunk_linear_attn" and m.task == "time"]
    assert ours and {m.status for m in ours} == {"ok"}
    assert all(m.status == "skipped" and m.error == "needs CUDA" for m in recs if m.attention.startswith("fla."))
