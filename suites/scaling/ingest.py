"""``attnbench ingest`` of pytest-benchmark JSON files (``pytest benchmarks --benchmark-json``): the scaling
suite's ingester (``Suite.ingest``), tried by :func:`attnbench.results.ingest.ingest` after the store's own formats.

Benchmarks of ``benchmarks/test_attention_bench.py`` (``extra_info["attnbench"]`` set) become ``scaling``
records in setting ``pytest-benchmark[b.,h.,d.]``; any other benchmark of the file becomes a record of suite
``pytest-benchmark`` named after the test. Torch-free.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnbench.core.errors import AttnbenchError
from attnbench.results import provenance
from attnbench.results.records import Measurement
from attnbench.results.store import Store

SUITE = "scaling"
PYTEST_BENCHMARK_SETTING = "pytest-benchmark"


def _read_json(path: str | os.PathLike) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AttnbenchError(f"{path}: not valid JSON ({e})") from None


def is_pytest_benchmark(data: Any) -> bool:
    """Whether parsed JSON is a pytest-benchmark file: an object with a ``benchmarks`` list."""
    return isinstance(data, dict) and isinstance(data.get("benchmarks"), list)


def ingest(path: str | os.PathLike, store: Store) -> str | None:
    """The suite's ingester: a pytest-benchmark JSON into ``store`` (a summary line), None for a file of another
    format. A ``.json`` file that does not parse is an error naming the file (a damaged or truncated file)."""
    if Path(path).suffix.lower() != ".json":
        try:
            data = json.loads(Path(path).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
    else:
        data = _read_json(path)
    if not is_pytest_benchmark(data):
        return None
    run_id, n = ingest_pytest_benchmark(path, store)
    return (f"ingested {n} benchmark(s) from {path} into {store.path} (run {run_id})"
            + ("" if n else " — already ingested"))


def ingest_pytest_benchmark(path: str | os.PathLike, store: Store) -> tuple[str, int]:
    """Bring a pytest-benchmark JSON (``--benchmark-json`` or a saved ``.benchmarks/*/NNNN_*.json``) into
    ``store``; returns ``(run_id, records added)``. Idempotent: a file already ingested adds nothing.

    Benchmarks of ``benchmarks/test_attention_bench.py`` (``extra_info["attnbench"]`` set) become suite
    ``scaling`` records in setting ``pytest-benchmark[b.,h.,d.]`` with their attention, impl, task, N, dtype and
    FLOPs; any other benchmark becomes a suite ``pytest-benchmark`` record named after the test.
    """
    data = _read_json(path)
    if not is_pytest_benchmark(data):
        raise AttnbenchError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' list)")
    machine = data.get("machine_info") or {}
    commit = data.get("commit_info") or {}
    stamp = data.get("datetime") or provenance.now()
    names = sorted(b.get("fullname", b.get("name", "")) for b in data["benchmarks"])
    run_id = "pb-" + provenance.config_hash({"datetime": stamp, "node": machine.get("node"), "names": names})
    already = store.has_run(run_id)
    if already and store.measurements(run_id=run_id):
        return run_id, 0
    cpu = machine.get("cpu") or {}
    packages = {"python": machine.get("python_version")} if machine.get("python_version") else {}
    env = {"git_commit": commit.get("id"), "git_dirty": commit.get("dirty"), "packages": packages,
           "device": "cpu", "device_name": cpu.get("brand_raw") or machine.get("processor"),
           "host": {"node": machine.get("node"), "machine": machine.get("machine"), "cpus": cpu.get("count")}}
    if machine.get("attnbench"):  # benchmarks/conftest.py adds provenance.machine() (ISA, matmul GFLOP/s)
        env["host"]["machine_info"] = machine["attnbench"]
    records = []
    for b in data["benchmarks"]:
        info = b.get("extra_info") or {}
        st = b.get("stats") or {}
        metrics = {"time_median_s": st.get("median"), "time_q25_s": st.get("q1"), "time_q75_s": st.get("q3"),
                   "time_iqr_s": st.get("iqr"), "time_min_s": st.get("min"), "time_mean_s": st.get("mean"),
                   "time_stddev_s": st.get("stddev"), "reps": st.get("rounds")}
        ours = bool(info.get("attnbench"))
        if ours:
            pk = {**packages, **(info.get("packages") or {})}
            if info.get("flops") and st.get("median"):
                metrics["flops"] = info["flops"]
                metrics["gflops"] = info["flops"] / st["median"] / 1e9
            for key in ("check_err", "check_tol"):
                if key in info:
                    metrics[key] = info[key]
            params = {k: info[k] for k in ("seq_len", "mode", "causal", "batch", "heads", "head_dim", "threads")
                      if k in info}
            setting = (f"{PYTEST_BENCHMARK_SETTING}[b{info.get('batch')},h{info.get('heads')},"
                       f"d{info.get('head_dim')}]")
            m = Measurement(suite=SUITE, task=info.get("task") or b.get("group") or "fwd/bidir", setting=setting,
                            attention=info.get("attention") or b.get("name"), status="ok",
                            device=info.get("device", "cpu"), options=info.get("options") or {},
                            impl=info.get("impl"), dtype=info.get("dtype"), params=params, metrics=metrics,
                            seed=info.get("seed"), git_commit=env["git_commit"], git_dirty=env["git_dirty"],
                            packages=pk, device_name=env["device_name"], started_at=stamp, ended_at=stamp,
                            source="pytest-benchmark", run_id=run_id)
        else:
            m = Measurement(suite="pytest-benchmark", task=b.get("group") or "benchmark",
                            setting=PYTEST_BENCHMARK_SETTING, attention=b.get("name") or "?", status="ok",
                            device="cpu", params=dict(b.get("params") or {}), metrics=metrics,
                            git_commit=env["git_commit"], git_dirty=env["git_dirty"], packages=packages,
                            device_name=env["device_name"], started_at=stamp, ended_at=stamp,
                            source="pytest-benchmark", run_id=run_id)
        records.append(m)
    if not already:  # (a run row without records: an ingest killed half-way; its records are added now)
        store.start_run(suite=SUITE if any(r.suite == SUITE for r in records) else "pytest-benchmark",
                        setting=PYTEST_BENCHMARK_SETTING, config={"file": str(path)}, source="pytest-benchmark",
                        env=env, run_id=run_id)
    store.add_many(records)
    store.finish_run(run_id, "ok")
    return run_id, len(records)


