"""`RaggedAttention` (cache attention without RoPE), `MultiheadAttention` (padded, no cache) and `padded_attention`.

`padded_attention` is the one call of the registry ``attention`` op for padded
``[batch, seq, heads, head_dim]`` batches: `MultiheadAttention` uses it here, the
eager models of `maxfx.models` (over their KV cache) use it too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.nn._basic import Linear
from maxfx.nn._layer import Module
from maxfx.nn.attention._rope_attention import _devices, _on, _RaggedAttentionBase
from maxfx.nn.attention.mask_config import MHAMaskVariant
from maxfx.nn.kernels._attention import mask_name
from maxfx.nn.kv_cache._params import KVCacheParams

__all__ = ["MultiheadAttention", "RaggedAttention", "padded_attention"]


def padded_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    scale: float | None = None,
    mask: str = "causal",
    window: int = -1,
    q_offset: Any = None,
    kv_length: Any = None,
) -> Any:
    """Grouped-query attention over padded batches through the registry ``attention`` op (the Pallas flash kernel on
    GPU).

    Written over ``maxfx.graph.ops``: runs on graph values, eager Tensors and under ``jax.jit``.

    Args:
        q: ``[B, T, H, D]``; k, v: ``[B, S, Hkv, D]`` (query head h reads KV head ``h // (H / Hkv)``).
        scale: softmax scale (default ``1 / sqrt(D)``).
        mask: the op's mask (``"causal"``, ``"null"``, ``"sliding_window"``, ...).
        window: the sliding-window size for ``mask="sliding_window"``.
        q_offset: int ``[B]``, the position of each row's first query (queries against a cache).
        kv_length: int ``[B]``, each row's valid key count (later slots are hidden).

    Returns:
        ``[B, T, H * D]``.

    Example:
        >>> out = padded_attention(q, k, v, q_offset=first_pos, kv_length=last_pos + 1)  # doctest: +SKIP
    """
    if scale is None:
        scale = 1.0 / math.sqrt(int(q.shape[-1]))
    out = ops.attention(q, k, v, mask=mask, scale=scale, window=window, q_offset=q_offset, kv_length=kv_length)
    return ops.reshape(out, [q.shape[0], q.shape[1], -1])


class RaggedAttention(_RaggedAttentionBase):
    """Layer that computes the self attention score for ragged inputs (no RoPE; the mask variant is applied in the
    kernel).

    Call: ``attn(layer_idx, x, kv_collection, freqs_cis=None, input_row_offsets=...)``
    (``freqs_cis`` is ignored, so it drops into a `TransformerBlock`).

    Example:
        >>> attn = RaggedAttention(mask_variant=MHAMaskVariant.NULL_MASK, num_attention_heads=4,  # doctest: +SKIP
        ...                        num_key_value_heads=4, hidden_size=32, kv_params=kv_params)
    """

    def __init__(
        self,
        *,
        mask_variant: MHAMaskVariant,
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
        clip_qkv: float | None = None,
        local_window_size: int = -1,
    ):
        super().__init__()
        mask_name("RaggedAttention", mask_variant, local_window_size)  # validates early
        self.mask_variant, self.local_window_size = mask_variant, int(local_window_size)
        self._init_common(
            "RaggedAttention",
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            hidden_size=hidden_size,
            kv_params=kv_params,
            devices=devices,
            dtype=dtype,
            linear_cls=linear_cls,
            stacked_qkv=stacked_qkv,
            scale=scale,
            has_bias=has_bias,
            clip_qkv=clip_qkv,
        )


class MultiheadAttention(Module):
    """Multi-head attention over padded ``[batch, seq, hidden]`` inputs, without a KV cache.

    Weights: ``q_proj``, ``k_proj``, ``v_proj`` (or ``qkv_proj`` when
    ``stacked_qkv``) and ``o_proj``. The call attends over the whole sequence
    (``MHAMaskVariant.NULL_MASK``, as in vision encoders) unless a
    ``mask_variant`` is passed; ``valid_length`` (uint32 ``[batch]``) hides padding keys.

    Example:
        >>> mha = MultiheadAttention(4, 32)
        >>> sorted(mha.state_dict())
        ['k_proj.weight', 'o_proj.weight', 'q_proj.weight', 'v_proj.weight']
    """

    def __init__(
        self,
        num_attention_heads: int,
        hidden_size: int,
        devices: Sequence[Any] | None = None,
        dtype: DType = DType.float32,
        scale: float | None = None,
        qkv_has_bias: bool = False,
        o_proj_has_bias: bool = False,
        stacked_qkv: bool = False,
    ):
        super().__init__()
        n, h = int(num_attention_heads), int(hidden_size)
        if n < 1 or h % n:
            raise ValueError(f"MultiheadAttention: hidden_size ({h}) must be a multiple of num_attention_heads ({n})")
        self.n_heads, self.hidden_size, self.head_dim = n, h, h // n
        self.devices, self.dtype = _devices(devices), dtype
        self.scale = float(scale) if scale is not None else math.sqrt(1.0 / self.head_dim)
        self.stacked_qkv, self.qkv_has_bias = bool(stacked_qkv), bool(qkv_has_bias)
        dev = self.devices[0]
        if self.stacked_qkv:
            self.qkv_proj = Linear(h, 3 * h, dtype, dev, has_bias=qkv_has_bias)
        else:
            self.q_proj = Linear(h, h, dtype, dev, has_bias=qkv_has_bias)
            self.k_proj = Linear(h, h, dtype, dev, has_bias=qkv_has_bias)
            self.v_proj = Linear(h, h, dtype, dev, has_bias=qkv_has_bias)
        self.o_proj = Linear(h, h, dtype, dev, has_bias=o_proj_has_bias)

    def _projections(self) -> list[Linear]:
        return [self.qkv_proj] if self.stacked_qkv else [self.q_proj, self.k_proj, self.v_proj]

    @property
    def wqkv(self) -> Any:
        """The concatenation of q, k, and v weight vectors (``[3 * hidden, hidden]``)."""
        ws = [_on(p.weight, self.devices[0]) for p in self._projections()]
        return ws[0] if len(ws) == 1 else ops.concat(ws, axis=0)

    @property
    def wqkv_bias(self) -> Any:
        """The concatenation of q, k, and v bias weight vectors (None without biases)."""
        if not self.qkv_has_bias:
            return None
        bs = [_on(p.bias, self.devices[0]) for p in self._projections()]
        return bs[0] if len(bs) == 1 else ops.concat(bs, axis=0)

    def __call__(
        self, x: Any, mask_variant: MHAMaskVariant = MHAMaskVariant.NULL_MASK, valid_length: Any = None, **kwargs: Any
    ) -> Any:
        if x.rank != 3 or int(x.shape[2]) != self.hidden_size:
            raise ValueError(
                f"MultiheadAttention: x must be [batch, seq, {self.hidden_size}], got shape {list(x.shape)}"
            )
        qkv = x @ self.wqkv.T
        if self.qkv_has_bias:
            qkv = qkv + self.wqkv_bias
        b, s, h = x.shape[0], x.shape[1], self.hidden_size
        heads = [ops.reshape(qkv[:, :, i * h : (i + 1) * h], [b, s, self.n_heads, self.head_dim]) for i in range(3)]
        mask = mask_name("MultiheadAttention", mask_variant)
        return self.o_proj(padded_attention(*heads, scale=self.scale, mask=mask, kv_length=valid_length))
