"""benchmarks/bench_train_step.py: --breakdown's kinds account for the whole profiled step, --reference-forms are
timed and put back, a bad option is a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .helpers import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_train_step.py"
bench = load_file("_attnbench_bench_train_step", SCRIPT)


def test_each_event_has_its_kind():
    kinds = {"aten::bmm": "products", "aten::convolution_backward": "products",
             "aten::linalg_solve_triangular": "solve", "aten::mul": "elementwise", "aten::silu_backward": "elementwise",
             "aten::copy_": "copies and layout", "aten::cumsum": "reductions and scans",
             "aten::_foreach_addcdiv_": "optimizer", "Optimizer.step#AdamW.step": "optimizer",
             "autograd::engine::evaluate_function: MulBackward0": "autograd engine",
             "NaLaMapBlockedFunctionBackward": "other", "aten::no_such_op": "other"}
    assert {key: bench._kind(key) for key in kinds} == kinds


def test_breakdown_shares_add_up_to_the_step(capsys):
    threads = torch.get_num_threads()
    try:  # the script sets its thread count for the process
        assert bench.main(["--suites", "recall", "--recall", "softmax", "--breakdown"]) == 0
    finally:
        torch.set_num_threads(threads)
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("recall")]
    shares = [float(s.rstrip("%")) for s in row[3:11]]
    assert row[1] == "softmax" and float(row[2]) > 0
    assert abs(sum(shares) - 100) <= 1 and shares[0] > 0   # products are part of any step
    assert "mul" in " ".join(row[11:])                      # the costliest non-products are named


def test_reference_forms_are_timed_beside_the_fast_ones_and_put_back(capsys):
    """``--reference-forms``: inside the block the model calls the reference forms, after it the fast ones again;
    each row gets the fast step's ratio to the reference forms' step."""
    from attnbench.models import mixers

    fast = (mixers.rotary, mixers.ShortConv.forward)
    with bench.reference_forms():
        assert (mixers.rotary, mixers.ShortConv.forward) == (mixers.rotary_reference,
                                                              mixers.ShortConv.forward_reference)
    assert (mixers.rotary, mixers.ShortConv.forward) == fast
    threads = torch.get_num_threads()
    try:
        assert bench.main(["--suites", "recall", "--recall", "softmax", "--reference-forms", "--repeats", "2"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "fast / reference forms" in out
    (row,) = [line.split() for line in out.splitlines() if line.startswith("recall")]
    assert row[1] == "softmax" and float(row[-1]) > 0
    assert (mixers.rotary, mixers.ShortConv.forward) == fast


NO_CUDA = "--device cuda: this torch sees no CUDA device"


@pytest.mark.parametrize("argv, says", [
    (["--compile", "fast"], "--compile: unknown mode fast"),
    (["--device", "nowhere"], "--device: 'nowhere' is not a device"),
    (["--device", "cuda", "--clock", "cpu"], "--clock cpu times this process's CPU only"),
])
def test_bad_options_are_one_line_errors(argv, says, capsys):
    if "cuda" in argv and not torch.cuda.is_available():
        says = NO_CUDA              # said first: without a GPU the clock is not the problem
    assert bench.main(["--suites", "recall", "--recall", "softmax", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(says) and "\n" not in err


def test_round_robin_times_each_call_with_its_sync():
    """``sync`` runs inside each timed span (a device's queued work is timed with the call that queued it) and
    after the warm-up."""
    from attnbench.measure.timing import round_robin

    calls = []
    t = round_robin({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=2, warmup=1,
                    sync=lambda: calls.append("sync"))
    assert calls == ["a", "b", "sync", "a", "sync", "b", "sync", "a", "sync", "b", "sync"]
    assert set(t) == {"a", "b"} and all(v >= 0 for v in t.values())
