"""Attention with rotary embeddings over a ragged batch and the paged KV cache.

`AttentionWithRope` is Llama's attention: ``fused_qkv_ragged_matmul`` (Q out,
K/V into the cache) → ``fused_qk_ragged_rope`` → ``flash_attention_ragged``
(causal) → ``o_proj``. Weights follow the Hugging Face names: ``q_proj``,
``k_proj``, ``v_proj``, ``o_proj`` (``qkv_proj`` when ``stacked_qkv``), plus
``q_norm``/``k_norm`` with ``use_qk_norm``.

Call: ``attn(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)`` with
``x [total_tokens, hidden]`` ragged, ``kv_collection`` a `PagedCacheValues`,
``freqs_cis`` the rope table ``[max_seq_len * 2, head_dim]`` and
``input_row_offsets`` uint32 ``[batch + 1]``; returns ``[total_tokens, hidden]``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import ShardingStrategy, query_kv_heads
from maxfx.nn import kernels
from maxfx.nn._basic import Linear, RMSNorm, clamp
from maxfx.nn._graph_util import on_device as _on
from maxfx.nn._layer import Module, Shardable
from maxfx.nn._stacked_linear import StackedLinear
from maxfx.nn.attention._gptq import concat_gptq, gptq_projection
from maxfx.nn.attention.interfaces import DistributedAttentionImpl
from maxfx.nn.attention.mask_config import MHAMaskVariant
from maxfx.nn.kv_cache._params import KVCacheParams

__all__ = [
    "AttentionWithRope",
    "AttentionWithRopeNoOpaque",
    "DataParallelAttentionWithRope",
    "GGUFQAttentionWithRope",
    "GPTQAttentionWithRope",
    "distribute_value",
    "num_heads_for_device",
]


def distribute_value(v: Any, devices: Sequence[Any]) -> list[Any]:
    """``v`` copied to each device (``v.to(device)``; no copy where it already is)."""
    out = []
    for d in devices:
        ref = DeviceRef.from_device(d)
        out.append(v if v.device == ref else v.to(ref))
    return out


def num_heads_for_device(*, num_heads: int, device_idx: int, num_devices: int) -> int:
    """How many of ``num_heads`` attention heads device ``device_idx`` of ``num_devices`` holds.

    Heads split as evenly as possible; the first ``num_heads % num_devices``
    devices take one extra, and devices beyond ``num_heads`` get none.

    Raises:
        ValueError: if ``num_devices`` < 1, ``num_heads`` < 0 or ``device_idx``
            is not in ``[0, num_devices)``.

    Example:
        >>> [num_heads_for_device(num_heads=7, device_idx=i, num_devices=4) for i in range(4)]
        [2, 2, 2, 1]
    """
    if num_devices < 1:
        raise ValueError(f"num_heads_for_device: num_devices must be >= 1, got {num_devices}")
    if num_heads < 0:
        raise ValueError(f"num_heads_for_device: num_heads must be >= 0, got {num_heads}")
    if not 0 <= device_idx < num_devices:
        raise ValueError(f"num_heads_for_device: device_idx must be in [0, {num_devices}), got {device_idx}")
    base, extra = divmod(num_heads, num_devices)
    return base + (1 if device_idx < extra else 0)


def _devices(devices: Iterable[Any] | None) -> list[DeviceRef]:
    devs = list(devices) if devices is not None else []
    return [DeviceRef.from_device(d) for d in devs] or [DeviceRef.CPU()]


def _check_heads(layer: str, n_heads: int, n_kv: int, hidden: int, kv_params: Any, grouped: bool = True) -> None:
    """``grouped``: the query heads must be whole groups of the KV heads now (else when the layer runs)."""
    if not isinstance(kv_params, KVCacheParams):
        raise TypeError(f"{layer}: kv_params must be a KVCacheParams, got {type(kv_params).__name__}")
    if n_heads < 1 or n_kv < 1 or (grouped and n_heads % n_kv):
        raise ValueError(
            f"{layer}: num_attention_heads ({n_heads}) must be a positive multiple of num_key_value_heads ({n_kv})"
        )
    if kv_params.n_kv_heads != n_kv:
        raise ValueError(
            f"{layer}: kv_params.n_kv_heads ({kv_params.n_kv_heads}) differs from num_key_value_heads ({n_kv})"
        )
    if hidden < 1:
        raise ValueError(f"{layer}: hidden_size must be positive, got {hidden}")


class _HeadShardable(Shardable):
    """A settable `sharding_strategy` for attention layers whose `shard` splits by heads itself."""

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """Get the Module sharding strategy."""
        return self.__dict__.get("_sharding_strategy")

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy | None) -> None:
        self.__dict__["_sharding_strategy"] = strategy


# Settings of a tensor-parallel host that its per-device views do not carry.
_HOST_ONLY = ("list_of_attentions", "allreduce")


def _shard_view(layer: Module, cls: type | None = None) -> Any:
    """A new ``cls`` (default: ``layer``'s class) holding only ``layer``'s plain settings (sizes, scale, flags): no
    weights, no sublayers.
    """
    cls = cls or type(layer)
    s = cls.__new__(cls)
    Module.__init__(s)
    d = layer.__dict__
    for k, v in d.items():
        if not k.startswith("_") and k not in d["_sublayers"] and k not in d["_layer_weights"] and k not in _HOST_ONLY:
            s.__dict__[k] = v
    return s


def _device_kv_params(kv_params: KVCacheParams, devices: list[DeviceRef], n_kv_local: int) -> KVCacheParams:
    """``kv_params`` for one device of a tensor-parallel layer: the cache holds ``n_kv_local`` heads there.

    Like ``kv_params._tensor_parallel`` (``n_devices`` is the tensor-parallel
    width), with the device's own head count, which an uneven split makes differ
    from device to device.
    """
    p = copy.copy(kv_params)
    p.n_devices, p.data_parallel_degree = len(devices), 1
    if hasattr(p, "devices"):
        p.devices = list(devices)
    p.n_kv_heads_per_device = n_kv_local
    return p


def _qkv_container(
    hidden: int, out_dims: list[int], dtype: DType, device: Any, has_bias: bool, layers: Sequence[Any]
) -> StackedLinear:
    """An unfused `StackedLinear` holding the ``q_proj``/``k_proj``/``v_proj`` ``layers`` (weight names unchanged)."""
    qkv = StackedLinear(
        hidden,
        out_dims,
        ["q_proj", "k_proj", "v_proj"],
        dtype,
        device,
        stacked=False,
        has_bias=has_bias,
        _is_sharding=True,
    )
    for name, layer in zip(("q_proj", "k_proj", "v_proj"), layers):
        setattr(qkv, name, layer)
    return qkv


class _RaggedAttentionBase(Module, _HeadShardable):
    """Projections and the cache-attention pipeline shared by the ragged attention layers."""

    mask_variant: Any = MHAMaskVariant.CAUSAL_MASK
    local_window_size: int = -1
    # Tensor-parallel hosts accept head counts that are not whole KV groups (as MAX
    # does) and refuse them when they run; they hold q/k/v in a `qkv_proj` container.
    _grouped_heads_at_init: bool = True
    _qkv_as_container: bool = False

    def _init_common(
        self,
        layer: str,
        *,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        devices: Any,
        dtype: DType,
        linear_cls: Callable[..., Any],
        stacked_qkv: bool,
        scale: float | None,
        has_bias: bool,
        clip_qkv: float | None,
        quantization_encoding: Any = None,
    ) -> None:
        _check_heads(
            layer,
            int(num_attention_heads),
            int(num_key_value_heads),
            int(hidden_size),
            kv_params,
            self._grouped_heads_at_init,
        )
        self.n_heads, self.n_kv_heads, self.hidden_size = (
            int(num_attention_heads),
            int(num_key_value_heads),
            int(hidden_size),
        )
        self.kv_params, self.devices, self.dtype = kv_params, _devices(devices), dtype
        self.head_dim = kv_params.head_dim
        self.stacked_qkv, self.has_bias, self.clip_qkv = bool(stacked_qkv), bool(has_bias), clip_qkv
        self.scale = float(scale) if scale is not None else self._default_scale()
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        dev = self.devices[0]
        qe = {} if quantization_encoding is None else {"quantization_encoding": quantization_encoding}
        if self.stacked_qkv:
            if quantization_encoding is not None:
                raise ValueError(f"{layer}: stacked_qkv cannot be combined with a quantization encoding")
            self.qkv_proj = linear_cls(self.hidden_size, q_dim + 2 * kv_dim, dtype, dev, has_bias=has_bias)
        else:
            q, k, v = (
                linear_cls(self.hidden_size, d, dtype, dev, has_bias=has_bias, **qe) for d in (q_dim, kv_dim, kv_dim)
            )
            if self._qkv_as_container:
                self.qkv_proj = _qkv_container(
                    self.hidden_size, [q_dim, kv_dim, kv_dim], dtype, dev, has_bias, (q, k, v)
                )
            else:
                self.q_proj, self.k_proj, self.v_proj = q, k, v
        self.o_proj = linear_cls(q_dim, self.hidden_size, dtype, dev, **qe)

    @property
    def num_key_value_heads(self) -> int:
        """KV heads this layer (or shard) holds; MAX's name for ``n_kv_heads``."""
        return self.n_kv_heads

    def _default_scale(self) -> float:
        return math.sqrt(1.0 / self.kv_params.head_dim)

    # ── fused weights ──
    def _projections(self) -> list[Any]:
        """``[qkv_proj]`` (stacked) or the q, k and v projections, wherever this layer holds them."""
        if self.stacked_qkv:
            return [self.qkv_proj]
        qkv = self.__dict__["_sublayers"].get("qkv_proj")
        if isinstance(qkv, StackedLinear):
            return [qkv._child(n) for n in ("q_proj", "k_proj", "v_proj")]
        return [self.q_proj, self.k_proj, self.v_proj]

    @property
    def wqkv(self) -> Any:
        """The concatenation of q, k, and v weight vectors (``[(n_heads + 2 n_kv_heads) * head_dim, hidden]``)."""
        dev = self.devices[0]
        ws = [_on(p.weight, dev) for p in self._projections()]
        w = ws[0] if len(ws) == 1 else ops.concat(ws, axis=0)
        return clamp(w, -self.clip_qkv, self.clip_qkv) if self.clip_qkv is not None else w

    @property
    def wqkv_bias(self) -> Any:
        """The concatenation of q, k, and v bias weight vectors (None without biases)."""
        if not self.has_bias:
            return None
        dev = self.devices[0]
        bs = [_on(p.bias, dev) for p in self._projections()]
        return bs[0] if len(bs) == 1 else ops.concat(bs, axis=0)

    # ── sharding ──
    def _shard_class(self) -> type:
        return type(self)

    def shard(self, devices: Iterable[Any]) -> list[Any]:
        """Tensor-parallel views, one per device; their ``o_proj`` outputs sum to the full output.

        Device ``i`` owns ``num_heads_for_device`` query heads (the first
        devices one more when they do not split evenly: q rows and ``o_proj``
        columns in whole heads) and the KV heads those queries read
        (`query_kv_heads`: an even split when the groups allow it, else shared
        or copied KV heads), so each view computes exactly its heads' part of
        the single-device attention. A stacked ``qkv_proj`` splits its Q, K and
        V rows the same way. Each view's ``kv_params`` gives the heads its
        device's KV cache holds (``n_kv_heads_per_device``).

        Raises:
            ValueError: more devices than query heads.
        """
        devs = _devices(devices)
        n = len(devs)
        name = type(self).__name__
        if n > self.n_heads:
            raise ValueError(
                f"{name}.shard: {self.n_heads} query heads cannot be split over {n} devices (each device needs at "
                "least one head)"
            )
        hd, projections = self.head_dim, self._projections()
        if self.stacked_qkv:
            projections[0].sharding_strategy = ShardingStrategy.stacked_qkv(
                n, self.n_heads, hd, num_kv_heads=self.n_kv_heads
            )
        else:
            q, k, v = projections
            q.sharding_strategy = ShardingStrategy.head_aware_rowwise(n, self.n_heads, hd)
            k.sharding_strategy = ShardingStrategy.head_aware_rowwise(n, self.n_heads, hd, num_kv_heads=self.n_kv_heads)
            v.sharding_strategy = ShardingStrategy.head_aware_rowwise(n, self.n_heads, hd, num_kv_heads=self.n_kv_heads)
        self.o_proj.sharding_strategy = ShardingStrategy.head_aware_columnwise(n, self.n_heads, hd)
        parts = [lin.shard(devs) for lin in projections]
        o_parts = self.o_proj.shard(devs)
        projection_names = {"qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj"}
        out = []
        for i, dev in enumerate(devs):
            kv_heads = query_kv_heads(self.n_heads, self.n_kv_heads, i, n)
            s = _shard_view(self, self._shard_class())
            s.n_heads = num_heads_for_device(num_heads=self.n_heads, device_idx=i, num_devices=n)
            s.n_kv_heads, s.devices = len(kv_heads), [dev]
            s.kv_params = _device_kv_params(self.kv_params, devs, len(kv_heads))
            if self.stacked_qkv:
                s.qkv_proj = parts[0][i]
            else:
                s.q_proj, s.k_proj, s.v_proj = (p[i] for p in parts)
            s.o_proj = o_parts[i]
            for k, v in self.__dict__.get("_sublayers", {}).items():
                if k not in projection_names:
                    setattr(s, k, v)  # norms and rope are shared (replicated)
            out.append(s)
        return out

    # ── the pipeline ──
    def _qkv(self, layer_idx: Any, x: Any, kv: Any, offsets: Any) -> Any:
        """Q ``[T, n_heads, head_dim]``; K/V written into the cache."""
        xq = kernels.fused_qkv_ragged_matmul(
            self.kv_params, x, offsets, self.wqkv, kv, layer_idx, self.n_heads, bias=self.wqkv_bias
        )
        return ops.reshape(xq, [x.shape[0], self.n_heads, self.head_dim])

    def _position(self, layer_idx: Any, xq: Any, kv: Any, freqs_cis: Any, offsets: Any) -> Any:
        return xq

    def _attend(self, layer_idx: Any, xq: Any, kv: Any, offsets: Any) -> Any:
        return kernels.flash_attention_ragged(
            self.kv_params, xq, offsets, kv, layer_idx, self.mask_variant, self.scale, self.local_window_size
        )

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
            input_row_offsets = kwargs.get("input_row_offsets")
        if input_row_offsets is None:
            raise ValueError(f"{name}: input_row_offsets (uint32 [batch + 1]) is required for ragged inputs")
        if x.rank != 2 or int(x.shape[1]) != self.hidden_size:
            raise ValueError(f"{name}: x must be ragged [total_tokens, {self.hidden_size}], got shape {list(x.shape)}")
        xq = self._qkv(layer_idx, x, kv_collection, input_row_offsets)
        xq = self._position(layer_idx, xq, kv_collection, freqs_cis, input_row_offsets)
        attn = self._attend(layer_idx, xq, kv_collection, input_row_offsets)
        return self.o_proj(ops.reshape(attn, [x.shape[0], self.n_heads * self.head_dim]))


class AttentionWithRope(_RaggedAttentionBase):
    """Implementation of attention that uses Rotary Position Embedding (RoPE).

    Grouped-query attention when ``num_key_value_heads < num_attention_heads``.
    ``scale`` defaults to ``rope.compute_scale()`` (``1/sqrt(head_dim)``);
    ``use_qk_norm`` RMS-normalizes queries and keys per head before RoPE (Qwen3);
    ``clip_qkv`` clamps the fused QKV weight.

    Example:
        >>> attn = AttentionWithRope(rope=rope, num_attention_heads=4, num_key_value_heads=2,  # doctest: +SKIP
        ...                          hidden_size=32, kv_params=kv_params)
        >>> y = attn(0, x, kv_collection, rope.freqs_cis, input_row_offsets)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        rope: Any,
        sharding_strategy: ShardingStrategy | None = None,
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
        use_qk_norm: bool = False,
        rms_norm_eps: float = 1e-6,
    ):
        super().__init__()
        name = type(self).__name__
        if float8_config is not None:
            raise ValueError(
                f"{name}: float8_config is not supported by the maxfx layer; use "
                "kernels.fused_qkv_ragged_matmul_scaled_float8 with float8 weights"
            )
        self.rope = rope
        self._init_common(
            name,
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
        self.use_qk_norm, self.rms_norm_eps = bool(use_qk_norm), float(rms_norm_eps)
        if self.use_qk_norm:
            self.q_norm = RMSNorm(self.head_dim, dtype, eps=rms_norm_eps, multiply_before_cast=False)
            self.k_norm = RMSNorm(self.head_dim, dtype, eps=rms_norm_eps, multiply_before_cast=False)
        self.sharding_strategy = sharding_strategy

    def _default_scale(self) -> float:
        compute = getattr(self.rope, "compute_scale", None)
        return float(compute()) if callable(compute) else super()._default_scale()

    @property
    def qkv_input_scale(self) -> Any:
        """The max of q, k, and v scale input vectors (None: this layer has no float8 input scales)."""
        return None

    @property
    def qkv_weight_scale(self) -> Any:
        """The max of q, k, and v scale weight vectors.

        Raises:
            ValueError: the layer has no float8 weights (maxfx layers hold float weights).
        """
        raise ValueError(
            f"{type(self).__name__}.qkv_weight_scale: the layer has no float8 weight scales (float8_config is "
            f"unsupported); weights are {self.dtype}"
        )

    def _position(self, layer_idx: Any, xq: Any, kv: Any, freqs_cis: Any, offsets: Any) -> Any:
        if freqs_cis is None:
            freqs_cis = self.rope.freqs_cis
        if self.use_qk_norm:
            xq = self.q_norm(xq)
            k_gamma = _on(self.k_norm.weight, xq.device)
            kernels.rms_norm_key_cache(
                self.kv_params,
                kv,
                k_gamma,
                self.rms_norm_eps,
                layer_idx,
                xq.shape[0],
                offsets,
                0.0,
                multiply_before_cast=False,
            )
        return kernels.fused_qk_ragged_rope(
            self.kv_params, xq, offsets, kv, freqs_cis, layer_idx, interleaved=getattr(self.rope, "interleaved", True)
        )


class AttentionWithRopeNoOpaque(AttentionWithRope):
    """Attention with RoPE without the fused (opaque) cache kernels.

    Q, K and V come from separate projections; RoPE is applied to K before it
    is stored (``ops.rope_ragged`` + ``ops.kv_cache_store``), then
    ``flash_attention_ragged`` reads the cache. Same results as
    `AttentionWithRope` (no float8, stacked qkv, bias or clipping).
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
        scale: float | None = None,
    ):
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
        )

    def _qkv(self, layer_idx: Any, x: Any, kv: Any, offsets: Any) -> Any:
        self._pending = (layer_idx, x)
        return ops.reshape(self.q_proj(x), [x.shape[0], self.n_heads, self.head_dim])

    def _position(self, layer_idx: Any, xq: Any, kv: Any, freqs_cis: Any, offsets: Any) -> Any:
        _, x = self._pending
        del self._pending
        freqs = self.rope.freqs_cis if freqs_cis is None else freqs_cis
        freqs = _on(freqs, x.device)
        interleaved = getattr(self.rope, "interleaved", True)
        layer = _layer_scalar(layer_idx, x.device)
        zero = ops.constant(0, DType.uint32, x.device)
        t = x.shape[0]
        k = ops.reshape(self.k_proj(x), [t, self.n_kv_heads, self.head_dim])
        v = ops.reshape(self.v_proj(x), [t, self.n_kv_heads, self.head_dim])
        k = ops.rope_ragged(k, freqs, offsets, kv.cache_lengths, interleaved=interleaved)
        for kv_index, rows in ((0, k), (1, v)):
            ops.kv_cache_store(
                kv.kv_blocks,
                rows.cast(kv.kv_blocks.dtype),
                kv.lookup_table,
                layer,
                offsets,
                kv.cache_lengths,
                zero,
                kv_index=kv_index,
            )
        return ops.rope_ragged(xq, freqs, offsets, kv.cache_lengths, interleaved=interleaved)


class GGUFQAttentionWithRope(AttentionWithRope):
    """Attention with RoPE over GGUF-quantized projections (``q_proj``/``k_proj``/``v_proj``/``o_proj``
    hold packed blocks; ``unfused_qkv_ragged_matmul_gguf_quantized``)."""

    def __init__(
        self,
        *,
        rope: Any,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        dtype: DType,
        quantization_encoding: Any,
        devices: Sequence[Any] | None = None,
        linear_cls: Callable[..., Any] = Linear,
        scale: float | None = None,
        has_bias: bool = False,
        clip_qkv: float | None = None,
    ):
        Module.__init__(self)
        name = type(self).__name__
        if quantization_encoding is None:
            raise ValueError(f"{name}: quantization_encoding is required")
        if has_bias or clip_qkv is not None:
            raise ValueError(f"{name}: biases and clip_qkv are not supported with GGUF-quantized projections")
        self.rope, self.quantization_encoding = rope, quantization_encoding
        self.use_qk_norm, self.rms_norm_eps = False, 1e-6
        self._init_common(
            name,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            hidden_size=hidden_size,
            kv_params=kv_params,
            devices=devices,
            dtype=dtype,
            linear_cls=linear_cls,
            stacked_qkv=False,
            scale=scale,
            has_bias=False,
            clip_qkv=None,
            quantization_encoding=quantization_encoding,
        )

    def _qkv(self, layer_idx: Any, x: Any, kv: Any, offsets: Any) -> Any:
        dev, enc = self.devices[0], self.quantization_encoding
        ws = [_on(p.weight, dev) for p in (self.q_proj, self.k_proj, self.v_proj)]
        xq = kernels.unfused_qkv_ragged_matmul_gguf_quantized(
            self.kv_params, x, offsets, self.n_heads, *ws, enc, enc, enc, kv, layer_idx
        )
        return ops.reshape(xq, [x.shape[0], self.n_heads, self.head_dim])

    def shard(self, devices: Iterable[Any]) -> list[Any]:
        """Raises ValueError: packed GGUF blocks cannot be split by heads here."""
        raise ValueError(f"{type(self).__name__}.shard: GGUF-quantized attention does not support tensor parallelism")


class GPTQAttentionWithRope(AttentionWithRope):
    """Attention with RoPE whose q/k/v/o projections are GPTQ-packed (``fused_qkv_ragged_matmul_quantized``).

    Each projection holds ``weight`` (uint8 GPTQ blocks, as ``ops.qmatmul`` takes them)
    and, with act-order (``quantization_config.desc_act``), ``perm_idx``.
    """

    def __init__(
        self,
        quantization_config: Any,
        rope: Any,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        devices: Sequence[Any] | None = None,
        dtype: DType = DType.float32,
        scale: float | None = None,
        linear_cls: Callable[..., Any] = Linear,
    ):

        Module.__init__(self)
        name = type(self).__name__
        if quantization_config is None:
            raise ValueError(f"{name}: quantization_config is required")
        self.rope, self.quantization_config = rope, quantization_config
        self.use_qk_norm, self.rms_norm_eps = False, 1e-6
        _check_heads(name, int(num_attention_heads), int(num_key_value_heads), int(hidden_size), kv_params)
        self.n_heads, self.n_kv_heads, self.hidden_size = (
            int(num_attention_heads),
            int(num_key_value_heads),
            int(hidden_size),
        )
        self.kv_params, self.devices, self.dtype, self.head_dim = (
            kv_params,
            _devices(devices),
            dtype,
            kv_params.head_dim,
        )
        self.stacked_qkv, self.has_bias, self.clip_qkv = False, False, None
        self.scale = float(scale) if scale is not None else self._default_scale()
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        make = lambda i, o: gptq_projection(i, o, dtype, self.devices[0], quantization_config)  # noqa: E731
        self.q_proj, self.k_proj, self.v_proj = (
            make(hidden_size, q_dim),
            make(hidden_size, kv_dim),
            make(hidden_size, kv_dim),
        )
        self.o_proj = make(q_dim, hidden_size)

    @property
    def wqkv(self) -> Any:
        """The concatenation of q, k, and v weight vectors (packed + scales), along the output dim."""
        dev = self.devices[0]
        packed = [_on(p.weight, dev) for p in (self.q_proj, self.k_proj, self.v_proj)]
        return concat_gptq(packed, self.hidden_size, int(self.quantization_config.group_size))

    def _qkv(self, layer_idx: Any, x: Any, kv: Any, offsets: Any) -> Any:
        perm = (
            _on(self.q_proj.perm_idx, self.devices[0]) if getattr(self.q_proj, "perm_idx", None) is not None else None
        )
        xq = kernels.fused_qkv_ragged_matmul_quantized(
            self.kv_params, x, offsets, self.wqkv, kv, layer_idx, self.n_heads, self.quantization_config, perm_idx=perm
        )
        return ops.reshape(xq, [x.shape[0], self.n_heads, self.head_dim])

    def shard(self, devices: Iterable[Any]) -> list[Any]:
        """Raises ValueError: GPTQ-packed weights cannot be split by heads here."""
        raise ValueError(f"{type(self).__name__}.shard: GPTQ attention does not support tensor parallelism")


# ─── distributed ──────────────────────────────────────────────────────────


def _per_device(name: str, n: int, **lists: Any) -> None:
    for k, v in lists.items():
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"{name}: Expected {n} {k} (a list with one entry per device), got {type(v).__name__}")
        if len(v) != n:
            raise ValueError(f"{name}: Expected {n} {k}, got {len(v)} (one entry per device)")


def _per_device_inputs(layer: Any, xs: Any, kv_collections: Any, freqs_cis: Any, input_row_offsets: Any) -> None:
    """Raise unless each input of a distributed ``layer`` is a list with one entry per device."""
    lists = dict(xs=xs, kv_collections=kv_collections, freqs_cis=freqs_cis, input_row_offsets=input_row_offsets)
    _per_device(type(layer).__name__, len(layer.devices), **lists)


def _layer_scalar(layer_idx: Any, device: Any) -> Any:
    """``layer_idx`` (an int or a uint32 graph value) as the uint32 scalar the cache ops take."""
    if hasattr(layer_idx, "type"):
        return ops.reshape(layer_idx, [])
    return ops.constant(int(layer_idx), DType.uint32, device)


def _forward_shard(self: Any, layer_idx: Any, x: Any, kv: Any, freqs: Any, offsets: Any) -> Any:
    return _RaggedAttentionBase.__call__(self, layer_idx, x, kv, freqs, offsets)


_RaggedAttentionBase._forward_shard = _forward_shard  # type: ignore[attr-defined]


class DataParallelAttentionWithRope(AttentionWithRope, DistributedAttentionImpl):
    """Data-parallel implementation of Attention with RoPE.

    The same weights run on every device over that device's own inputs
    (``xs[i]``, ``kv_collections[i]``, ``freqs_cis[i]``, ``input_row_offsets[i]``
    rebased to 0); no collectives, each KV cache stays local.

    Call: ``attn(layer_idx, xs, kv_collections, freqs_cis, input_row_offsets)`` → one output per device.
    """

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
        home = self.devices
        outs = []
        try:
            for dev, x, kv, f, o in zip(home, xs, kv_collections, freqs_cis, input_row_offsets):
                self.devices = [dev]
                for lin in self._projections() + [self.o_proj]:
                    lin.device = dev
                outs.append(_RaggedAttentionBase.__call__(self, layer_idx, x, kv, f, o))
        finally:
            self.devices = home
            for lin in self._projections() + [self.o_proj]:
                lin.device = home[0]
        return outs
