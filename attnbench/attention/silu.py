"""SiLU as a feature map: DeltaNet's and Gated DeltaNet's q/k activation (no attention of its own).

DeltaNet (Yang et al., NeurIPS 2024) and Gated DeltaNet (Yang et al., ICLR 2025) pass q and k through a short
causal convolution with a SiLU activation and then L2-normalise them; as a registered feature map, SiLU is the
baseline that NaLa (or any other map) replaces in :mod:`attnbench.models.lm`.
"""

from __future__ import annotations

import torch.nn.functional as F

from attnbench.attention.base import FeatureMap


class SiluFeatureMap(FeatureMap):
    """phi(x) = SiLU(x) = x sigmoid(x) (not non-negative: fine for the delta rule, which has no normaliser)."""

    name = "silu"
    paper = "Yang et al. 2024 (DeltaNet); Yang et al. 2025 (Gated DeltaNet)"

    def phi(self, x):
        return F.silu(x)
