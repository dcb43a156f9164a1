"""Every Python package in the source tree is listed in pyproject.toml (setuptools does not find mapped ones)."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAPPING = {"attnbench": "attnbench", "kernels": "attnbench.kernels", "suites": "attnbench.suites"}


def test_every_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for top, dotted in MAPPING.items():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([dotted, *rel.parts]))
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
