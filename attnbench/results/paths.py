"""Where the results store lives: ``--db PATH``, else ``$ATTNBENCH_DB``, else ``results/attnbench.db`` under the
project root (the nearest directory at or above the working directory with a ``.git`` or ``pyproject.toml``)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "ATTNBENCH_DB"
DEFAULT_RELATIVE = Path("results") / "attnbench.db"


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: cwd) with a ``.git`` or ``pyproject.toml``."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / ".git").exists() or (d / "pyproject.toml").exists():
            return d
    return here


def default_db_path() -> Path:
    """``$ATTNBENCH_DB`` if set, else ``<project root>/results/attnbench.db``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return project_root() / DEFAULT_RELATIVE


def resolve_db(path: str | os.PathLike | None = None) -> Path:
    """An explicit ``path`` (``--db``) wins over :func:`default_db_path`."""
    return Path(path).expanduser() if path else default_db_path()
