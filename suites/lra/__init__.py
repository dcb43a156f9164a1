"""Long Range Arena: readers for the released file formats (``data``) and synthetic generators (``generate``).

Import as ``attnbench.suites.lra.data`` / ``attnbench.suites.lra.generate``.
"""

# The model (``model``), presets (``config``, ``presets/*.toml``), runner (``train``: ``attnbench run lra``) and
# leaderboard (``leaderboard``: ``attnbench table lra``, with the published numbers of ``reported``).
from .leaderboard import register as _register_view

_register_view()
