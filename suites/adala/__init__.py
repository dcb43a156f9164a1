"""ViT-AdaLA (``attnbench run adala``): a softmax ViT teacher linearised in the paper's three stages (attention
alignment, feature alignment, supervised fine-tuning) into any registered linear attention, each stage one run
of the shared trainer (``pipeline``), presets as data (``config``, ``presets/*.toml``), and a leaderboard of the
teacher, each stage set and the from-scratch model (``leaderboard``).

Importing this package registers the suite (cheaply: no torch); the modules above are imported on use.
"""

from attnbench.api.suites import Suite, register_suite

from . import cli as _cli
from .leaderboard import view as _view

register_suite(Suite(name="adala", help="ViT-AdaLA: linearise a softmax ViT in three stages; accuracy, speed, "
                     "memory beside the teacher and from-scratch.", run=_cli.run_command, view=_view()))
