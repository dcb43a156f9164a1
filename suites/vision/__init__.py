"""Vision: ImageNet-subset / CIFAR / digits accuracy of every attention in the same ViT (``attnbench run
vision``): presets (``config``, ``presets/*.toml``), the runner (``train``), its smoke (``smoke``), and the
leaderboard with the papers' reported ImageNet numbers (``leaderboard``, ``reported/*.toml``). The image data,
the ViT classifier and the teacher are the core's (:mod:`attnbench.image`), shared with adala, mixa and claims.

Importing this package registers the suite (cheaply: no torch); the modules above are imported on use.
"""

from attnbench.api.suites import Suite, register_suite

from . import cli as _cli
from .leaderboard import view as _view


def _load_preset(name_or_path: str):
    from .config import load_preset  # on use: the preset's dataclasses import the trainer's config

    return load_preset(name_or_path)


register_suite(Suite(name="vision", help="Train the same ViT with each attention; accuracy, speed, memory.",
                     run=_cli.run_command, view=_view(), load_preset=_load_preset))
