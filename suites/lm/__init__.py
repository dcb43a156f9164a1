"""Language models: DeltaNet and Gated DeltaNet with SiLU (the published layers) or NaLa (NaLaFormer Table 5)
feature maps, trained on the same tokens by the shared engine (``attnbench run lm``), scored by lm-eval
(``attnbench eval lm``), tabled beside the paper's reported rows (``attnbench table lm``).

Modules: ``config`` (presets, variants), ``data`` (corpora, tokenizers, packing), ``train`` (the runner),
``artifact`` (trained models on disk), ``evaluate`` / ``local_tasks`` / ``eval_cli`` (lm-eval), ``smoke``,
``leaderboard`` and ``reported/*.toml``. Importing this package registers the suite cheaply (no torch).
"""

from attnbench.api.suites import Suite, register_suite

from . import cli as _cli
from . import eval_cli as _eval_cli
from .leaderboard import view as _view

register_suite(Suite(name="lm", help="Train DeltaNet / Gated DeltaNet LMs with each feature map; lm-eval scores.",
                     run=_cli.run_command, evaluate=_eval_cli.eval_command, view=_view()))
