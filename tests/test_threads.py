"""The thread-count policy of the CPU paths with many small ops (attnbench/ops/threads.py)."""

from __future__ import annotations

import pytest
import torch

from attnbench.ops import threads


@pytest.mark.parametrize("others, expected", [(0, 2), (1, 1), (2, 1), (5, 1)])
def test_threads_for_load_uses_the_idle_cpus_and_one_thread_when_all_are_shared(monkeypatch, others, expected):
    """Two CPUs: none busy elsewhere -> every thread; one busy -> the idle one; all busy -> one thread (a region's
    barrier would wait for a descheduled thread); the count is restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(threads, "_others_running", lambda: others)
        monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
        with threads.threads_for_load() as n:
            assert n == expected == torch.get_num_threads()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


def test_one_thread_runs_the_block_on_one_thread_and_restores_the_count():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threads.one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with threads.one_thread(active=False):
            assert torch.get_num_threads() == 2
        with pytest.raises(RuntimeError), threads.one_thread():
            raise RuntimeError("restored even on an error")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
