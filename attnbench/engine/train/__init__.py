"""The training engine every training suite stands on: the loop and its typed state (:mod:`.trainer`:
``train(model, cfg, task, ...)``), its typed configuration (:mod:`.config`), checkpoints (:mod:`.checkpoint`),
torchrun / DDP / FSDP2 (:mod:`.dist`). Cells of a suite are run by :mod:`attnbench.engine.sweep`. Nothing is
imported here: a light module may use :mod:`.config` or :mod:`.dist` without loading the loop and torch.
"""
