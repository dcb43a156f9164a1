"""The training engine every training suite stands on: typed config, the loop, checkpoints, distribution.

``attnbench.train.train(model, cfg, task, ...)`` (:mod:`.trainer`), :class:`TrainConfig` (:mod:`.config`),
checkpoints (:mod:`.checkpoint`), torchrun / DDP / FSDP2 (:mod:`.dist`). Cells of a suite are run by
:mod:`attnbench.sweep`.
"""

from .config import ParamGroup, TrainConfig
from .dist import Dist, default_device, init_dist, relaunch_under_torchrun, shutdown, under_torchrun
from .trainer import (Diverged, NonFiniteLoss, TrainHooks, TrainOrder, TrainResult, TrainState, TrainTask, step_seed,
                      train)

__all__ = ["ParamGroup", "TrainConfig", "Dist", "default_device", "init_dist", "relaunch_under_torchrun", "shutdown",
           "under_torchrun", "Diverged", "NonFiniteLoss", "TrainHooks", "TrainOrder", "TrainResult", "TrainState",
           "TrainTask", "step_seed", "train"]
