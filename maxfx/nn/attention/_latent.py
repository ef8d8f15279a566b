"""Multi-latent attention (DeepSeek-V2/V3 MLA) over the paged latent cache.

The cache (``KVCacheParams(is_mla=True, n_kv_heads=1, head_dim=kv_lora_rank +
qk_rope_head_dim)``) stores per token the normalized latent ``c_kv`` and the
rotated shared key ``k_pe``. Attention runs in the absorbed form: queries are
projected into the latent space with ``W_uk`` (from ``kv_b_proj``), attend over
the cache rows (values = the latents), and the result goes through ``W_uv``
and ``o_proj``. This equals decompressing K and V per head.

Weights (DeepSeek names): ``q_proj`` or ``q_a_proj``/``q_a_layernorm``/``q_b_proj``
(with ``q_lora_rank``), ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.graph._weight import ShardingStrategy
from maxfx.nn._basic import Linear, RMSNorm
from maxfx.nn._layer import Module
from maxfx.nn.attention._rope_attention import (
    _devices,
    _HeadShardable,
    _layer_scalar,
    _on,
    _per_device_inputs,
    _shard_view,
)
from maxfx.nn.attention.interfaces import DistributedAttentionImpl
from maxfx.nn.attention.mask_config import MHAMaskVariant
from maxfx.nn.kernels._attention import check_mla_settings, mla_absorbed_attention
from maxfx.nn.kv_cache._params import KVCacheParams

__all__ = ["DataParallelLatentAttentionWithRope", "LatentAttentionWithRope", "TensorParallelLatentAttentionWithRope"]


class LatentAttentionWithRope(Module, _HeadShardable):
    """Implementation of Latent Attention with Rope.

    Call: ``attn(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)`` like
    `AttentionWithRope`; ``freqs_cis`` is the rope table for ``qk_rope_head_dim``.

    Example:
        >>> mla = LatentAttentionWithRope(rope=rope, num_attention_heads=4, num_key_value_heads=1, hidden_size=32,
        ...      # doctest: +SKIP
        ...     kv_params=KVCacheParams(DType.float32, 1, 16 + 8, page_size=4, is_mla=True), dtype=DType.float32,
        ...     kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
    """

    rope: Any
    """The rope layer (``qk_rope_head_dim`` wide) the freqs_cis table comes from."""

    def __init__(
        self,
        *,
        rope: Any,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        dtype: DType,
        devices: Sequence[Any] | None = None,
        linear_cls: Callable[..., Any] = Linear,
        scale: float | None = None,
        q_lora_rank: int | None = None,
        kv_lora_rank: int = 512,
        qk_nope_head_dim: int = 128,
        qk_rope_head_dim: int = 64,
        v_head_dim: int = 128,
        buffer_size: int = 16384,
        graph_mode: str | None = None,
    ):
        super().__init__()
        check_mla_settings(type(self).__name__, kv_params, kv_lora_rank, qk_rope_head_dim, graph_mode)
        self.rope, self.kv_params, self.devices, self.dtype = rope, kv_params, _devices(devices), dtype
        self.n_heads, self.n_kv_heads, self.hidden_size = (
            int(num_attention_heads),
            int(num_key_value_heads),
            int(hidden_size),
        )
        self.q_lora_rank, self.kv_lora_rank = q_lora_rank, int(kv_lora_rank)
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = (
            int(qk_nope_head_dim),
            int(qk_rope_head_dim),
            int(v_head_dim),
        )
        self.qk_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        self.buffer_size, self.graph_mode = int(buffer_size), graph_mode
        self.scale = float(scale) if scale is not None else math.sqrt(1.0 / self.qk_head_dim)
        dev, h = self.devices[0], self.n_heads
        if q_lora_rank:
            self.q_a_proj = linear_cls(hidden_size, q_lora_rank, dtype, dev)
            self.q_a_layernorm = RMSNorm(q_lora_rank, dtype, eps=1e-6, multiply_before_cast=False)
            self.q_b_proj = linear_cls(q_lora_rank, h * self.qk_head_dim, dtype, dev)
        else:
            self.q_proj = linear_cls(hidden_size, h * self.qk_head_dim, dtype, dev)
        self.kv_a_proj_with_mqa = linear_cls(hidden_size, self.kv_lora_rank + self.qk_rope_head_dim, dtype, dev)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, dtype, eps=1e-6, multiply_before_cast=False)
        self.kv_b_proj = linear_cls(self.kv_lora_rank, h * (self.qk_nope_head_dim + self.v_head_dim), dtype, dev)
        self.o_proj = linear_cls(h * self.v_head_dim, hidden_size, dtype, dev)

    @property
    def w_uk_uv(self) -> list[Any]:
        """``[W_uk, W_uv]`` from ``kv_b_proj``: ``[n_heads, qk_nope_head_dim, kv_lora_rank]`` and ``[n_heads,
        kv_lora_rank, v_head_dim]``.
        """
        w = ops.reshape(
            _on(self.kv_b_proj.weight, self.devices[0]),
            [self.n_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank],
        )
        return [w[:, : self.qk_nope_head_dim, :], ops.permute(w[:, self.qk_nope_head_dim :, :], [0, 2, 1])]

    def shard(self, devices: Iterable[Any]) -> list[LatentAttentionWithRope]:
        """Tensor-parallel views split by heads (q/kv_b rows, o_proj columns); the latent
        projection, norms and the KV cache are replicated on every device.

        Raises:
            ValueError: the heads do not split evenly.
        """
        devs = _devices(devices)
        n = len(devs)
        if self.n_heads % n:
            raise ValueError(f"{type(self).__name__}.shard: {self.n_heads} heads do not split evenly over {n} devices")
        split = {"q_b_proj" if self.q_lora_rank else "q_proj": 0, "kv_b_proj": 0, "o_proj": 1}
        parts = {}
        for attr, axis in split.items():
            lin = getattr(self, attr)
            lin.sharding_strategy = ShardingStrategy(n, axis)
            parts[attr] = lin.shard(devs)
        out = []
        for i, dev in enumerate(devs):
            s = _shard_view(self)
            s.n_heads, s.devices = self.n_heads // n, [dev]
            for k, v in self.__dict__["_sublayers"].items():
                setattr(s, k, parts[k][i] if k in parts else v)
            out.append(s)
        return out

    def _queries(self, x: Any) -> Any:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora_rank else self.q_proj(x)
        return ops.reshape(q, [x.shape[0], self.n_heads, self.qk_head_dim])

    def __call__(
        self,
        layer_idx: Any,
        x: Any,
        kv_collection: Any,
        freqs_cis: Any = None,
        input_row_offsets: Any = None,
        **kwargs: Any,
    ) -> Any:
        name = type(self).__name__
        if input_row_offsets is None:
            raise ValueError(f"{name}: input_row_offsets (uint32 [batch + 1]) is required")
        if x.rank != 2 or int(x.shape[1]) != self.hidden_size:
            raise ValueError(f"{name}: x must be ragged [total_tokens, {self.hidden_size}], got shape {list(x.shape)}")
        kv, p = kv_collection, self.kv_params
        freqs = _on(self.rope.freqs_cis if freqs_cis is None else freqs_cis, x.device)
        interleaved = getattr(self.rope, "interleaved", True)
        layer = _layer_scalar(layer_idx, x.device)
        ckv = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(ckv[:, : self.kv_lora_rank])
        zero = ops.constant(0, DType.uint32, x.device)
        out = mla_absorbed_attention(
            p,
            self._queries(x),
            latent,
            ckv[:, self.kv_lora_rank :],
            _on(self.kv_b_proj.weight, self.devices[0]),
            freqs,
            input_row_offsets,
            kv,
            layer,
            zero,
            MHAMaskVariant.CAUSAL_MASK,
            self.scale,
            n_heads=self.n_heads,
            qk_nope_head_dim=self.qk_nope_head_dim,
            v_head_dim=self.v_head_dim,
            interleaved=interleaved,
        )
        return self.o_proj(out)


class TensorParallelLatentAttentionWithRope(LatentAttentionWithRope, DistributedAttentionImpl):
    """Distributed tensor parallel implementation of the Latent Attention with Rope.

    Heads are split over ``devices`` (`shard`); every device keeps the full
    latent KV cache (duplicated, as in MAX). The partial outputs are summed.
    Call: ``attn(layer_idx, xs, signal_buffers, kv_collections, freqs_cis, input_row_offsets)``.
    """

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
        _per_device_inputs(self, xs, kv_collections, freqs_cis, input_row_offsets)
        parts = [
            LatentAttentionWithRope.__call__(s, layer_idx, x, kv, f, o)
            for s, x, kv, f, o in zip(self.shard(self.devices), xs, kv_collections, freqs_cis, input_row_offsets)
        ]
        total = parts[0]
        for part in parts[1:]:
            total = total + _on(part, total.device)
        return [_on(total, d) for d in self.devices]


class DataParallelLatentAttentionWithRope(LatentAttentionWithRope, DistributedAttentionImpl):
    """Data-parallel implementation of Latent Attention with RoPE: the replica on device ``i`` runs on
    ``xs[i]`` with its own KV cache. Call: ``attn(layer_idx, xs, kv_collections, freqs_cis, input_row_offsets)``."""

    def __call__(
        self,
        layer_idx: Any,
        xs: Any,
        kv_collections: Any = None,
        freqs_cis: Any = None,
        input_row_offsets: Any = None,
        **kwargs: Any,
    ) -> list[Any]:  # type: ignore[override]
        _per_device_inputs(self, xs, kv_collections, freqs_cis, input_row_offsets)
        return [
            LatentAttentionWithRope.__call__(self, layer_idx, x, kv, f, o)
            for x, kv, f, o in zip(xs, kv_collections, freqs_cis, input_row_offsets)
        ]
