"""Options of the attnbench micro-benchmarks (``pytest benchmarks``); each has an environment variable too."""

from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

OPTIONS = {
    # option: (environment variable, default, help)
    "--attn-seq": ("ATTNBENCH_BENCH_SEQ", "1k,4k", "comma-separated sequence lengths, e.g. 1k,4k,16k,64k"),
    "--attn-names": ("ATTNBENCH_BENCH_ATTN", "", "comma-separated attentions (default: every registered one)"),
    "--attn-mode": ("ATTNBENCH_BENCH_MODE", "fwd", "fwd or fwd+bwd"),
    "--attn-causal": ("ATTNBENCH_BENCH_CAUSAL", "0", "1: causal forms (bidirectional-only mechanisms skip)"),
    "--attn-dtype": ("ATTNBENCH_BENCH_DTYPE", "fp32", "fp32, bf16, fp16 or fp64"),
    "--attn-shape": ("ATTNBENCH_BENCH_SHAPE", "1,4,64", "batch,heads,head_dim"),
    "--attn-threads": ("ATTNBENCH_BENCH_THREADS", "1", "torch threads (0: torch's default, all cores)"),
    "--attn-plugin": ("ATTNBENCH_PLUGINS", "", "a plug-in to load before --attn-names is read: a file, folder or "
                      "module registering attentions (attnbench's --plugin); repeatable, or several separated as "
                      "PATH is"),
}


def pytest_addoption(parser):
    group = parser.getgroup("attnbench", "attnbench micro-benchmarks")
    for opt, (env, default, help_) in OPTIONS.items():
        extra = {"action": "append"} if opt == "--attn-plugin" else {}
        group.addoption(opt, default=None, help=f"{help_} (env {env}; default {default!r})", **extra)


def bench_option(config, opt: str) -> str:
    """Command-line option, else its environment variable, else the default."""
    env, default, _ = OPTIONS[opt]
    value = config.getoption(opt.lstrip("-").replace("-", "_"))
    if isinstance(value, list):  # a repeatable option
        value = os.pathsep.join(value)
    if value is None:
        value = os.environ.get(env, default)
    return value


def pytest_configure(config):
    # resolved once; the test module reads config.attnbench_bench (no import of this conftest needed)
    config.attnbench_bench = {opt.lstrip("-")[5:]: bench_option(config, opt) for opt in OPTIONS}
    sources = [s for s in config.attnbench_bench["plugin"].split(os.pathsep) if s.strip()]
    if sources:  # registered (and exported to child processes) before the benchmarks are parametrized
        import pytest

        from attnbench.api import plugins

        try:
            plugins.activate(sources)
        except plugins.PluginError as e:  # one line, as attnbench's --plugin
            raise pytest.UsageError(str(e)) from None


def _machine(config) -> dict:
    """:func:`attnbench.results.provenance.machine` with the benchmarks' thread count, measured once per session."""
    if not hasattr(config, "attnbench_machine"):
        from attnbench.results.provenance import machine

        threads = int(config.attnbench_bench["threads"])
        config.attnbench_machine = machine(threads=threads or None)
    return config.attnbench_machine


def pytest_report_header(config):
    """The machine the benchmarks run on, at the top of the session (CPU, ISA, threads, fp32 matmul GFLOP/s)."""
    from attnbench.results.provenance import machine_line

    return machine_line(_machine(config))


def pytest_benchmark_update_machine_info(config, machine_info):
    """The same, in the saved JSON (``attnbench ingest`` records it with the run)."""
    machine_info["attnbench"] = _machine(config)
