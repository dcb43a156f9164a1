"""The import contract of tests/import_graph.py holds for the sources, and fails on a planted breach."""

import shutil

import pytest

from . import import_graph as graph


@pytest.fixture(scope="module")
def sources():
    return graph.read()


def test_every_module_belongs_to_a_layer(sources):
    for m in sources.modules:
        graph.unit_of(m)


def test_imports_go_down_the_layers(sources):
    assert graph.wrong_way(sources) == []


def test_no_import_cycle(sources):
    assert graph.cycles(sources) == []


def test_imports_inside_functions_keep_a_module_light(sources):
    """Outside the command line (whose commands import the work they run when they run), an import inside a
    function must keep a heavy dependency out of its module."""
    lazy = [line for line in graph.needless_lazy_imports(sources)
            if graph.unit_of(line.split(" ", 1)[0])[1] not in ("cli", "facade")]
    assert lazy == []


def test_no_suite_imports_another(sources):
    def suite(m):
        parts = m.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "suites" else None

    crossing = [e for e in sources.edges if suite(e.source) and suite(e.target) and suite(e.source) != suite(e.target)]
    assert crossing == []


def test_the_command_line_stays_free_of_heavy_imports(sources):
    """``attnbench --help`` and ``list`` answer without torch: the CLI layer brings nothing heavy at import."""
    for m in sources.modules:
        if graph.unit_of(m)[1] == "cli":
            assert sources.heavy_closure(m) == set(), m


@pytest.fixture
def planted(tmp_path):
    """A copy of the sources, to plant breaches in."""
    for folder in graph.SOURCES:
        shutil.copytree(graph.ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))

    def plant(relpath: str, code: str):
        p = tmp_path / relpath
        p.write_text(p.read_text() + "\n" + code + "\n")
        return graph.read(tmp_path)

    return plant


def test_a_planted_reverse_import_is_caught(planted):
    g = planted("attnbench/ops/threads.py", "from attnbench.cli import kit")
    assert any("attnbench.ops.threads" in w and "attnbench.cli.kit" in w for w in graph.wrong_way(g))


def test_a_planted_sibling_import_is_caught(planted):
    g = planted("attnbench/results/stats.py", "from attnbench.measure import timing")
    assert any("attnbench.results.stats" in w for w in graph.wrong_way(g))


def test_a_planted_cycle_is_caught(planted):
    g = planted("attnbench/engine/argv.py", "def f():\n    from attnbench.engine import sweep")
    assert any("attnbench.engine.argv" in c for c in graph.cycles(g))


def test_a_planted_needless_lazy_import_is_caught(planted):
    g = planted("attnbench/results/stats.py", "def f():\n    from attnbench.core import errors")
    assert any(w.startswith("attnbench.results.stats") for w in graph.needless_lazy_imports(g))
