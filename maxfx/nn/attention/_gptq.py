"""GPTQ-packed projections for `GPTQAttentionWithRope`.

A projection holds MAX's packed GPTQ matrix ``uint8 [K/2 + 2*K/group_size, N]``
(raw int32 ``qweight`` bytes, then raw float16 ``scales`` bytes; see
``ops.qmatmul``) and, with act-order, ``perm_idx [K]``.
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import Weight
from maxfx.graph.quantization import QuantizationEncoding
from maxfx.nn._layer import Module

__all__ = ["GPTQProjection", "gptq_projection", "concat_gptq"]


class GPTQProjection(Module):
    """``x @ W`` with a GPTQ-packed ``weight`` (and ``perm_idx`` for act-order)."""

    def __init__(self, in_dim: int, out_dim: int, dtype: DType, device: DeviceRef, config: Any):
        super().__init__()
        g = int(config.group_size)
        if in_dim % g or in_dim % 8:
            raise ValueError(f"GPTQ projection: in_dim {in_dim} must be a multiple of group_size {g} and of 8")
        self.in_dim, self.out_dim, self.device, self.config, self.dtype = in_dim, out_dim, device, config, dtype
        self.weight = Weight("weight", DType.uint8, [in_dim // 2 + 2 * in_dim // g, out_dim], DeviceRef.CPU())
        self.perm_idx = Weight("perm_idx", DType.int32, [in_dim], DeviceRef.CPU()) if config.desc_act else None

    def __call__(self, x: Any) -> Any:
        w = self.weight if self.weight.device == self.device else self.weight.to(self.device)
        rhs = [w]
        if self.perm_idx is not None:
            perm = self.perm_idx if self.perm_idx.device == self.device else self.perm_idx.to(self.device)
            x = ops.gather(x, perm, axis=-1)
            rhs.append(perm)
        return ops.qmatmul(QuantizationEncoding.GPTQ, self.config, x, *rhs)


def gptq_projection(in_dim: int, out_dim: int, dtype: DType, device: DeviceRef, config: Any) -> GPTQProjection:
    """A `GPTQProjection` (the layer's ``linear_cls`` for GPTQ weights)."""
    return GPTQProjection(int(in_dim), int(out_dim), dtype, device, config)


def concat_gptq(packed: list[Any], in_dim: int, group_size: int) -> Any:
    """Packed GPTQ matrices of the same ``K`` joined along the output dim (what packing the
    concatenated ``qweight``/``scales`` would give): the int32 and float16 byte groups are
    regrouped per column before concatenating."""
    qrows, srows = in_dim // 2, 2 * in_dim // group_size
    qparts, sparts = [], []
    for p in packed:
        n = p.shape[1]
        qparts.append(ops.reshape(p[:qrows], [in_dim // 8, n, 4]))
        sparts.append(ops.reshape(p[qrows:], [in_dim // group_size, n, 2]))
    q, s = ops.concat(qparts, axis=1), ops.concat(sparts, axis=1)
    total = q.shape[1]
    return ops.concat([ops.reshape(q, [qrows, total]), ops.reshape(s, [srows, total])], axis=0)
