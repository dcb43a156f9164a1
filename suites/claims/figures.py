"""Figures of the checks: matplotlib on the Agg backend, one PNG per cell, titled with the verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

COLORS = {"holds": "tab:green", "fails": "tab:red", "inconclusive": "tab:orange"}


def axes(n: int = 1, *, width: float = 5.2, height: float = 3.8):
    """A figure with ``n`` axes side by side (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(ax[0])


def save(fig, path: Optional[Path], title: str, verdict: str) -> Optional[str]:
    """Title the figure with the verdict, write it to ``path`` (None: discard) and return the path as text."""
    import matplotlib.pyplot as plt

    fig.suptitle(f"{title}: {verdict}", color=COLORS.get(verdict, "black"), fontsize=10)
    fig.tight_layout()
    out = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        out = str(path)
    plt.close(fig)
    return out
