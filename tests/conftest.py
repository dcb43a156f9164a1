"""Test-wide environment: set before anything imports triton or the HF libraries."""

import os

# No GPU where attnbench is tested: Triton kernels run under the interpreter. Must be set before triton is
# imported (kernels are decorated at import time).
os.environ.setdefault("TRITON_INTERPRET", "1")
# No hub: the HF libraries read these once, at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def tmp_db(tmp_path, monkeypatch):
    """A results store in a temporary directory (never the user's results/attnbench.db)."""
    path = tmp_path / "attnbench.db"
    monkeypatch.setenv("ATTNBENCH_DB", str(path))
    return path
