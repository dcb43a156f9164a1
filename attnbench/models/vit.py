"""A DeiT / ViT whose attention is chosen per layer from specs: timm's ``VisionTransformer`` (patch embedding,
class token or mean pooling, pre-norm blocks, MLP, drop path, head) with each block's attention replaced by
:class:`SpecAttention`, which keeps timm's parameter names (``qkv``, ``proj``) so timm and DeiT checkpoints
load into it.

Sizes (:data:`VIT_SIZES`): ``deit_tiny`` (192 / 12 layers / 3 heads, Touvron et al. 2021), ``deit_small``
(384 / 12 / 6), ``cpu`` (64 / 4 / 2: small enough to train on a CPU) and ``cpu_deep`` (``cpu`` with 8 layers: depth
for layer-selection studies such as MixA's on a CPU). Block options (:class:`BlockOptions`, e.g. the
depthwise convolution on V of FLatten / PolaFormer / NaLaFormer) are off by default and recorded when on; the
convolution runs over the patch grid, the class token passes through it unchanged.
"""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from attnbench.core.errors import AttnbenchError
from attnbench.io.formats import refused_global
from attnbench.api.spec import AttentionSpec
from attnbench.models.blocks import BlockOptions, layer_specs


@dataclasses.dataclass(frozen=True)
class ViTSize:
    embed_dim: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0


VIT_SIZES = {
    "deit_tiny": ViTSize(192, 12, 3),
    "deit_small": ViTSize(384, 12, 6),
    "cpu": ViTSize(64, 4, 2),
    "cpu_deep": ViTSize(64, 8, 2),
}


class SpecAttention(nn.Module):
    """timm's ``Attention`` interface (``forward(x, attn_mask=None, is_causal=False)``, parameters ``qkv`` and
    ``proj``) around the attention built from ``spec``: ``x [B, N, dim] -> [B, N, dim]``. ``prefix`` tokens (the
    class token) come first; the optional depthwise conv on V runs over the ``grid`` of the other tokens."""

    def __init__(self, spec: AttentionSpec, *, dim: int, heads: int, seq_len: int, prefix: int = 1,
                 grid: Optional[tuple[int, int]] = None, options: BlockOptions = BlockOptions(),
                 qkv_bias: bool = True):
        super().__init__()
        if dim % heads:
            raise AttnbenchError(f"embedding dim {dim} is not divisible by {heads} heads")
        self.heads, self.head_dim, self.prefix, self.grid = heads, dim // heads, prefix, grid
        self.spec = spec
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.mech = spec.build(heads=heads, head_dim=dim // heads, seq_len=seq_len)
        self.proj = nn.Linear(dim, dim)
        self.dwc = None
        if options.dwc_kernel:
            if grid is None:
                raise AttnbenchError("the depthwise conv on V needs the patch grid")
            k = options.dwc_kernel
            with torch.random.fork_rng(devices=[]):  # the rest of the model initialises as without it
                self.dwc = nn.Conv2d(dim, dim, k, padding=k // 2, groups=dim)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                **_: object) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise AttnbenchError("SpecAttention takes no mask and is bidirectional (a ViT encoder)")
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [3, B, H, N, Dh]
        q, k, v = qkv.unbind(0)
        o = self.mech(q, k, v).transpose(1, 2).reshape(b, n, c)  # [B, N, dim]
        if self.dwc is not None:
            h, w = self.grid
            vp = v[:, :, self.prefix:].transpose(1, 2).reshape(b, h * w, c)  # [B, HW, dim]: patch tokens' V
            conv = self.dwc(vp.transpose(1, 2).reshape(b, c, h, w)).reshape(b, c, h * w).transpose(1, 2)
            o = torch.cat([o[:, :self.prefix], o[:, self.prefix:] + conv], dim=1)
        return self.proj(o)  # [B, N, dim]


def build_vit(specs: AttentionSpec | Sequence[AttentionSpec], *, size: str | ViTSize = "deit_tiny",
              img_size: int = 224, patch_size: int = 16, num_classes: int = 1000, in_chans: int = 3,
              global_pool: str = "token", drop_rate: float = 0.0, drop_path_rate: float = 0.0,
              options: BlockOptions = BlockOptions()):
    """timm's ``VisionTransformer`` with every block's attention replaced by :class:`SpecAttention` (one spec
    for all layers, or one per layer). ``global_pool``: ``token`` (class token, DeiT) or ``avg`` (mean pooling,
    no class token)."""
    from timm.models.vision_transformer import VisionTransformer, init_weights_vit_timm

    if isinstance(size, str):
        if size not in VIT_SIZES:
            raise AttnbenchError(f"unknown ViT size {size!r}; sizes: {', '.join(VIT_SIZES)}")
        size = VIT_SIZES[size]
    if img_size % patch_size:
        raise AttnbenchError(f"image size {img_size} is not a multiple of the patch size {patch_size}")
    if global_pool not in ("token", "avg"):
        raise AttnbenchError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
    class_token = global_pool == "token"
    vit = VisionTransformer(img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
                            global_pool=global_pool, class_token=class_token, embed_dim=size.embed_dim,
                            depth=size.depth, num_heads=size.heads, mlp_ratio=size.mlp_ratio, drop_rate=drop_rate,
                            drop_path_rate=drop_path_rate)
    grid = (img_size // patch_size, img_size // patch_size)
    prefix = 1 if class_token else 0
    for blk, spec in zip(vit.blocks, layer_specs(specs, size.depth)):
        attn = SpecAttention(spec, dim=size.embed_dim, heads=size.heads, seq_len=grid[0] * grid[1] + prefix,
                             prefix=prefix, grid=grid, options=options)
        for name, m in attn.named_modules():  # timm's ViT initialisation for the projections
            if name in ("qkv", "proj"):
                init_weights_vit_timm(m)
        blk.attn = attn
    vit.attnbench_specs = [b.attn.spec for b in vit.blocks]
    return vit


def resolve_impl(vit: nn.Module, device) -> str:
    """The implementations the model's attentions run on ``device`` (what a result records)."""
    return ",".join(sorted({m.mech.resolve_impl(device) for m in vit.modules() if isinstance(m, SpecAttention)}))


def load_pretrained(vit: nn.Module, path: str | Path, *, allow_missing_mechanism: bool = True) -> list[str]:
    """Load a timm / DeiT / plain torch state dict (optionally under ``model`` or ``state_dict``) from ``path``.

    A softmax checkpoint loads into any spec: the mechanism's own parameters (``blocks.*.attn.mech.*``) may be
    missing when ``allow_missing_mechanism`` (they keep their initialisation; returned). A position embedding of
    another resolution is resampled (timm's ``resample_abs_pos_embed``). Anything else missing, unexpected or of
    another shape is an error naming the file and the first offending keys."""
    path = Path(path)
    if not path.is_file():
        raise AttnbenchError(f"checkpoint {path} does not exist")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)  # a user's file: tensors only, no code
    except pickle.UnpicklingError as e:
        held = refused_global(e)
        if held is None:
            raise AttnbenchError(f"checkpoint {path} is not a readable torch file ({type(e).__name__})") from None
        raise AttnbenchError(f"checkpoint {path} holds a Python object beyond tensors ({held}), which "
                             f"attnbench does not unpickle (it could run code); save the state dict alone, e.g. "
                             f"torch.save(ckpt['model'], 'weights.pt')") from None
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same one-line error
        raise AttnbenchError(f"checkpoint {path} is not a readable torch file ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
    for key in ("model", "state_dict", "model_ema"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise AttnbenchError(f"checkpoint {path} holds no state dict (a dict of tensors, possibly under "
                             f"'model' or 'state_dict')")
    state = {k.removeprefix("module."): v for k, v in obj.items()}
    own = vit.state_dict()
    if "pos_embed" in state and "pos_embed" in own and state["pos_embed"].shape != own["pos_embed"].shape:
        from timm.layers import resample_abs_pos_embed

        prefix = 0 if getattr(vit, "no_embed_class", False) else vit.num_prefix_tokens
        grid = vit.patch_embed.grid_size
        state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], new_size=list(grid),
                                                    num_prefix_tokens=prefix)
    bad_shape = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items()
                 if k in own and v.shape != own[k].shape]
    unexpected = [k for k in state if k not in own]
    missing = [k for k in own if k not in state]
    mech_missing = [k for k in missing if ".attn.mech." in k or ".attn.dwc." in k]
    other_missing = [k for k in missing if k not in mech_missing or not allow_missing_mechanism]
    problems = []
    if bad_shape:
        problems.append(f"{len(bad_shape)} of another shape ({', '.join(bad_shape[:3])})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected ({', '.join(unexpected[:3])})")
    if other_missing:
        problems.append(f"{len(other_missing)} missing ({', '.join(other_missing[:3])})")
    if problems:
        raise AttnbenchError(f"checkpoint {path} does not fit this model: keys " + "; ".join(problems)
                             + " (is it a ViT of the same size, patch size and pooling?)")
    vit.load_state_dict(state, strict=False)
    return mech_missing
