"""Synthetic recall: Zoology's multi-query associative recall and MAD's six tasks, on which token mixers differ
sharply at a small scale. Any causal mechanism of the registry (a Transformer block holding it) or a language-model
mixer (DeltaNet, Gated DeltaNet, with NaLa; GLA, RetNet, Mamba) in the same small model.

Modules: ``tasks`` (the generators), ``data`` (files on disk), ``config`` (presets, mixers), ``model``, ``train``
(the runner: ``attnbench run recall``), ``smoke``, ``leaderboard`` (``attnbench table recall``, the plot of accuracy
against state size). Importing this package registers the suite cheaply (no torch).
"""

from attnbench.api.suites import Suite, register_suite

from . import cli as _cli
from .leaderboard import view as _view

register_suite(Suite(name="recall", help="Train token mixers on MQAR and MAD's tasks; accuracy against state size.",
                     run=_cli.run_command, view=_view(), data={"recall": _cli.data_recall}))
