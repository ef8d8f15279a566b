"""Attention and paged KV-cache kernels of ``max.nn.kernels``.

Each wrapper checks its arguments against the `KVCacheParams` and composes
registry ops (``ops.paged_attention``, ``ops.kv_cache_store``, ...). The
``kv_collection`` argument is a `PagedCacheValues` (see
``maxfx.nn.kv_cache``): writes to the cache update its block-pool buffer.

Ragged inputs are ``[total_tokens, ...]`` with ``input_row_offsets [batch + 1]``
(uint32 prefix sums); the new tokens of sequence ``b`` sit at cache positions
``cache_lengths[b] + i``.
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.graph.quantization import QuantizationEncoding
from maxfx.nn.kernels import _pool
from maxfx.nn.kernels._lora import sgmv_lora_kernel
from maxfx.nn.kv_cache._paged import PagedCacheValues
from maxfx.nn.kv_cache._params import KVCacheParams, KVCacheStrategy

__all__ = [
    "cross_attention_ragged",
    "flash_attention_gpu",
    "flash_attention_ragged",
    "flash_attention_ragged_gpu",
    "fused_qk_ragged_rope",
    "fused_qkv_ragged_matmul",
    "fused_qkv_ragged_matmul_quantized",
    "k_cache_to_buffer",
    "kv_cache_get_max_seq_len",
    "kv_cache_ragged_radd",
    "matmul_k_cache_ragged",
    "matmul_kv_cache_ragged",
    "rms_norm_key_cache",
    "unfused_qkv_ragged_matmul_gguf_quantized",
]

# Mask variants by enum value: MHAMaskVariant uses '0'..'4', AttentionMaskVariant names.
_MASKS = {
    "0": "causal",
    "1": "causal_alibi",
    "2": "null",
    "3": "chunked",
    "4": "sliding_window",
    "causal": "causal",
    "null": "null",
    "chunked_causal": "chunked",
    "sliding_window_causal": "sliding_window",
}


def mask_name(where: str, mask_variant: Any, local_window_size: int = -1) -> str:
    """The registry op's mask string for an `MHAMaskVariant` / `AttentionMaskVariant`."""
    value = getattr(mask_variant, "value", mask_variant)
    if value == "tensor_mask":
        raise ValueError(
            f"{where}: AttentionMaskVariant.TENSOR_MASK needs an explicit mask tensor, which this kernel does not "
            "take; use ops.attention with q_offset/kv_length"
        )
    if value not in _MASKS:
        raise ValueError(
            f"{where}: mask_variant must be an MHAMaskVariant or AttentionMaskVariant, got {mask_variant!r}"
        )
    mask = _MASKS[value]
    if mask in ("sliding_window", "chunked") and int(local_window_size) <= 0:
        raise ValueError(f"{where}: {mask_variant!r} needs local_window_size > 0, got {local_window_size}")
    return mask


def _params(where: str, kv_params: Any) -> KVCacheParams:
    if not isinstance(kv_params, KVCacheParams):
        raise TypeError(f"{where}: kv_params must be a KVCacheParams, got {type(kv_params).__name__}")
    if kv_params.cache_strategy is not KVCacheStrategy.PAGED:
        raise ValueError(f"{where}: maxfx kernels use the PAGED cache strategy, got {kv_params.cache_strategy}")
    return kv_params


def _collection(where: str, kv_collection: Any) -> PagedCacheValues:
    if not isinstance(kv_collection, PagedCacheValues):
        raise TypeError(
            f"{where}: kv_collection must be a PagedCacheValues (see maxfx.nn.kv_cache), got "
            f"{type(kv_collection).__name__}"
        )
    return kv_collection


def _index(value: Any, device: Any) -> Any:
    """An int or scalar tensor as a uint32 scalar graph value."""
    if hasattr(value, "type"):
        return value.reshape([]) if value.rank else value
    return ops.constant(int(value), DType.uint32, device)


def _rows(where: str, x: Any, n_heads: int, head_dim: int, what: str) -> Any:
    """``[T, n_heads * head_dim]`` → ``[T, n_heads, head_dim]``."""
    if x.rank != 2 or int(x.shape[1]) != n_heads * head_dim:
        raise ValueError(f"{where}: {what} must be [total_tokens, {n_heads} * {head_dim}], got shape {list(x.shape)}")
    return ops.reshape(x, [x.shape[0], n_heads, head_dim])


def _store(
    kv: PagedCacheValues,
    rows: Any,
    layer: Any,
    offsets: Any,
    kv_index: int,
    batch_offset: Any = None,
    start: Any = None,
) -> None:
    dev = rows.device
    zero = _index(0 if batch_offset is None else batch_offset, dev)
    start = kv.cache_lengths if start is None else start
    _pool.store_rows(kv.kv_blocks, rows, kv.lookup_table, layer, offsets, start, zero, kv_index)


def _gather(
    kv: PagedCacheValues,
    layer: Any,
    offsets: Any,
    n_rows: Any,
    kv_index: int,
    batch_offset: Any = None,
    start: Any = None,
) -> Any:
    dev = offsets.device
    zero = _index(0 if batch_offset is None else batch_offset, dev)
    start = kv.cache_lengths if start is None else start
    blocks = kv.kv_blocks
    return ops.kv_cache_gather(
        _pool.read_pool(blocks),
        kv.lookup_table,
        _pool.layer_for(blocks, layer),
        offsets,
        start,
        zero,
        n_rows=n_rows,
        kv_index=kv_index,
    )


def _check_input(where: str, x: Any, rank: int, what: str = "input") -> None:
    if x.rank != rank:
        raise ValueError(f"{where}: {what} must have rank {rank}, got shape {list(x.shape)}")


# ─── attention ────────────────────────────────────────────────────────────


def flash_attention_gpu(
    q: Any, k: Any, v: Any, mask_variant: Any, scale: float, local_window_size: int = -1, valid_length: Any = None
) -> Any:
    """Attention over padded ``q, k, v [batch, seq, heads, head_dim]``.

    ``valid_length`` (uint32 ``[batch]``) limits each sequence's keys. Runs on
    any device (the name is MAX's).

    Example:
        >>> out = flash_attention_gpu(q, k, v, MHAMaskVariant.CAUSAL_MASK, scale=0.125)  # doctest: +SKIP
    """
    where = "flash_attention_gpu"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_input(where, t, 4, name)
    mask = mask_name(where, mask_variant, local_window_size)
    return ops.attention(q, k, v, mask=mask, scale=scale, window=local_window_size, kv_length=valid_length)


def flash_attention_ragged_gpu(
    q: Any,
    k: Any,
    v: Any,
    input_row_offsets: Any,
    max_seq_len: Any,
    mask_variant: Any,
    scale: float,
    local_window_size: int = -1,
) -> Any:
    """Attention over ragged ``q, k, v [total_tokens, heads, head_dim]`` (no KV cache).

    ``max_seq_len`` (an int) bounds the per-sequence length; a tensor value is
    accepted and ignored (the bound then is the token count).

    Example:
        >>> out = flash_attention_ragged_gpu(q, k, v, offsets, 128, MHAMaskVariant.CAUSAL_MASK, 0.125)  # doctest: +SKIP
    """
    where = "flash_attention_ragged_gpu"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_input(where, t, 3, name)
    mask = mask_name(where, mask_variant, local_window_size)
    bound = int(max_seq_len) if isinstance(max_seq_len, int) else 0
    return ops.ragged_attention(
        q, k, v, input_row_offsets, mask=mask, scale=scale, window=local_window_size, max_q_len=bound, max_kv_len=bound
    )


def _cache_attention(
    where: str,
    kv: PagedCacheValues,
    input: Any,
    input_row_offsets: Any,
    layer_idx: Any,
    mask_variant: Any,
    scale: float,
    local_window_size: int = -1,
    **extra: Any,
) -> Any:  # noqa: A002
    """``ops.paged_attention`` of ``input`` over the collection's cache (``extra``: cross-attention offsets, sinks,
    MLA's ``v_dim``).
    """
    mask = mask_name(where, mask_variant, local_window_size)
    blocks = kv.kv_blocks
    layer = _pool.layer_for(blocks, _index(layer_idx, input.device))
    return ops.paged_attention(
        input, _pool.read_pool(blocks), kv.lookup_table, layer, input_row_offsets, kv.cache_lengths,
        mask=mask, scale=scale, window=local_window_size, **extra,
    )  # fmt: skip


def flash_attention_ragged(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    kv_collection: Any,
    layer_idx: Any,
    mask_variant: Any,
    scale: float,
    local_window_size: int = -1,
    sink_weights: Any = None,  # noqa: A002
) -> Any:
    """Self-attention of ragged queries ``[total_tokens, n_heads, head_dim]`` over the paged cache.

    The new tokens' K/V must already be in the cache (`fused_qkv_ragged_matmul`).
    ``sink_weights [n_heads]`` adds a per-head sink logit to each softmax.

    Example:
        >>> attn = flash_attention_ragged(kv_params, xq, offsets, kv, layer_idx, MHAMaskVariant.CAUSAL_MASK,
        ...     scale)  # doctest: +SKIP
    """
    where = "flash_attention_ragged"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    _check_input(where, input, 3)
    if int(input.shape[2]) != p.head_dim:
        raise ValueError(f"{where}: input head_dim {input.shape[2]} differs from kv_params.head_dim {p.head_dim}")
    return _cache_attention(
        where,
        kv,
        input,
        input_row_offsets,
        layer_idx,
        mask_variant,
        scale,
        local_window_size,
        sink_weights=sink_weights,
    )


def cross_attention_ragged(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    kv_collection: Any,
    layer_idx: Any,
    mask_variant: Any,
    kv_input_row_offsets: Any,
    q_max_seq_len: Any,
    scale: float,
    local_window_size: int = -1,  # noqa: A002
) -> Any:
    """Cross-attention of ragged queries over keys cached from another ragged input.

    Sequence ``b`` attends to cache positions ``0 .. kv_len[b]-1`` with
    ``kv_len = diff(kv_input_row_offsets)`` (stored earlier, e.g. by
    `matmul_kv_cache_ragged` on the encoder states); ``q_max_seq_len`` is informational.

    Example:
        >>> out = cross_attention_ragged(kv_params, xq, offsets, kv, 0, MHAMaskVariant.NULL_MASK, vision_offsets, 16,
        ...     scale)  # doctest: +SKIP
    """
    where = "cross_attention_ragged"
    _params(where, kv_params)
    kv = _collection(where, kv_collection)
    _check_input(where, input, 3)
    return _cache_attention(
        where,
        kv,
        input,
        input_row_offsets,
        layer_idx,
        mask_variant,
        scale,
        local_window_size,
        kv_row_offsets=kv_input_row_offsets,
    )


# ─── projections that write the cache ─────────────────────────────────────


def _split_qkv(where: str, p: KVCacheParams, qkv: Any, n_heads: int) -> tuple[Any, Any, Any]:
    nkv, d = p.n_kv_heads_per_device, p.head_dim
    qd, kd = n_heads * d, nkv * d
    if int(qkv.shape[-1]) != qd + 2 * kd:
        raise ValueError(
            f"{where}: the QKV projection has {qkv.shape[-1]} columns; expected (n_heads + 2 * n_kv_heads) * head_dim "
            f"= ({n_heads} + 2 * {nkv}) * {d} = {qd + 2 * kd}"
        )
    return qkv[:, :qd], qkv[:, qd : qd + kd], qkv[:, qd + kd :]


def _write_kv(where: str, p: KVCacheParams, kv: PagedCacheValues, k: Any, v: Any, layer: Any, offsets: Any) -> None:
    nkv, d = p.n_kv_heads_per_device, p.head_dim
    _pool.check_pool(where, kv.kv_blocks, nkv, d)
    _store(kv, _rows(where, k, nkv, d, "K"), layer, offsets, 0)
    if v is not None:
        _store(kv, _rows(where, v, nkv, d, "V"), layer, offsets, 1)


def _qkv_to_cache(
    where: str, p: KVCacheParams, kv: PagedCacheValues, qkv: Any, bias: Any, n_heads: int, layer: Any, offsets: Any
) -> Any:
    """The tail of the fused QKV matmuls: add ``bias``, write the K and V columns into the cache, return the Q
    columns.
    """
    if bias is not None:
        qkv = qkv + bias
    q, k, v = _split_qkv(where, p, qkv, n_heads)
    _write_kv(where, p, kv, k, v, layer, offsets)
    return q


def _check_matmul(where: str, x: Any, w: Any) -> None:
    _check_input(where, x, 2)
    if w.rank != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(
            f"{where}: weight must be [out_dim, {x.shape[1]}] to multiply input {list(x.shape)}, got {list(w.shape)}"
        )


def fused_qkv_ragged_matmul(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    wqkv: Any,
    kv_collection: Any,
    layer_idx: Any,
    n_heads: int,
    bias: Any = None,
) -> Any:  # noqa: A002
    """``input @ wqkv.T (+ bias)``: writes K and V rows into the cache, returns Q ``[total_tokens, n_heads *
    head_dim]``.

    ``wqkv`` is ``[(n_heads + 2 * n_kv_heads) * head_dim, hidden]`` (Q rows, then K, then V).

    Example:
        >>> xq = fused_qkv_ragged_matmul(kv_params, x, offsets, attn.wqkv, kv, layer_idx, n_heads=8)  # doctest: +SKIP
    """
    where = "fused_qkv_ragged_matmul"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    _check_matmul(where, input, wqkv)
    return _qkv_to_cache(
        where, p, kv, input @ wqkv.T, bias, n_heads, _index(layer_idx, input.device), input_row_offsets
    )


def fused_qkv_ragged_matmul_quantized(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    wqkv: Any,
    kv_collection: Any,
    layer_idx: Any,
    n_heads: int,
    quantization_config: Any,
    perm_idx: Any = None,
    bias: Any = None,  # noqa: A002
) -> Any:
    """`fused_qkv_ragged_matmul` with a GPTQ-packed ``wqkv`` (``ops.qmatmul``; ``perm_idx`` for act-order).

    Raises:
        ValueError: ``quantization_config`` is missing.
    """
    where = "fused_qkv_ragged_matmul_quantized"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    if quantization_config is None:
        raise ValueError(f"{where}: quantization_config (GPTQ) is required")
    _check_input(where, input, 2)
    rhs = [wqkv]
    x = input
    if perm_idx is not None:
        x = ops.gather(input, perm_idx, axis=-1)
        rhs.append(perm_idx)
    qkv = ops.qmatmul(QuantizationEncoding.GPTQ, quantization_config, x, *rhs)
    return _qkv_to_cache(where, p, kv, qkv, bias, n_heads, _index(layer_idx, input.device), input_row_offsets)


def unfused_qkv_ragged_matmul_gguf_quantized(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    n_heads: int,
    q_weight: Any,
    k_weight: Any,
    v_weight: Any,  # noqa: A002
    quantization_encoding_q: Any,
    quantization_encoding_k: Any,
    quantization_encoding_v: Any,
    kv_collection: Any,
    layer_idx: Any,
) -> Any:
    """Q, K and V from three GGUF-quantized weights (``ops.qmatmul`` each); K/V go to the cache, Q is returned.

    Raises:
        ValueError: an encoding is missing.
    """
    where = "unfused_qkv_ragged_matmul_gguf_quantized"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    _check_input(where, input, 2)
    encs = (quantization_encoding_q, quantization_encoding_k, quantization_encoding_v)
    if any(e is None for e in encs):
        raise ValueError(f"{where}: all three quantization encodings are required, got {encs}")
    q, k, v = (ops.qmatmul(e, None, input, w) for e, w in zip(encs, (q_weight, k_weight, v_weight)))
    if int(q.shape[-1]) != n_heads * p.head_dim:
        raise ValueError(
            f"{where}: q_weight gives {q.shape[-1]} columns; expected n_heads * head_dim = {n_heads * p.head_dim}"
        )
    _write_kv(where, p, kv, k, v, _index(layer_idx, input.device), input_row_offsets)
    return q


def matmul_kv_cache_ragged(
    kv_params: Any, hidden_states: Any, input_row_offsets: Any, weight: Any, kv_collection: Any, layer_idx: Any
) -> None:
    """``hidden_states @ weight.T`` = ``[K | V]`` rows, written into the cache.

    Example:
        >>> matmul_kv_cache_ragged(kv_params, encoder_states, enc_offsets, wkv, kv, 0)  # doctest: +SKIP
    """
    where = "matmul_kv_cache_ragged"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    _check_matmul(where, hidden_states, weight)
    kvd = p.n_kv_heads_per_device * p.head_dim
    out = hidden_states @ weight.T
    if int(out.shape[-1]) != 2 * kvd:
        raise ValueError(
            f"{where}: weight gives {out.shape[-1]} columns; expected 2 * n_kv_heads * head_dim = {2 * kvd}"
        )
    _write_kv(where, p, kv, out[:, :kvd], out[:, kvd:], _index(layer_idx, hidden_states.device), input_row_offsets)


def matmul_k_cache_ragged(
    kv_params: Any, hidden_states: Any, input_row_offsets: Any, weight: Any, kv_collection: Any, layer_idx: Any
) -> None:
    """``hidden_states @ weight.T`` = K rows (MLA: the latent cache), written into the cache."""
    where = "matmul_k_cache_ragged"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    _check_matmul(where, hidden_states, weight)
    _write_kv(where, p, kv, hidden_states @ weight.T, None, _index(layer_idx, hidden_states.device), input_row_offsets)


# ─── cache maintenance ────────────────────────────────────────────────────


def fused_qk_ragged_rope(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    kv_collection: Any,
    freqs_cis: Any,
    layer_idx: Any,
    interleaved: bool = True,
    position_ids: Any = None,
    mrope_section: Any = None,  # noqa: A002
) -> Any:
    """RoPE on the queries (returned) and on this step's keys in the cache (rotated in place).

    Token ``i`` of sequence ``b`` is at position ``cache_lengths[b] + i`` unless
    ``position_ids`` says otherwise; ``freqs_cis`` is ``[max_seq_len * 2, head_dim]``.

    Example:
        >>> xq = fused_qk_ragged_rope(kv_params, xq, offsets, kv, rope.freqs_cis, layer_idx)  # doctest: +SKIP
    """
    where = "fused_qk_ragged_rope"
    _params(where, kv_params)
    kv = _collection(where, kv_collection)
    _check_input(where, input, 3)
    freqs = freqs_cis if freqs_cis.device == input.device else freqs_cis.to(input.device)
    layer = _index(layer_idx, input.device)
    rope = dict(interleaved=interleaved, position_ids=position_ids, mrope_section=mrope_section)
    k_new = _gather(kv, layer, input_row_offsets, input.shape[0], 0)
    _store(kv, ops.rope_ragged(k_new, freqs, input_row_offsets, kv.cache_lengths, **rope), layer, input_row_offsets, 0)
    return ops.rope_ragged(input, freqs, input_row_offsets, kv.cache_lengths, **rope)


def kv_cache_ragged_radd(
    kv_params: Any, a: Any, kv_collection: Any, input_row_offsets: Any, batch_offset: Any, layer_idx: Any
) -> None:
    """Add ``a [total_tokens, 2 * n_kv_heads * head_dim]`` (K half, V half) to this step's cache rows
    of sequences ``batch_offset, batch_offset + 1, ...`` (``input_row_offsets`` covers that sub-batch)."""
    where = "kv_cache_ragged_radd"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    _check_input(where, a, 2, "a")
    nkv, d = p.n_kv_heads_per_device, p.head_dim
    if int(a.shape[1]) != 2 * nkv * d:
        raise ValueError(f"{where}: a must be [total_tokens, 2 * {nkv} * {d}], got {list(a.shape)}")
    layer = _index(layer_idx, a.device)
    for kv_index, part in enumerate((a[:, : nkv * d], a[:, nkv * d :])):
        old = _gather(kv, layer, input_row_offsets, a.shape[0], kv_index, batch_offset)
        new = old + _rows(where, part, nkv, d, "a").cast(old.dtype)
        _store(kv, new, layer, input_row_offsets, kv_index, batch_offset)


def rms_norm_key_cache(
    kv_params: Any,
    kv_collection: Any,
    gamma: Any,
    epsilon: float,
    layer_idx: Any,
    total_seq_len: Any,
    input_row_offsets: Any,
    weight_offset: float,
    rms_norm_cols: int | None = None,
    multiply_before_cast: bool = True,
    per_head_norm: bool = True,
) -> None:
    """RMSNorm of this step's K rows in the cache (in place): per head over ``head_dim``
    (``per_head_norm``) or over all heads; only the first ``rms_norm_cols`` columns when given."""
    where = "rms_norm_key_cache"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    nkv, d = p.n_kv_heads_per_device, p.head_dim
    layer = _index(layer_idx, input_row_offsets.device)
    k = _gather(kv, layer, input_row_offsets, total_seq_len, 0)
    width = d if per_head_norm else nkv * d
    rows = k if per_head_norm else ops.reshape(k, [k.shape[0], width])
    cols = width if rms_norm_cols is None else int(rms_norm_cols)
    if int(gamma.shape[0]) != cols or cols > width:
        raise ValueError(
            f"{where}: gamma must have {cols} entries (the normalized columns, at most {width}), got "
            f"{list(gamma.shape)}"
        )
    head = rows[..., :cols] if cols < width else rows
    normed = ops.rms_norm(
        head,
        gamma.cast(rows.dtype) if gamma.dtype != rows.dtype else gamma,
        epsilon,
        weight_offset,
        multiply_before_cast,
    )
    if cols < width:
        normed = ops.concat([normed, rows[..., cols:]], axis=-1)
    _store(kv, ops.reshape(normed, [k.shape[0], nkv, d]), layer, input_row_offsets, 0)


def kv_cache_get_max_seq_len(kv_params: Any, kv_collection: Any) -> Any:
    """The longest total sequence (cached + new tokens) of this step: ``kv_collection.max_cache_length`` as uint32
    ``[1]``.
    """
    where = "kv_cache_get_max_seq_len"
    _params(where, kv_params)
    kv = _collection(where, kv_collection)
    return ops.reshape(kv.max_cache_length, [1])


def k_cache_to_buffer(
    kv_params: Any,
    buffer_row_offsets_1d: Any,
    cache_offsets_1d: Any,
    kv_collection: Any,
    layer_idx: Any,
    buffer_length: Any,
    buffer_size: int,
    weight_dim: int,
) -> Any:
    """Copy cached K rows into a contiguous ``[buffer_size, weight_dim]`` buffer.

    Buffer rows ``buffer_row_offsets_1d[b] : buffer_row_offsets_1d[b+1]`` hold
    sequence ``b``'s cache positions from ``cache_offsets_1d[b]`` on; rows past
    the last offset (``buffer_length``) are zero.
    """
    where = "k_cache_to_buffer"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    width = p.n_kv_heads_per_device * p.head_dim
    if int(weight_dim) > width:
        raise ValueError(f"{where}: weight_dim {weight_dim} exceeds the cached row width {width}")
    layer = _index(layer_idx, buffer_row_offsets_1d.device)
    rows = _gather(kv, layer, buffer_row_offsets_1d, int(buffer_size), 0, start=cache_offsets_1d)
    return ops.reshape(rows, [int(buffer_size), width])[:, : int(weight_dim)]


# ─── multi-latent attention (MLA) ─────────────────────────────────────────
# The MLA cache has kv_dim 1, one KV head and rows [kv_lora_rank latent | qk_rope_dim rotated key].


def flare_mla_decode_ragged(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    kv_collection: Any,
    layer_idx: Any,
    mask_variant: Any,
    scale: float,
    qk_rope_dim: int = 64,
) -> Any:  # noqa: A002
    """Absorbed MLA attention: queries ``[total_tokens, n_heads, kv_lora_rank + qk_rope_dim]`` against
    the latent cache rows (keys: whole rows; values: the first ``kv_lora_rank`` dims).

    Returns ``[total_tokens, n_heads, kv_lora_rank]``.
    """
    where = "flare_mla_decode_ragged"
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    _check_input(where, input, 3)
    if int(input.shape[2]) != p.head_dim or not 0 < int(qk_rope_dim) < p.head_dim:
        raise ValueError(
            f"{where}: input head dim {input.shape[2]} must equal the latent cache's head_dim {p.head_dim}, with 0 < "
            f"qk_rope_dim ({qk_rope_dim}) < it"
        )
    return _cache_attention(
        where, kv, input, input_row_offsets, layer_idx, mask_variant, scale, v_dim=p.head_dim - int(qk_rope_dim)
    )


MLA_GRAPH_MODES = ("prefill", "decode", "auto")


def check_mla_settings(
    layer: str, kv_params: Any, kv_lora_rank: int, qk_rope_head_dim: int, graph_mode: str | None
) -> str:
    """The settings both MLA layers check (the cache must hold ``[latent | k_pe]`` rows); returns the mode
    (None: ``"auto"``).

    Raises:
        ValueError: an unknown ``graph_mode``, or ``kv_params`` that is not an MLA cache of ``kv_lora_rank +
            qk_rope_head_dim`` columns.
    """
    mode = graph_mode or "auto"
    if mode not in MLA_GRAPH_MODES:
        raise ValueError(f"{layer}: invalid graph_mode {graph_mode!r}; use 'prefill', 'decode' or 'auto'")
    if not isinstance(kv_params, KVCacheParams) or not kv_params.is_mla:
        raise ValueError(
            f"{layer}: kv_params must be an MLA cache's KVCacheParams (MLAKVCacheParams), got "
            f"{type(kv_params).__name__}"
        )
    if kv_params.head_dim != kv_lora_rank + qk_rope_head_dim:
        raise ValueError(
            f"{layer}: kv_params.head_dim ({kv_params.head_dim}) must be kv_lora_rank + qk_rope_head_dim = "
            f"{kv_lora_rank} + {qk_rope_head_dim}"
        )
    return mode


def mla_absorbed_attention(
    kv_params: Any,
    q: Any,
    latent: Any,
    k_pe: Any,
    kv_b_weight: Any,
    freqs_cis: Any,
    input_row_offsets: Any,
    kv_collection: Any,
    layer_idx: Any,
    zero: Any,
    mask_variant: Any,
    scale: float,
    *,
    n_heads: int,
    qk_nope_head_dim: int,
    v_head_dim: int,
    interleaved: bool = True,
    q_dtype: DType | None = None,
    out_dtype: DType | None = None,
) -> Any:
    """One MLA step in the absorbed form, shared by the graph-API and the eager layer: ``[tokens, n_heads *
    v_head_dim]``.

    Writes each token's cache row ``[latent | rope(k_pe)]`` (``latent [T, kv_lora_rank]`` already
    normalized, ``k_pe [T, qk_rope_head_dim]``), projects the queries' no-RoPE part into the
    latent space with ``W_uk`` from ``kv_b_weight [n_heads * (nope + v), kv_lora_rank]``, attends
    over the cache (`flare_mla_decode_ragged`) and up-projects with ``W_uv``. ``q [T, n_heads,
    nope + rope]``; ``layer_idx`` and ``zero`` are uint32 scalars; ``mask_variant`` as for
    `flare_mla_decode_ragged`. ``q_dtype``/``out_dtype``: cast
    the attention's queries / its result first (the eager layer's weights and cache may differ).
    """
    kv = kv_collection
    t, rank, rope = q.shape[0], int(latent.shape[-1]), int(k_pe.shape[-1])
    nope = qk_nope_head_dim
    k_rot = ops.rope_ragged(
        ops.reshape(k_pe, [t, 1, rope]), freqs_cis, input_row_offsets, kv.cache_lengths, interleaved=interleaved
    )
    row = ops.concat([ops.reshape(latent, [t, 1, rank]), k_rot], axis=-1)
    ops.kv_cache_store(
        kv.kv_blocks,
        row.cast(kv.kv_blocks.dtype),
        kv.lookup_table,
        layer_idx,
        input_row_offsets,
        kv.cache_lengths,
        zero,
        kv_index=0,
    )
    w = ops.reshape(kv_b_weight, [n_heads, nope + v_head_dim, rank])
    w_uk, w_uv = w[:, :nope, :], ops.permute(w[:, nope:, :], [0, 2, 1])  # [H, nope, rank], [H, rank, v]
    q_pe = ops.rope_ragged(q[:, :, nope:], freqs_cis, input_row_offsets, kv.cache_lengths, interleaved=interleaved)
    q_latent = ops.permute(ops.permute(q[:, :, :nope], [1, 0, 2]) @ w_uk, [1, 0, 2])  # [T, H, rank]
    q_all = ops.concat([q_latent, q_pe], axis=-1)
    attn = flare_mla_decode_ragged(
        kv_params,
        q_all if q_dtype is None else q_all.cast(q_dtype),
        input_row_offsets,
        kv,
        layer_idx,
        mask_variant,
        scale,
        rope,
    )
    if out_dtype is not None:
        attn = attn.cast(out_dtype)
    out = ops.permute(ops.permute(attn, [1, 0, 2]) @ w_uv, [1, 0, 2])  # [T, H, v]
    return ops.reshape(out, [t, n_heads * v_head_dim])


def flare_mla_prefill_plan(
    kv_params: Any, input_row_offsets: Any, kv_collection: Any, layer_idx: Any, buffer_size: int, max_chunks: int = 16
) -> tuple[Any, Any, Any]:
    """Split every sequence's keys (cached + new, concatenated over the batch) into chunks of at most ``buffer_size``
    rows.

    Returns ``(buffer_row_offsets [max_chunks, batch + 1], cache_offsets [max_chunks, batch],
    buffer_lengths [max_chunks])`` (uint32/int32): chunk ``c`` holds rows
    ``buffer_row_offsets[c, b]:buffer_row_offsets[c, b+1]`` of sequence ``b``,
    starting at its cache position ``cache_offsets[c, b]``; unused chunks have length 0.
    """
    where = "flare_mla_prefill_plan"
    _params(where, kv_params)
    kv = _collection(where, kv_collection)
    dev = input_row_offsets.device
    offs = input_row_offsets.cast(DType.int64)
    new = ops.rebind(
        offs[1:] - offs[:-1], kv.cache_lengths.shape, f"{where}: input_row_offsets must have batch_size + 1 entries"
    )
    lengths = kv.cache_lengths.cast(DType.int64) + new  # [B]
    n_b = kv.cache_lengths.shape[0]
    zero = ops.constant([0], DType.int64, dev)
    # Start of each sequence in the concatenation: 0, then inclusive prefix sums (a lower-triangular matmul).
    tri = ops.cast(
        ops.range(0, n_b, dtype=DType.int64, device=dev)[:, None]
        >= ops.range(0, n_b, dtype=DType.int64, device=dev)[None, :],
        DType.int64,
    )
    starts = ops.concat([zero, ops.reshape(tri @ ops.unsqueeze(lengths, -1), [-1])], axis=0)  # [B+1]
    c = ops.range(0, int(max_chunks), dtype=DType.int64, device=dev)[:, None] * int(buffer_size)  # [chunks, 1]
    lo, hi = c, c + int(buffer_size)
    clipped = ops.min(ops.max(starts[None, :], lo), hi) - lo  # [chunks, B+1]
    cache_off = ops.min(ops.max(lo - starts[None, :-1], ops.constant(0, DType.int64, dev)), lengths[None, :])
    buffer_lengths = clipped[:, -1] - clipped[:, 0]
    return clipped.cast(DType.uint32), cache_off.cast(DType.uint32), buffer_lengths.cast(DType.int32)


def flare_mla_decompress_k_cache(
    kv_params: Any,
    buffer_row_offsets_1d: Any,
    cache_offsets_1d: Any,
    buffer_length: Any,
    weight: Any,
    kv_collection: Any,
    layer_idx: Any,
    buffer_size: int,
) -> Any:
    """Up-project cached latents into a ``[buffer_size, weight.shape[0]]`` buffer: `k_cache_to_buffer` of the
    first ``weight.shape[1]`` (``kv_lora_rank``) dims, times ``weight.T``."""
    where = "flare_mla_decompress_k_cache"
    if weight.rank != 2:
        raise ValueError(f"{where}: weight must be [out_dim, kv_lora_rank], got shape {list(weight.shape)}")
    latent = k_cache_to_buffer(
        kv_params,
        buffer_row_offsets_1d,
        cache_offsets_1d,
        kv_collection,
        layer_idx,
        buffer_length,
        buffer_size,
        int(weight.shape[1]),
    )
    return latent.cast(weight.dtype) @ weight.T


def flare_mla_prefill_ragged(
    kv_params: Any,
    input: Any,
    k: Any,
    v: Any,
    input_row_offsets: Any,
    buffer_row_offsets: Any,
    cache_offsets: Any,
    kv_collection: Any,  # noqa: A002
    layer_idx: Any,
    mask_variant: Any,
    scale: float,
    qk_rope_dim: int = 64,
    prev_output: Any = None,
    prev_softmax_info: Any = None,
) -> Any:
    """MLA prefill over one key chunk: ragged queries ``[total_tokens, n_heads, qk_head_dim]`` (token ``i`` of
    sequence ``b`` at position ``cache_lengths[b] + i``) against decompressed ``k``/``v`` rows
    (``buffer_row_offsets``; the chunk starts at cache position ``cache_offsets[b]``).

    Raises:
        ValueError: ``prev_output``/``prev_softmax_info`` are given: maxfx runs the whole
            key range in one chunk (plan with a ``buffer_size`` covering it), so there is nothing to merge.
    """
    where = "flare_mla_prefill_ragged"
    _params(where, kv_params)
    kv = _collection(where, kv_collection)
    if prev_output is not None or prev_softmax_info is not None:
        raise ValueError(
            f"{where}: merging with a previous chunk (prev_output/prev_softmax_info) is not supported; plan one chunk "
            "whose buffer_size covers every key"
        )
    for name, t in (("input", input), ("k", k), ("v", v)):
        _check_input(where, t, 3, name)
    mask = mask_name(where, mask_variant)
    return ops.ragged_attention(
        input,
        k,
        v,
        input_row_offsets,
        mask=mask,
        scale=scale,
        kv_row_offsets=buffer_row_offsets,
        q_start=kv.cache_lengths,
        kv_start=cache_offsets,
    )


__all__ += [
    "flare_mla_decode_ragged",
    "flare_mla_decompress_k_cache",
    "flare_mla_prefill_plan",
    "flare_mla_prefill_ragged",
]


def sgmv_qkv_lora_kernel(
    input: Any,
    lora_a: Any,
    lora_b: Any,
    lora_ids: Any,
    lora_ranks: Any,
    input_row_offsets: Any,
    lora_grouped_offsets: Any,  # noqa: A002
    kv_collection: Any,
    kv_params: Any,
    layer_idx: Any,
    max_lora_seq_len: int,
    max_rank: int,
    q_dim: int,
    kv_dim: int,
    bias: Any = None,
) -> Any:
    """LoRA deltas of the fused QKV projection: ``sgmv_lora_kernel`` over the adapter groups
    (``lora_grouped_offsets``) gives ``[total_tokens, q_dim + 2 * kv_dim]``; the K and V parts are
    added to this step's cache rows (`kv_cache_ragged_radd`), the Q part ``[total_tokens, q_dim]`` is returned.
    """
    where = "sgmv_qkv_lora_kernel"
    p = _params(where, kv_params)
    if int(kv_dim) != p.n_kv_heads_per_device * p.head_dim:
        raise ValueError(
            f"{where}: kv_dim {kv_dim} differs from n_kv_heads * head_dim = {p.n_kv_heads_per_device * p.head_dim}"
        )
    if lora_a.rank == 3 and int(lora_a.shape[1]) > int(max_rank):
        raise ValueError(f"{where}: lora_a has rank {lora_a.shape[1]}, more than max_rank {max_rank}")
    delta = sgmv_lora_kernel(input, lora_a, lora_b, lora_ids, lora_ranks, lora_grouped_offsets, max_lora_seq_len, bias)
    if int(delta.shape[-1]) != int(q_dim) + 2 * int(kv_dim):
        raise ValueError(
            f"{where}: lora_b gives {delta.shape[-1]} columns; expected q_dim + 2 * kv_dim = "
            f"{int(q_dim) + 2 * int(kv_dim)}"
        )
    kv_cache_ragged_radd(p, delta[:, int(q_dim) :], kv_collection, input_row_offsets, 0, layer_idx)
    return delta[:, : int(q_dim)]


__all__ += ["sgmv_qkv_lora_kernel"]
