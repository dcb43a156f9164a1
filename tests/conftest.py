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


# Under pytest-xdist (`-n 2 --dist worksteal`) each worker starts with half of this order and an idle worker takes
# tests from the end of the other's queue. The longest test starts first; next the files whose module fixtures are
# costly (a file's tests stay together on the front of a queue, so their fixture is built once); the short tests
# come last, where they balance the two workers.
FIRST = ("tests/test_vision_run.py::test_the_tiny_preset_learns_the_digits_through_the_cli",
         "tests/test_aot.py", "tests/test_adala.py", "tests/test_lm_eval.py", "tests/test_plugins.py",
         "tests/test_lm.py", "tests/test_train.py", "tests/test_vision_run.py", "tests/test_engine_cli.py",
         "tests/test_smoke.py")


@pytest.fixture
def fresh(monkeypatch):
    """The registry and the plug-in state as they are now, restored after the test; ATTNBENCH_PLUGINS unset."""
    from .helpers import isolate_plugins

    return isolate_plugins(monkeypatch)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        return next((i for i, prefix in enumerate(FIRST) if item.nodeid.startswith(prefix)), len(FIRST))

    items.sort(key=rank)  # stable: every other test keeps its order
