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

# Under pytest-xdist each worker has a core of its own: one thread each, in this process and in the commands the
# tests start (threads spinning on a core another worker holds make a run many times slower).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))


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


# The longest tests (a minute or more on one core) start first, so that under pytest-xdist no worker is left
# running one of them alone at the end.
LONGEST_FIRST = (
    "tests/test_vision_run.py::test_the_tiny_preset_learns_the_digits_through_the_cli",
    "tests/test_aot.py",
    "tests/test_vision_run.py::test_two_gloo_processes_match_one",
    "tests/test_lm.py::test_two_gloo_processes_match_one",
    "tests/test_vision_run.py::test_the_teacher_is_found_in_the_store_or_trained_first",
    "tests/test_adala.py::test_end_to_end_cli_records",
    "tests/test_plugins.py::test_scaling_under_submitit_reruns_a_cell_when_the_plugin_changes",
    "tests/test_lm_eval.py::test_lm_eval_cli_offline_subprocess",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        for i, prefix in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order
