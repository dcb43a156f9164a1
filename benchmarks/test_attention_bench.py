"""pytest-benchmark over the registry × N: ``pytest benchmarks`` (grouped by task and N).

Every registered attention (or ``--attn-names``) at every N of ``--attn-seq`` (default 1k,4k; widen with
``--attn-seq 1k,4k,16k,64k`` or ``ATTNBENCH_BENCH_SEQ``). Each benchmark is gated: the resolved fast form must
match ``module.reference`` at a small shape first (:func:`attnbench.checks.verify.verify_resolved`), or the test fails
without timing. Compare attentions within a group, and commits with the usual pytest-benchmark flags::

    pytest benchmarks --benchmark-autosave                 # save a run under .benchmarks/
    pytest benchmarks --benchmark-compare                  # compare against the last saved run
    pytest benchmarks --benchmark-json out.json && attnbench ingest out.json   # into the results store

``extra_info`` carries what ``attnbench ingest`` needs (attention, impl, task, N, shape, dtype, FLOPs, packages).
"""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench.results import provenance
from attnbench.api import registry
from attnbench.measure.flops import count_flops
from attnbench.measure.timing import MODES, make_step, parse_dtype
from attnbench.checks.verify import verify_resolved
from attnbench.suites.scaling.config import parse_seq_list, task_name


def _config(config) -> dict:
    opts = config.attnbench_bench  # resolved by benchmarks/conftest.py: option, else env, else default
    batch, heads, head_dim = (int(x) for x in opts["shape"].split(","))
    names = [n.strip() for n in opts["names"].split(",") if n.strip()]
    for n in names:
        registry.get_attention(n)
    mode = opts["mode"]
    if mode not in MODES:
        raise pytest.UsageError(f"--attn-mode must be one of {MODES}, got {mode!r}")
    return {"names": names or attnbench.names(), "seq": parse_seq_list(opts["seq"]), "mode": mode,
            "causal": opts["causal"].lower() in ("1", "true", "yes"), "dtype": opts["dtype"], "batch": batch,
            "heads": heads, "head_dim": head_dim}


def pytest_generate_tests(metafunc):
    if "point" in metafunc.fixturenames:
        cfg = _config(metafunc.config)
        metafunc.parametrize("point", [pytest.param((name, n), id=f"N{n}-{name}")
                                       for n in cfg["seq"] for name in cfg["names"]])


@pytest.fixture(scope="session")
def cfg(pytestconfig) -> dict:
    threads = int(pytestconfig.attnbench_bench["threads"])
    if threads:
        torch.set_num_threads(threads)
    return _config(pytestconfig)


def test_attention(benchmark, point, cfg):
    name, n = point
    mode, causal, dtype = cfg["mode"], cfg["causal"], cfg["dtype"]
    task = task_name(mode, causal)
    benchmark.group = f"{task} {dtype} N={n}"
    desc = registry.describe(name)
    if (causal and not desc["causal"]) or (not causal and not desc["bidirectional"]):
        pytest.skip(f"{name} has no {'causal' if causal else 'bidirectional'} form")

    # the gate: no timing on a red check
    tdtype = parse_dtype(dtype)
    grad = mode == "fwd+bwd"
    check = verify_resolved(name, heads=cfg["heads"], head_dim=cfg["head_dim"], causal=causal, dtype=tdtype,
                            grads=grad)
    assert check.ok, f"correctness gate failed, not timed: {check.detail}"

    module = registry.build_for_length(name, seq_len=n, heads=cfg["heads"], head_dim=cfg["head_dim"], causal=causal)
    shape = (cfg["batch"], cfg["heads"], n, cfg["head_dim"])
    q, k, v = (torch.randn(shape, dtype=tdtype).requires_grad_(grad) for _ in range(3))
    g = torch.randn(shape, dtype=tdtype) if grad else None

    step = make_step(module, q, k, v, g)

    flops = count_flops(step)
    benchmark.extra_info.update({
        "attnbench": 1, "attention": name, "impl": module.resolve_impl("cpu"), "task": task, "mode": mode,
        "causal": causal, "seq_len": n, "batch": cfg["batch"], "heads": cfg["heads"], "head_dim": cfg["head_dim"],
        "dtype": dtype, "device": "cpu", "threads": torch.get_num_threads(), "flops": flops, "options": {},
        "check_err": check.err, "check_tol": check.bound, "packages": provenance.package_versions(),
    })
    benchmark(step)
