"""A snapshot of what ``attnbench list`` shows for the built-in mechanisms (``catalog.json``), so that the
command answers without importing torch (which takes seconds). ``tests/test_cli.py`` checks that the snapshot
equals the live registry; after adding or changing a mechanism, refresh it with ``python -m attnbench.api.catalog``.
``attnbench list --live`` always reads the live registry (and so shows attentions registered by plug-ins)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from attnbench.api import plugins, registry

PATH = Path(__file__).with_name("catalog.json")


def live(plugins_only: bool = False) -> list[dict[str, Any]]:
    """Every registered attention's description, JSON-ready (option defaults as their ``repr``); a plug-in's
    mechanism also names its plug-in (``plugin``: source and hash). ``plugins_only``: only the plug-ins'."""

    out = []
    for name in registry.names():
        p = plugins.plugin_for("attention", name)
        if plugins_only and p is None:
            continue
        d = registry.describe(name)
        out.append({**d, "impls": list(d["impls"]), "options": {k: repr(v) for k, v in d["options"].items()},
                    **({"plugin": p.describe()} if p is not None else {})})
    return out


def load() -> Optional[list[dict[str, Any]]]:
    """The snapshot, or None when it is missing or unreadable (then ``list`` reads the live registry)."""
    try:
        return json.loads(PATH.read_text())
    except (OSError, ValueError):
        return None


def write() -> Path:
    PATH.write_text(json.dumps(live(), indent=1, ensure_ascii=False) + "\n")
    return PATH


if __name__ == "__main__":  # pragma: no cover
    print(f"wrote {write()}")
