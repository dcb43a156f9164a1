"""The import graph of attnbench's sources, read with ``ast`` (nothing is imported), and the contract it must meet.

The contract (:data:`LAYERS`): imports go one way, from a layer to the layers below it, never up and never between
the independent packages of one layer; the graph has no cycle (imports inside functions included); an import
inside a function is there only to keep a module light, so its target must bring a heavy dependency
(:data:`HEAVY`: torch or an optional extra) that the importing module does not already bring.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the package it installs as (pyproject's package-dir)
SOURCES = {"attnbench": "attnbench", "kernels": "attnbench.kernels", "suites": "attnbench.suites"}

# Top to bottom. Each inner list is one layer; each entry of a layer is one unit (a name and its module
# patterns): a unit imports its own modules and those of the layers below, never a unit of its own layer. A
# pattern covers a module and the modules under it; ``*`` stands for one name; a trailing ``$`` means that module
# alone.
LAYERS: list[list[tuple[str, tuple[str, ...]]]] = [
    [("facade", ("attnbench$",))],                     # the package's own __init__: the public names
    # the command line, and each suite's registration (its __init__, which hands its commands to the CLI)
    [("cli", ("attnbench.cli", "attnbench.suites.*$", "attnbench.suites.*.cli", "attnbench.suites.lm.eval_cli"))],
    [("suites", ("attnbench.suites",))],               # each suite: presets, runner, leaderboard
    [("image", ("attnbench.image",))],                 # image classification shared by the vision suites
    [("views", ("attnbench.views",))],
    [("engine", ("attnbench.engine",))],
    [("results", ("attnbench.results",)), ("checks", ("attnbench.checks",)), ("measure", ("attnbench.measure",))],
    [("models", ("attnbench.models",))],
    [("api", ("attnbench.api",))],
    [("attention", ("attnbench.attention",))],
    [("ops", ("attnbench.ops",))],
    [("io", ("attnbench.io",))],
    [("core", ("attnbench.core",))],
    [("kernels", ("attnbench.kernels",))],
]

# What makes a module heavy to import: torch, and the optional extras of pyproject.
HEAVY = {"torch", "triton", "fla", "lm_eval", "datasets", "transformers", "timm", "torchvision", "sklearn",
         "submitit", "playwright", "scipy", "matplotlib", "jinja2"}


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str       # importing module
    target: str       # imported attnbench module
    top: bool         # at module level (else inside a function or class body)
    line: int


@dataclasses.dataclass
class Graph:
    modules: dict[str, Path]
    edges: list[Edge]
    heavy: dict[str, set[str]]   # module -> heavy packages it imports at module level (not transitively)

    def heavy_closure(self, module: str) -> set[str]:
        """The heavy packages importing ``module`` brings: its own and those of its module-level imports."""
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        todo = [p for p in (module.rsplit(".", i)[0] for i in range(module.count(".") + 1)) if p in self.modules]
        seen, out = set(todo), set()
        top = {}
        for e in self.edges:
            if e.top:
                top.setdefault(e.source, set()).add(e.target)
        while todo:
            m = todo.pop()
            out |= self.heavy.get(m, set())
            for t in top.get(m, ()):
                parents = [t.rsplit(".", i)[0] for i in range(t.count(".") + 1)]
                for p in parents:
                    if p in self.modules and p not in seen:
                        seen.add(p)
                        todo.append(p)
        return out


def module_name(path: Path, folder: Path, package: str) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, modules: dict[str, Path]) -> list[str]:
    """The attnbench modules an absolute import statement loads (relative imports are not used in the core)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.level == 0 and node.module:
        names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                 for a in node.names]
    else:  # a suite's relative import of its own module
        return []
    out = []
    for n in names:
        while n and n not in modules:
            n = n.rpartition(".")[0]
        if n.startswith("attnbench"):
            out.append(n)
    return out


def read(root: Path = ROOT) -> Graph:
    modules: dict[str, Path] = {}
    for folder, package in SOURCES.items():
        for p in sorted((root / folder).rglob("*.py")):
            modules[module_name(p, root / folder, package)] = p
    edges, heavy = [], {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_pkg = path.name == "__init__.py"
        top_nodes = set()
        for stmt in tree.body:  # module level, including try/except and if blocks
            top_nodes |= {id(n) for n in ast.walk(stmt)} if isinstance(stmt, (ast.If, ast.Try)) else {id(stmt)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            top = id(node) in top_nodes
            if isinstance(node, ast.ImportFrom) and node.level:  # relative: resolve against this package
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
                node = ast.ImportFrom(module=mod, names=node.names, level=0, lineno=node.lineno)
            if top:
                firsts = [a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import) \
                    else [(node.module or "").split(".")[0]]
                heavy.setdefault(name, set()).update(f for f in firsts if f in HEAVY)
            edges += [Edge(name, t, top, node.lineno) for t in _targets(node, modules) if t != name]
    return Graph(modules, edges, heavy)


def _matches(module: str, pattern: str) -> bool:
    exact = pattern.endswith("$")
    pat, mod = pattern.rstrip("$").split("."), module.split(".")
    if len(mod) < len(pat) or (exact and len(mod) != len(pat)):
        return False
    return all(fnmatch.fnmatchcase(m, p) for m, p in zip(mod, pat))


def unit_of(module: str) -> tuple[int, str]:
    """(layer index, unit name) of a module: the unit with the longest matching pattern."""
    best = None
    for i, layer in enumerate(LAYERS):
        for unit, patterns in layer:
            for pat in patterns:
                if _matches(module, pat) and (best is None or len(pat) > best[0]):
                    best = (len(pat), i, unit)
    if best is None:
        raise LookupError(f"{module} belongs to no layer of tests/import_graph.LAYERS: add it to one")
    return best[1], best[2]


def wrong_way(graph: Graph) -> list[str]:
    """Every import that goes up a layer or across to another unit of the same layer."""
    out = []
    for e in graph.edges:
        (la, ua), (lb, ub) = unit_of(e.source), unit_of(e.target)
        if lb < la or (lb == la and ua != ub):
            out.append(f"{e.source} (line {e.line}) imports {e.target}: {ua} may import only the layers below it")
    return sorted(set(out))


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (imports inside functions included)."""
    succ: dict[str, set[str]] = {m: set() for m in graph.modules}
    for e in graph.edges:
        succ[e.source].add(e.target)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in graph.modules:
        if m not in index:
            visit(m)
    return out


def needless_lazy_imports(graph: Graph) -> list[str]:
    """Imports inside functions whose target brings no heavy dependency the importing module lacks: they belong
    at the top of the module."""
    out = []
    for e in graph.edges:
        if not e.top and not (graph.heavy_closure(e.target) - graph.heavy_closure(e.source)):
            out.append(f"{e.source} (line {e.line}) imports {e.target} inside a function, yet it brings nothing "
                       f"heavy that {e.source} lacks: import it at the top")
    return sorted(set(out))
