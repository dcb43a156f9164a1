"""What a preset's full run would cost, printed by every ``run --smoke`` after its few CPU steps.

A smoke run exercises a preset's real pipeline (model size, resolution, augmentation, loss, schedule, evaluation,
checkpoint and resume) on a little data written in the real format, so a user's first GPU run is not where a
preset's first bug is found. It ends with one line: the full run's size and a time estimate for a named GPU,
derived from the training FLOPs that ``torch.utils.flop_counter`` counts for one item (matmul-class work only;
elementwise work is not counted, so the estimate is a lower bound on time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# Dense bf16 tensor-core peaks from the vendors' data sheets (SXM parts), FLOP/s.
GPU_PEAK_BF16 = {"H100": 989e12, "A100": 312e12}
# The fraction of peak a well-tuned training run reaches; a stated assumption, not a measurement.
ASSUMED_MFU = 0.4


@dataclass(frozen=True)
class FullRunCost:
    """A full run's size: ``steps`` optimizer steps of ``items_per_step`` items (images, tokens, sequences), each
    costing ``train_flops_per_item`` FLOPs for forward + backward."""

    steps: int
    items_per_step: int
    unit: str
    train_flops_per_item: float

    @property
    def items(self) -> int:
        return self.steps * self.items_per_step

    @property
    def flops(self) -> float:
        return self.items * self.train_flops_per_item

    def hours_on(self, gpu: str = "H100", mfu: float = ASSUMED_MFU) -> float:
        if gpu not in GPU_PEAK_BF16:
            raise ValueError(f"unknown GPU {gpu!r}: expected one of {', '.join(GPU_PEAK_BF16)}")
        return self.flops / (GPU_PEAK_BF16[gpu] * mfu) / 3600.0

    def line(self, gpu: str = "H100", mfu: float = ASSUMED_MFU) -> str:
        """``full run: 300,000 steps x 1,024 images = 3.07e+08 images, 1.4e+18 FLOPs; about 1.0 h on one H100
        (bf16 at 40% of its 989 TFLOP/s; matmul FLOPs only)``."""
        peak = GPU_PEAK_BF16[gpu] / 1e12
        return (f"full run: {self.steps:,} steps x {self.items_per_step:,} {self.unit} = {self.items:.3g} {self.unit}, "
                f"{self.flops:.2g} FLOPs; about {_fmt_hours(self.hours_on(gpu, mfu))} on one {gpu} "
                f"(bf16 at {mfu:.0%} of its {peak:.0f} TFLOP/s; matmul FLOPs only)")


def train_flops(step: Callable[[], Any]) -> int:
    """FLOPs of one forward + backward, as ``torch.utils.flop_counter`` counts them: ``step`` runs both."""
    from .bench import count_flops
    return count_flops(step)


def _fmt_hours(h: float) -> str:
    if h < 1 / 60:
        return f"{h * 3600:.0f} s"
    if h < 1:
        return f"{h * 60:.0f} min"
    if h < 48:
        return f"{h:.1f} h"
    return f"{h / 24:.1f} days"
