"""Which learning rate a recall score is taken at: the one rule the run (what the later seeds train at) and the
leaderboard (which records a row shows) share. Torch-free: the leaderboard imports it."""

from __future__ import annotations


def common_seeds(val: dict[float, dict[int, float]]) -> set:
    """The seeds that trained at every rate with a validation accuracy (``val``: ``{rate: {seed: accuracy}}``;
    rates without any are left out): what :func:`best_rate` compares the rates on."""
    seeds = [set(v) for v in val.values() if v]
    return set.intersection(*seeds) if seeds else set()


def best_rate(val: dict[float, dict[int, float]]) -> float:
    """The learning rate a mixer's score is taken at, from ``{rate: {seed: best validation accuracy}}``: the
    highest mean validation accuracy over the seeds that trained at every rate (Zoology's and MAD's best of a
    sweep, chosen on validation). With ``rate_seeds`` the other seeds train at the chosen rate only, so comparing
    rates over every seed would set one seed's figure against several seeds' mean. No common seed: each rate's
    mean over its own seeds. Ties go to the higher rate."""
    scored = {lr: v for lr, v in val.items() if v}
    if not scored:
        raise ValueError("best_rate: no validation accuracy at any rate")
    common = common_seeds(scored)
    return max((sum(v[s] for s in common) / len(common) if common else sum(v.values()) / len(v), lr)
               for lr, v in scored.items())[1]
