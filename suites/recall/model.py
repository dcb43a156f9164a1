"""The recall suite's models: the causal language model of :mod:`attnbench.models.lm` (one model code path with the
LM suite: any mixer in every block), and for MAD's compression task the same model as an encoder with MAD's
decoder head."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.models.lm import LanguageModel, LMConfig


def sinusoidal(T: int, dim: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """``[T, dim]`` sine / cosine position embeddings (Vaswani et al. 2017, Sec. 3.5)."""
    pos = torch.arange(T, dtype=torch.float64, device=device)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64, device=device) * (-math.log(10000.0) / dim))
    out = torch.zeros(T, dim, dtype=torch.float64, device=device)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return out.to(dtype)


class CompressionModel(LanguageModel):
    """MAD's compression model (``mad/model/auto_encoder.py``): the blocks encode the sequence; the hidden state
    at the last position (the compression token) is the code; a decoder of two ``norm -> linear -> GELU`` layers,
    fed the code plus a sinusoidal embedding of each position, predicts every input token through the LM head."""

    def __init__(self, cfg: LMConfig):
        super().__init__(cfg)
        H = cfg.hidden
        self.decoder = nn.ModuleList(nn.ModuleDict({"norm": nn.RMSNorm(H, eps=cfg.norm_eps), "proj": nn.Linear(H, H)})
                                     for _ in range(2))
        for layer in self.decoder:
            nn.init.normal_(layer["proj"].weight, mean=0.0, std=cfg.init_std)
            nn.init.zeros_(layer["proj"].bias)

    def forward(self, input_ids: torch.Tensor, caches=None, impl=None):
        if caches is not None:
            raise NotImplementedError("the compression model decodes from the whole sequence; no incremental form")
        code = self.features(input_ids, impl=impl)[:, -1:]                       # [B, 1, H]
        z = code + sinusoidal(input_ids.shape[1], code.shape[-1], code.device, code.dtype)
        for layer in self.decoder:
            z = F.gelu(layer["proj"](layer["norm"](z)))
        return self.lm_head(z)


def build_model(cfg: LMConfig, task: str) -> LanguageModel:
    return CompressionModel(cfg) if task == "compression" else LanguageModel(cfg)


__all__ = ["CompressionModel", "build_model", "sinusoidal"]
