"""MixA: ``attnbench run mixa`` scores a softmax ViT's attention layers (Eq. 3 of Ahmed et al. 2025), makes the
top-k ReLU quadratic attention (Eqs. 4-5) and the rest SteLLA (Eqs. 6-7), fine-tunes the mix from the teacher with
knowledge distillation beside controls (all-SteLLA, last-k, random-k), and records them (``score``: Eq. 3 and the
selection; ``config``: presets; ``train``: the runner; ``leaderboard``: ``attnbench table mixa``).

Importing this package registers the suite (cheaply: no torch); the modules above are imported on use.
"""

from attnbench.api.suites import Suite, register_suite

from . import cli as _cli
from .leaderboard import view as _view

register_suite(Suite(name="mixa", help="MixA: Eq. 3 layer scores, top-k ReLU quadratic + SteLLA, KD fine-tune, "
                     "controls.", run=_cli.run_command, view=_view()))
