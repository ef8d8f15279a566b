"""`AttentionWithRopeAndLoRA`: `AttentionWithRope` whose Q, K and V projections carry per-request LoRA adapters.

Pipeline per call: ``fused_qkv_ragged_matmul`` (base Q out, base K/V into the
paged cache) → `fused_qkv_lora` (the adapters' Q delta out, K/V deltas added to
this step's cache rows) → ``fused_qk_ragged_rope`` → ``flash_attention_ragged``
→ ``o_proj``. RoPE is linear, so rotating ``k + dk`` in the cache equals adding
the rotated delta: the adapters see the same positions as the base keys.

The batch's adapter layout (``lora_ids``, ``lora_ranks``, ``lora_grouped_offsets``,
as in `LinearLoRA`) is set on ``q_proj``/``k_proj``/``v_proj`` with
`AttentionWithRopeAndLoRA.set_lora_batch_info` before calling the layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.nn import kernels
from maxfx.nn._basic import Linear
from maxfx.nn._lora_linear import LinearLoRA
from maxfx.nn.attention._rope_attention import AttentionWithRope
from maxfx.nn.kv_cache._params import KVCacheParams

__all__ = ["AttentionWithRopeAndLoRA"]

_NAME = "AttentionWithRopeAndLoRA"


class AttentionWithRopeAndLoRA(AttentionWithRope):
    """Attention with RoPE plus LoRA adapters on the Q, K and V projections.

    ``q_proj``, ``k_proj`` and ``v_proj`` are `LinearLoRA` layers holding
    ``max_num_loras`` adapters of rank up to ``max_lora_rank`` (maxfx keyword
    arguments; MAX reads them from its LoRA config); ``o_proj`` is a plain
    ``linear_cls`` layer. Each request group adds
    ``(x @ A[id].T)[:, :rank] @ B[id].T`` to its projections; id < 0 or rank 0
    means no adapter.

    Call: ``attn(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)``
    after `set_lora_batch_info`, as for `AttentionWithRope`.

    Example:
        >>> attn = AttentionWithRopeAndLoRA(rope=rope, num_attention_heads=4, num_key_value_heads=2,  # doctest: +SKIP
        ...                                 hidden_size=16, kv_params=kv_params, max_num_loras=2, max_lora_rank=4)
        >>> attn.set_lora_batch_info(lora_ids, lora_ranks, lora_grouped_offsets)  # doctest: +SKIP
        >>> y = attn(0, x, kv_collection, rope.freqs_cis, input_row_offsets)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        rope: Any,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        devices: Sequence[Any] | None = None,
        dtype: DType = DType.float32,
        linear_cls: Callable[..., Any] = Linear,
        stacked_qkv: bool = False,
        scale: float | None = None,
        has_bias: bool = False,
        float8_config: Any = None,
        clip_qkv: float | None = None,
        max_num_loras: int = 1,
        max_lora_rank: int = 16,
    ):
        if stacked_qkv:
            raise ValueError(
                f"{_NAME}: stacked_qkv is not supported; the adapters are per projection, so load q_proj/k_proj/v_proj "
                "separately"
            )
        super().__init__(
            rope=rope,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            hidden_size=hidden_size,
            kv_params=kv_params,
            devices=devices,
            dtype=dtype,
            linear_cls=linear_cls,
            scale=scale,
            has_bias=has_bias,
            float8_config=float8_config,
            clip_qkv=clip_qkv,
        )
        if int(max_num_loras) <= 0 or int(max_lora_rank) <= 0:
            raise ValueError(
                f"{_NAME}: max_num_loras and max_lora_rank must be positive, got {max_num_loras} and {max_lora_rank}"
            )
        self.max_num_loras, self.max_lora_rank = int(max_num_loras), int(max_lora_rank)
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        lora = dict(
            max_num_loras=self.max_num_loras,
            max_lora_rank=self.max_lora_rank,
            dtype=dtype,
            device=self.devices[0],
            has_bias=self.has_bias,
        )
        # Replaces the base projections built by AttentionWithRope (same weight names plus the adapters).
        self.q_proj = LinearLoRA(self.hidden_size, q_dim, **lora)
        self.k_proj = LinearLoRA(self.hidden_size, kv_dim, **lora)
        self.v_proj = LinearLoRA(self.hidden_size, kv_dim, **lora)

    @property
    def qkv_loras(self) -> list[Any]:
        """The `LinearLoRA` layers of the Q, K and V projections, in that order."""
        return [self.q_proj, self.k_proj, self.v_proj]

    def shard(self, devices: Any) -> list[Any]:
        """Raises ValueError: the stacked adapters are not split by heads here."""
        raise ValueError(f"{_NAME}.shard: LoRA attention does not support tensor parallelism; run it on one device")

    # ── batch layout ──
    def set_lora_batch_info(self, lora_ids: Any, lora_ranks: Any, lora_grouped_offsets: Any) -> None:
        """Set the batch's adapter layout on ``q_proj``, ``k_proj`` and ``v_proj``.

        Takes graph tensors, or host arrays / lists (checked here: ids below
        ``max_num_loras``, ranks in ``[0, max_lora_rank]``, non-decreasing
        offsets; then baked into the graph as constants). Graph tensors are
        checked by shape only: their values exist at run time, where an
        out-of-range id means "no adapter" (the SGMV kernel's rule).

        Raises:
            ValueError: wrong ranks/lengths/dtypes, or (host arrays) ids or ranks out of range.
        """
        ids, ranks, offsets = (
            self._batch_value(n, v)
            for n, v in (
                ("lora_ids", lora_ids),
                ("lora_ranks", lora_ranks),
                ("lora_grouped_offsets", lora_grouped_offsets),
            )
        )
        # Dims compare algebraically: symbolic sizes must be written as g, g and g + 1.
        n_ids, n_ranks, n_off = (v.shape[0] for v in (ids, ranks, offsets))
        if n_ranks != n_ids or n_off != n_ids + 1:
            raise ValueError(
                f"{_NAME}.set_lora_batch_info: need one rank per lora id and one more grouped offset than ids; "
                f"got lora_ids [{n_ids}], lora_ranks [{n_ranks}], lora_grouped_offsets [{n_off}]"
            )
        for lin in self.qkv_loras:
            lin.set_lora_batch_info(ids, ranks, offsets)

    def _batch_value(self, what: str, v: Any) -> Any:
        where = f"{_NAME}.set_lora_batch_info"
        if hasattr(v, "type"):
            if v.rank != 1 or not v.dtype.is_integral():
                raise ValueError(f"{where}: {what} must be a 1-D integer tensor, got {v.type}")
            return v
        a = np.asarray(v)
        if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{where}: {what} must be a 1-D integer array, got {a.dtype}{list(a.shape)}")
        if what == "lora_ids" and (a >= self.max_num_loras).any():
            raise ValueError(
                f"{where}: lora_ids {a.tolist()} out of range; this layer holds {self.max_num_loras} adapters (ids "
                f"0..{self.max_num_loras - 1}, < 0 for none)"
            )
        if what == "lora_ranks" and ((a < 0) | (a > self.max_lora_rank)).any():
            raise ValueError(f"{where}: lora_ranks {a.tolist()} must lie in [0, max_lora_rank={self.max_lora_rank}]")
        if what == "lora_grouped_offsets" and ((a < 0).any() or (np.diff(a) < 0).any()):
            raise ValueError(
                f"{where}: lora_grouped_offsets {a.tolist()} must be non-negative and non-decreasing row prefix sums"
            )
        dtype = DType.uint32 if what == "lora_grouped_offsets" else DType.int32
        return ops.constant(a.astype(dtype.to_numpy()), dtype, self.devices[0])

    # ── the LoRA step ──
    def fused_qkv_lora(self, x: Any, kv_collection: Any, input_row_offsets: Any, layer_idx: Any) -> Any:
        """Computes fused query, key, and value LoRAs with ragged input.

        ``x [total_tokens, hidden]``: the K and V adapter deltas are added to
        this step's rows of layer ``layer_idx`` in ``kv_collection`` (so the base
        K/V must already be stored there), and the Q delta
        ``[total_tokens, n_heads * head_dim]`` is returned.

        Raises:
            ValueError: ``set_lora_batch_info`` has not been called, or ``x`` has the wrong shape.
        """
        if x.rank != 2 or int(x.shape[1]) != self.hidden_size:
            raise ValueError(
                f"{_NAME}.fused_qkv_lora: x must be ragged [total_tokens, {self.hidden_size}], got shape "
                f"[{', '.join(map(str, x.shape))}]"
            )
        if any(lin.__dict__.get("lora_ids") is None for lin in self.qkv_loras):
            raise ValueError(
                f"{_NAME}.fused_qkv_lora: 'set_lora_batch_info' has not been called on the LoRAs (q_proj, k_proj, "
                "v_proj)"
            )
        dq, dk, dv = (lin.lora_delta(x) for lin in self.qkv_loras)
        kernels.kv_cache_ragged_radd(
            self.kv_params, ops.concat([dk, dv], axis=1), kv_collection, input_row_offsets, 0, layer_idx
        )
        return dq

    def _qkv(self, layer_idx: Any, x: Any, kv: Any, offsets: Any) -> Any:
        xq = super()._qkv(layer_idx, x, kv, offsets)  # base Q; base K/V stored
        dq = self.fused_qkv_lora(x, kv, offsets, layer_idx)
        return xq + ops.reshape(dq, [x.shape[0], self.n_heads, self.head_dim])
