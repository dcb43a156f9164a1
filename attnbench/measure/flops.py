"""FLOPs of one call: ``torch.utils.flop_counter.FlopCounterMode`` (matmul-class ops; elementwise work is not
counted). The CPU SDPA kernels, which torch does not count, are registered here with torch's own SDPA formula."""

from __future__ import annotations

from typing import Any, Callable

import torch


def _register_cpu_sdpa_flops() -> None:
    """torch counts the CUDA SDPA kernels but not the CPU flash kernel; count it with torch's formula."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None and fwd not in fc.flop_registry and fwd.default not in fc.flop_registry:
        def _fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_flop_count(query_shape, key_shape, value_shape)
        fc.register_flop_formula(fwd)(_fwd)
    if bwd is not None and bwd not in fc.flop_registry and bwd.default not in fc.flop_registry:
        def _bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
            return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)
        fc.register_flop_formula(bwd)(_bwd)


try:
    _register_cpu_sdpa_flops()
except Exception:  # noqa: BLE001 - a torch without these ops or this API: FLOPs of SDPA on CPU stay uncounted
    pass


def flop_counter():
    """A silent ``FlopCounterMode`` (``with flop_counter() as c: ...; c.get_total_flops()``), the CPU SDPA kernels
    counted (registered when this module is imported)."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False)


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of one call of ``fn`` as :func:`flop_counter` counts them."""
    with flop_counter() as counter:
        fn()
    return int(counter.get_total_flops())
