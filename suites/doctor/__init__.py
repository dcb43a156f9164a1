"""The doctor (``attnbench doctor``): one command that proves attnbench on a user's GPU before any number is trusted,
the machine and what its versions cannot do first, then checks, gated timings against FLA and SDPA, the GPU
presets' smokes, one verdict. ``forms`` (what is timed, with its exact form and FLOPs), ``plan`` (the steps, the
estimates, the budget), ``run`` (the command), ``node`` (versions, limitations, peaks), ``leaderboard`` (the
tables, from the records). Importing this package registers it cheaply (no torch)."""

from attnbench.api.suites import Suite, register_suite

from . import cli as _cli
from .leaderboard import view as _view

register_suite(Suite(name="doctor", help="Prove attnbench on this machine: contract, gated timings vs FLA and SDPA, "
                     "smokes; one verdict.", run=_cli.doctor_command, view=_view(), top_level=True))
