"""Long Range Arena: readers for the released file formats (``data``), synthetic generators (``generate``), the
model (``model``), presets (``config``, ``presets/*.toml``), the runner (``train``: ``attnbench run lra``), and
the leaderboard (``leaderboard``: ``attnbench table lra``, with the published numbers of ``reported``).

Importing this package registers the suite (cheaply: no torch); the modules above are imported on use.
"""

from attnbench.api.suites import Suite, register_suite

from . import cli as _cli
from .leaderboard import view as _view

register_suite(Suite(name="lra", help="Train and evaluate attentions on the Long Range Arena (resumable).",
                     run=_cli.run_command, view=_view(),
                     data={"listops": _cli.data_listops, "pathfinder": _cli.data_pathfinder}))
