"""Which learning rate a recall score is taken at: per seed, the rate of the sweep whose validation accuracy is best
(Zoology's and MAD's best of a learning-rate sweep, per run, chosen on validation rather than on the test set).

Per seed, not one rate per mixer: MQAR has a plateau before learning starts, and whether a run leaves it at a given
rate depends on its seed; one rate for every seed leaves some seeds of a mixer on the plateau that the other rate
frees (results/recall/README.md). The score of a seed is then that of the recipe "train at each rate, keep the run
that validates best", which is what Zoology reports. Torch-free: the leaderboard imports it."""

from __future__ import annotations


def complete_seeds(val: dict[float, dict[int, float]]) -> set:
    """The seeds with a validation accuracy at every rate of ``val`` (``{rate: {seed: accuracy}}``): the seeds whose
    sweep has finished, the only ones :func:`best_rates` scores."""
    seeds = [set(v) for v in val.values()]
    return set.intersection(*seeds) if seeds else set()


def best_rates(val: dict[float, dict[int, float]]) -> dict[int, float]:
    """``{seed: the rate whose validation accuracy is best for that seed}`` over the seeds that trained at every rate
    of ``val`` (``{rate: {seed: best validation accuracy}}``); ties go to the higher rate."""
    return {s: max((v[s], lr) for lr, v in val.items())[1] for s in sorted(complete_seeds(val))}
