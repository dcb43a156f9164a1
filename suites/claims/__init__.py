"""Claims (``attnbench run claims``): each paper's mechanism-level argument measured in seconds on a CPU on
attnbench's own implementations, independent of any training run, with a verdict.

One check per argument (``checks/``: NaLaFormer's query-norm entropy and non-negative scores, MirrorLA's isometry
and passive truncation, LaplacianFormer's L1/L2 distances, Newton–Schulz and Nyström, MixA's variance stability,
the memory claims at high resolution, ViT-AdaLA's error accumulation), each cell a statistic under a criterion
stated before measuring (``criteria``), on synthetic draws of stated distributions or the q, k of a trained vision
model (``inputs``), with a figure (``figures``); ``runner`` plans and records the cells, ``leaderboard`` is
``attnbench table claims``.

Importing this package registers the suite (cheaply: no torch); the modules above are imported on use.
"""

from attnbench.api.suites import Suite, register_suite

from . import cli as _cli
from .leaderboard import view as _view

register_suite(Suite(name="claims", help="each paper's mechanism-level argument measured, with a verdict "
                     "(holds / fails / inconclusive) and a figure.", run=_cli.run_command, view=_view()))
