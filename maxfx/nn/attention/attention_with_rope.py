"""``max.nn.attention.attention_with_rope``: an opaque KV Cache optimized attention mechanism with Rope.

`TensorParallelAttentionWithRope` is defined here, beside the `Allreduce` it sums
shards with, so patching ``attention_with_rope.Allreduce`` (as MAX's tests do)
replaces the one it builds; the single-device layers live in `_rope_attention`.
"""

from __future__ import annotations

from typing import Any

from maxfx.graph._value import TensorValue
from maxfx.graph._weight import ShardingStrategy
from maxfx.nn._graph_util import on_device as _on
from maxfx.nn.attention._rope_attention import (
    AttentionWithRope,
    AttentionWithRopeNoOpaque,
    DataParallelAttentionWithRope,
    GGUFQAttentionWithRope,
    GPTQAttentionWithRope,
    _per_device,
    _per_device_inputs,
    distribute_value,
)
from maxfx.nn.attention.interfaces import DistributedAttentionImpl
from maxfx.nn.comm import Allreduce

__all__ = [
    "Allreduce",
    "AttentionWithRope",
    "AttentionWithRopeNoOpaque",
    "DataParallelAttentionWithRope",
    "GGUFQAttentionWithRope",
    "GPTQAttentionWithRope",
    "TensorParallelAttentionWithRope",
    "distribute_value",
]


class TensorParallelAttentionWithRope(AttentionWithRope, DistributedAttentionImpl):
    """Tensor-parallel wrapper that delegates sharding to the base module.

    At construction the layer is split over ``devices`` (`AttentionWithRope.shard`):
    ``list_of_attentions[i]`` is device ``i``'s `AttentionWithRope` with
    ``num_heads_for_device`` query heads (uneven counts give the first devices
    one more) and the KV heads they read. The q/k/v projections sit in
    ``qkv_proj``: a fused weight split by heads (``stacked_qkv``) or an unfused
    `StackedLinear` whose ``q_proj``/``k_proj``/``v_proj`` split by rows in whole
    heads; ``o_proj`` splits its columns by heads. Weight names are those of
    `AttentionWithRope`.

    Call: ``attn(layer_idx, xs, signal_buffers, kv_collections, freqs_cis, input_row_offsets)``
    with per-device lists; device ``i``'s cache holds
    ``list_of_attentions[i].kv_params.n_kv_heads_per_device`` heads. With
    ``signal_buffers`` (one per device) the partial outputs are summed by
    `Allreduce`; with None, by transfers and adds. The sum is returned on every device.

    Example:
        >>> attn = TensorParallelAttentionWithRope(rope=rope, num_attention_heads=3, num_key_value_heads=3,
        ...      # doctest: +SKIP
        ...                                        hidden_size=24, kv_params=kv_params, devices=[cpu, cpu])
        >>> [a.n_heads for a in attn.list_of_attentions]  # doctest: +SKIP
        [2, 1]
    """

    _grouped_heads_at_init = False
    _qkv_as_container = True

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        n = len(self.devices)
        self.sharding_strategy = ShardingStrategy.tensor_parallel(n)
        # A plain attribute, not a sublayer: the views hold shards of this layer's own weights.
        self.__dict__["list_of_attentions"] = self.shard(self.devices)
        self.allreduce = Allreduce(n)  # this module's global: patchable

    def _shard_class(self) -> type:
        return AttentionWithRope

    def __call__(
        self,
        layer_idx: Any,
        xs: Any,
        signal_buffers: Any = None,
        kv_collections: Any = None,
        freqs_cis: Any = None,
        input_row_offsets: Any = None,
        **kwargs: Any,
    ) -> list[Any]:  # type: ignore[override]
        n = len(self.devices)
        name = type(self).__name__
        _per_device_inputs(self, xs, kv_collections, freqs_cis, input_row_offsets)
        if not all(isinstance(o, TensorValue) for o in input_row_offsets):
            raise TypeError(
                f"{name}: All elements in input_row_offsets must be TensorValue instances, got "
                f"{[type(o).__name__ for o in input_row_offsets]}"
            )
        if signal_buffers is not None:
            _per_device(name, n, signal_buffers=signal_buffers)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{name}: num_attention_heads ({self.n_heads}) must be a multiple of num_key_value_heads "
                f"({self.n_kv_heads}) to run: each query head reads KV head (head // group)"
            )
        parts = [
            s._forward_shard(layer_idx, x, kv, f, o)
            for s, x, kv, f, o in zip(self.list_of_attentions, xs, kv_collections, freqs_cis, input_row_offsets)
        ]
        if signal_buffers is not None and n > 1:
            return self.allreduce(parts, signal_buffers)
        total = parts[0]
        for p in parts[1:]:
            total = total + _on(p, total.device)
        return [_on(total, d) for d in self.devices]
