"""Thread counts: no op chooses its own from the machine's load (attnbench/ops/threads.py); the run sets the
count once (attnbench.engine.sweep.run_sweep) and every record carries it (attnbench.results.store.Run.record)."""

from __future__ import annotations

import builtins
import io
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from rich.console import Console

from attnbench.ops import threads
from attnbench.ops.delta import delta_rule_chunked
from attnbench.ops.linear_attn import TokenMap, linear_attention_blocked, linear_attention_recomputed, token_blocks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield 2
    finally:
        torch.set_num_threads(old)


def test_one_thread_runs_the_block_on_one_thread_and_restores_the_count(two_threads):
    with threads.one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with threads.one_thread(active=False):
        assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), threads.one_thread():
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


@pytest.fixture
def busy_machine(monkeypatch):
    """A machine that looks fully busy to anyone who asks (/proc/loadavg, os.getloadavg, the task states),
    and a log of every thread-count change and every such question."""
    log = {"set": [], "asked": []}
    real_open, real_set = builtins.open, torch.set_num_threads

    def fake_open(file, *args, **kwargs):
        name = os.fspath(file) if isinstance(file, (str, os.PathLike)) else ""
        if isinstance(name, str) and name.startswith("/proc/") and ("loadavg" in name or "/task" in name
                                                                     or name.endswith("/stat")):
            log["asked"].append(name)
            return io.StringIO("8.00 8.00 8.00 9/400 12345\n" if "loadavg" in name else "1 (x) R 0\n")
        return real_open(file, *args, **kwargs)

    def spy_set(n):
        log["set"].append(n)
        real_set(n)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0), raising=False)
    monkeypatch.setattr(torch, "set_num_threads", spy_set)
    return log


def _forward_backward_of_the_many_op_paths():
    g = torch.Generator().manual_seed(0)
    B, H, N, D = 1, 2, 37, 8                                                    # N: several odd-sized blocks
    q, k, v = (torch.randn(B, H, N, D, generator=g, requires_grad=True) for _ in range(3))
    phi = lambda x, s=0: F.elu(x) + 1                                           # noqa: E731
    for causal in (False, True):                                                # the blocked op
        out = linear_attention_blocked(token_blocks(phi(q), 8), token_blocks(phi(k), 8), v, causal=causal,
                                       block_size=8, chunk_size=4)
        out.square().sum().backward()
    out = linear_attention_recomputed(TokenMap(phi), TokenMap(phi), q, k, v, block_size=8)  # recomputing backward
    out.square().sum().backward()
    beta = torch.rand(B, H, N, generator=g).requires_grad_()                    # the chunked delta rule
    gate = (-torch.rand(B, H, N, generator=g)).requires_grad_()
    for gt in (None, gate):
        o, _ = delta_rule_chunked(q, F.normalize(k, dim=-1), v, beta, gt, chunk_size=8, block_bytes=1)
        o.square().sum().backward()                                             # (block_bytes=1: a chunk a block)
    with torch.no_grad():
        delta_rule_chunked(q, F.normalize(k, dim=-1), v, beta, chunk_size=8)


def test_no_op_reads_the_load_or_keeps_a_thread_count_of_its_own_on_a_busy_machine(two_threads, busy_machine):
    _forward_backward_of_the_many_op_paths()
    assert busy_machine["asked"] == []                                 # the machine's load is never read
    assert torch.get_num_threads() == two_threads
    # the only changes: the delta rule's triangular solve on one thread, restored right after (one_thread)
    assert busy_machine["set"], "the delta rule's solve no longer runs under one_thread: update this test"
    assert busy_machine["set"] == [1, two_threads] * (len(busy_machine["set"]) // 2)


def test_no_op_source_reads_the_load_or_sets_a_thread_count():
    """Static: the paths the test above does not run (every attention, the kernels) hold no load probe, and
    only ops/threads.py (one_thread) sets a thread count."""
    probes = ("loadavg", "getloadavg", "sched_getaffinity", "set_num_threads", "set_num_interop_threads")
    found = []
    for folder in ("attnbench/ops", "attnbench/attention", "kernels"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            found += [f"{path.relative_to(ROOT)}: {p}" for p in probes if p in text
                      and not (path.name == "threads.py" and p == "set_num_threads")]
    assert found == []
    assert "loadavg" not in (ROOT / "attnbench/ops/threads.py").read_text()


def test_the_run_sets_the_thread_count_once_and_every_record_carries_it(tmp_path, two_threads):
    from attnbench.results.store import Store
    from attnbench.engine.sweep import Cell, CellResult, run_sweep

    seen = []

    def run_cell(cell, ctx):
        seen.append(torch.get_num_threads())
        if cell.task == "child":                                       # measured elsewhere under its own count
            return CellResult("ok", metrics={"threads": 3})
        if cell.task == "bad":
            raise ValueError("a failed cell is recorded too")
        return CellResult("ok", metrics={"x": 1.0})

    cells = [Cell(task=t, attention="a", config_hash=f"{i:016x}") for i, t in enumerate(("plain", "child", "bad"))]
    db = tmp_path / "t.db"
    run_sweep(cells, run_cell, suite="demo", setting="demo/x", db=str(db), threads=1,
              console=Console(file=io.StringIO()), progress=False)
    assert seen == [1, 1, 1]                                           # set once, before the first cell
    with Store(db) as s:
        recs = {m.task: m for m in s.measurements(suite="demo")}
    assert recs["plain"].metrics["threads"] == 1 and recs["plain"].metrics["x"] == 1.0
    assert recs["plain"].metrics["interop_threads"] == torch.get_num_interop_threads() >= 1
    assert recs["bad"].status == "failed" and recs["bad"].metrics["threads"] == 1
    assert recs["child"].metrics["threads"] == 3 and "interop_threads" not in recs["child"].metrics
    torch.set_num_threads(2)
    run_sweep(cells[:1], run_cell, suite="demo", setting="demo/y", db=str(db), force=True,   # no count: as is
              console=Console(file=io.StringIO()), progress=False)
    assert seen[-1] == 2 == torch.get_num_threads()
