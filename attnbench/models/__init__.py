"""The model pieces suites share: the block around an attention, a pre-norm transformer stack whose layers may
each have their own attention spec (a mixed model is a list of specs)."""

from attnbench.models.blocks import AttentionBlock, BlockOptions, PreNormBlock, TransformerStack, layer_specs

__all__ = ["AttentionBlock", "BlockOptions", "PreNormBlock", "TransformerStack", "layer_specs"]
