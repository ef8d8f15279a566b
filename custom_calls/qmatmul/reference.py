"""Plain-jnp reference of packed-weight dequantisation and quantized matmul.

This is the oracle for the Pallas kernels and the CPU production path. Every
function works on concrete arrays and under ``jax.jit``/``vmap``/``grad``
(gradients flow to the float ``lhs`` only).

Formats (byte layouts: ``shared/design/PALLAS_NOTES.md`` §7, llama.cpp's):

- GGUF blocks, named by string: ``"Q4_0"`` (32 elements in 18 bytes),
  ``"Q8_0"`` (32 in 34: f16 scale + 32 int8), ``"Q4_K"`` (256 in 144),
  ``"Q5_K"`` (256 in 176), ``"Q6_K"`` (256 in 210).
  A quantized matrix is ``uint8 [rows, row_bytes]``: each row is its blocks
  back to back. Decoding is bit-exact with ``gguf.quants.dequantize``: the
  float32 operations are the same and in the same order.
- GPTQ int4 (AutoGPTQ checkpoints): ``qweight int32 [K/8, N]`` (value ``i`` of
  word ``r`` at bits ``4i..4i+3`` is row ``k = 8r + i``), ``scales f16
  [K/g, N]``, ``qzeros int32 [K/g, N/8]`` (packed along N, stored as
  ``zero - 1`` in AutoGPTQ's v1 format), ``g_idx int32 [K]``. MAX's qmatmul
  takes a *packed* symmetric variant: the raw bytes of ``qweight`` followed by
  the raw bytes of ``scales`` as one ``uint8 [K/2 + 2K/g, N]`` matrix, zero
  point 8, and for act-order a ``perm_idx [K]`` (``argsort(g_idx)``) with the
  activations already gathered by it (see `gptq_pack`).
- int8 per output channel: ``int8 [N, K]`` weight and a ``scale [N]``;
  ``W[n, k] = q[n, k] * scale[n]`` (`int8_dequantize`, `int8_qmatmul`).

The matmuls compute ``lhs @ dequantize(rhs).T`` for GGUF (rhs is transposed:
``[N, row_bytes]``) and ``lhs @ W`` for GPTQ (``W [K, N]``) with float32
accumulation; they do not quantize the activations as MAX's kernels do, so
they are at least as accurate as MAX's results.

Every public function here has the signature a kernel must also have, so a
``dispatch.py`` can choose per call between this module and a Pallas kernel.

Example:
    >>> import numpy as np
    >>> from custom_calls.qmatmul import reference as ref
    >>> w = np.zeros((4, 18), np.uint8)          # 4 rows of one Q4_0 block
    >>> ref.dequantize("Q4_0", w).shape
    (4, 32)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "GGUF_BLOCKS",
    "block_shape",
    "dequantize",
    "dequantize_blocks",
    "qmatmul",
    "gptq_packed_k",
    "gptq_unpack_int4",
    "gptq_dequantize",
    "gptq_dequantize_packed",
    "gptq_qmatmul",
    "gptq_pack",
    "int8_dequantize",
    "int8_qmatmul",
]

# encoding -> (elements per block, bytes per block)
GGUF_BLOCKS: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}


def block_shape(encoding: str) -> tuple[int, int]:
    """``(elements, bytes)`` of one block of a GGUF ``encoding``.

    Raises:
        ValueError: for an encoding this module does not decode.
    """
    try:
        return GGUF_BLOCKS[encoding]
    except KeyError:
        raise ValueError(f"unsupported GGUF encoding {encoding!r}; expected one of {sorted(GGUF_BLOCKS)}") from None


# ─── GGUF block decoders ──────────────────────────────────────────────────
# Each maps uint8 [..., block_bytes] to float32 [..., block_elements].


def _f16_at(b: jax.Array, i: int) -> jax.Array:
    """The little-endian float16 in bytes ``i, i+1`` of the last axis, as float32."""
    u16 = b[..., i].astype(jnp.uint16) | (b[..., i + 1].astype(jnp.uint16) << 8)
    return lax.bitcast_convert_type(u16, jnp.float16).astype(jnp.float32)


def _nibbles(qs: jax.Array) -> tuple[jax.Array, jax.Array]:
    return qs & 0xF, qs >> 4


def _q4_0(b: jax.Array) -> jax.Array:
    d = _f16_at(b, 0)
    lo, hi = _nibbles(b[..., 2:18])
    # Low nibbles are the first 16 elements, high nibbles the last 16.
    q = jnp.concatenate([lo, hi], axis=-1).astype(jnp.int8) - jnp.int8(8)
    return d[..., None] * q.astype(jnp.float32)


def _q8_0(b: jax.Array) -> jax.Array:
    d = _f16_at(b, 0)
    q = lax.bitcast_convert_type(b[..., 2:34], jnp.int8)
    return d[..., None] * q.astype(jnp.float32)


def _k_scale_min(s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The 8 six-bit scales and mins packed in the 12 ``scales`` bytes of Q4_K/Q5_K."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = jnp.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = jnp.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _k_scales(b: jax.Array) -> tuple[jax.Array, jax.Array]:
    d, dmin = _f16_at(b, 0), _f16_at(b, 2)
    sc, mn = _k_scale_min(b[..., 4:16])
    # d*sc and dmin*m are exact in float32 (11-bit x 6-bit mantissas), as in gguf.
    return (d[..., None] * sc.astype(jnp.float32))[..., None], (dmin[..., None] * mn.astype(jnp.float32))[..., None]


def _low_nibble_subblocks(qs: jax.Array) -> jax.Array:
    """128 bytes → 8 sub-blocks of 32: chunk c gives sub-block 2c (low) and 2c+1 (high)."""
    chunks = qs.reshape(qs.shape[:-1] + (4, 32))
    lo, hi = _nibbles(chunks)
    return jnp.stack([lo, hi], axis=-2).reshape(qs.shape[:-1] + (8, 32))


def _q4_k(b: jax.Array) -> jax.Array:
    scale, minimum = _k_scales(b)
    q = _low_nibble_subblocks(b[..., 16:144]).astype(jnp.float32)
    return (scale * q - minimum).reshape(b.shape[:-1] + (256,))


def _q5_k(b: jax.Array) -> jax.Array:
    scale, minimum = _k_scales(b)
    ql = _low_nibble_subblocks(b[..., 48:176])
    # Bit j of qh[l] is the fifth bit of element l of sub-block j.
    qh = (b[..., 16:48][..., None, :] >> jnp.arange(8, dtype=jnp.uint8)[:, None]) & 1
    q = (ql | (qh << 4)).astype(jnp.float32)
    return (scale * q - minimum).reshape(b.shape[:-1] + (256,))


def _q6_k_codes(b: jax.Array) -> jax.Array:
    """The 256 six-bit codes (0..63) of Q6_K blocks in element order: ``uint8 [..., 256]``."""
    lead = b.shape[:-1]
    ql = b[..., 0:128].reshape(lead + (2, 1, 64))
    ql = ((ql >> jnp.array([0, 4], jnp.uint8)[:, None]) & 0xF).reshape(lead + (8, 32))
    qh = b[..., 128:192].reshape(lead + (2, 1, 32))
    qh = ((qh >> jnp.array([0, 2, 4, 6], jnp.uint8)[:, None]) & 3).reshape(lead + (8, 32))
    return (ql | (qh << 4)).reshape(lead + (256,))


def _q6_k(b: jax.Array) -> jax.Array:
    lead = b.shape[:-1]
    q = _q6_k_codes(b).astype(jnp.int8) - jnp.int8(32)
    scales = lax.bitcast_convert_type(b[..., 192:208], jnp.int8).astype(jnp.float32)
    d = _f16_at(b, 208)
    scale = (d[..., None] * scales)[..., None]  # [..., 16, 1], exact (11-bit x 8-bit)
    return (scale * q.reshape(lead + (16, 16)).astype(jnp.float32)).reshape(lead + (256,))


_DECODERS = {"Q4_0": _q4_0, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def dequantize_blocks(encoding: str, blocks: Any) -> jax.Array:
    """Decode ``uint8 [..., block_bytes]`` blocks to ``float32 [..., block_elements]``."""
    elems, nbytes = block_shape(encoding)
    blocks = jnp.asarray(blocks)
    if blocks.dtype != jnp.uint8 or blocks.shape[-1:] != (nbytes,):
        raise ValueError(f"{encoding} blocks must be uint8 [..., {nbytes}], got {blocks.dtype}{list(blocks.shape)}")
    return _DECODERS[encoding](blocks)


def dequantize(encoding: str, data: Any) -> jax.Array:
    """Decode rows of packed GGUF blocks: ``uint8 [..., nb*bytes]`` → ``float32 [..., nb*elems]``.

    Raises:
        ValueError: unknown encoding, non-uint8 data, or a last dim that is not a
            whole number of blocks.
    """
    elems, nbytes = block_shape(encoding)
    data = jnp.asarray(data)
    if data.dtype != jnp.uint8 or data.ndim == 0 or data.shape[-1] % nbytes:
        raise ValueError(
            f"{encoding} data must be uint8 [..., a multiple of {nbytes} bytes], got {data.dtype}{list(data.shape)}"
        )
    nb = data.shape[-1] // nbytes
    out = _DECODERS[encoding](data.reshape(data.shape[:-1] + (nb, nbytes)))
    return out.reshape(data.shape[:-1] + (nb * elems,))


def _matmul_nt(lhs: jax.Array, w: jax.Array) -> jax.Array:
    """``lhs @ w.T`` with float32 (or float64) accumulation, in ``lhs``'s dtype."""
    acc = jnp.float64 if lhs.dtype == jnp.float64 else jnp.float32
    out = lax.dot_general(
        lhs.astype(acc),
        w.astype(acc),
        (((lhs.ndim - 1,), (1,)), ((), ())),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=acc,
    )
    return out.astype(lhs.dtype)


def qmatmul(encoding: str, lhs: Any, rhs: Any) -> jax.Array:
    """``lhs @ dequantize(encoding, rhs).T``: ``lhs [..., K]``, ``rhs uint8 [N, K/elems*bytes]`` → ``[..., N]``.

    The result has ``lhs``'s dtype; products accumulate in float32.

    Raises:
        ValueError: ``rhs`` is not a uint8 matrix of whole blocks, or its K differs
            from ``lhs``'s last dim.
    """
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    elems, nbytes = block_shape(encoding)
    if rhs.ndim != 2:
        raise ValueError(
            f"{encoding} qmatmul: rhs must be a uint8 matrix [N, row_bytes], got {rhs.dtype}{list(rhs.shape)}"
        )
    k = rhs.shape[1] // nbytes * elems
    if lhs.shape[-1:] != (k,):
        raise ValueError(f"{encoding} qmatmul: lhs {list(lhs.shape)} does not match rhs {list(rhs.shape)} (K = {k})")
    return _matmul_nt(lhs, dequantize(encoding, rhs))


# ─── GPTQ int4 ────────────────────────────────────────────────────────────


def gptq_packed_k(rows: int, group_size: int) -> int:
    """K of a packed GPTQ matrix with ``rows = K/2 + 2*K/group_size`` byte rows.

    Raises:
        ValueError: no K that is a multiple of ``group_size`` (and of 8) has that many rows.
    """
    k, rem = divmod(2 * group_size * rows, group_size + 4)
    if rem or k <= 0 or k % group_size or k % 8:
        raise ValueError(
            f"GPTQ: {rows} packed rows is not K/2 + 2*K/{group_size} for any K that is a multiple of {group_size}"
        )
    return k


def gptq_unpack_int4(qweight: Any) -> jax.Array:
    """``int32 [K/8, N]`` packed nibbles → ``int32 [K, N]`` values in 0..15 (row ``8r+i`` = bits ``4i..4i+3`` of word
    ``r``).
    """
    qw = lax.bitcast_convert_type(jnp.asarray(qweight), jnp.uint32)
    shifts = jnp.arange(0, 32, 4, dtype=jnp.uint32)
    q = (qw[:, None, :] >> shifts[None, :, None]) & 0xF
    return q.reshape(qw.shape[0] * 8, qw.shape[1]).astype(jnp.int32)


def gptq_dequantize(
    qweight: Any,
    scales: Any,
    qzeros: Any = None,
    g_idx: Any = None,
    *,
    group_size: int,
    zero_offset: int = 1,
) -> jax.Array:
    """AutoGPTQ int4 tensors → ``float32 W [K, N]`` with ``W[k, n] = (q[k, n] - z[g, n]) * s[g, n]``, ``g = g_idx[k]``.

    Args:
        qweight: ``int32 [K/8, N]``.
        scales: ``float16 [K/g, N]``.
        qzeros: ``int32 [K/g, N/8]`` packed along N, or None for the symmetric
            zero point 8.
        g_idx: ``int [K]`` group of each row (act-order checkpoints), or None
            for ``k // group_size``.
        group_size: rows per group.
        zero_offset: added to the stored zero points: 1 for AutoGPTQ's v1
            checkpoint format (which stores ``zero - 1``), 0 for v2.
    """
    q = gptq_unpack_int4(qweight)
    k, n = q.shape
    scales = jnp.asarray(scales).astype(jnp.float32)
    groups = jnp.arange(k) // group_size if g_idx is None else jnp.asarray(g_idx)
    if qzeros is None:
        z = jnp.full((scales.shape[0], n), 8, jnp.int32)
    else:
        z = gptq_unpack_int4(jnp.asarray(qzeros).T).T[:, :n] + zero_offset
    return (q - z[groups]).astype(jnp.float32) * scales[groups]


def _gptq_split_packed(packed: jax.Array, group_size: int) -> tuple[jax.Array, jax.Array, int]:
    rows, n = packed.shape
    k = gptq_packed_k(rows, group_size)
    flat = packed.reshape(-1)
    qbytes = flat[: k // 2 * n].reshape(k // 8, n, 4).astype(jnp.uint32)
    qweight = qbytes[..., 0] | (qbytes[..., 1] << 8) | (qbytes[..., 2] << 16) | (qbytes[..., 3] << 24)
    sbytes = flat[k // 2 * n :].reshape(k // group_size, n, 2).astype(jnp.uint16)
    scales = lax.bitcast_convert_type(sbytes[..., 0] | (sbytes[..., 1] << 8), jnp.float16)
    return qweight, scales, k


def gptq_dequantize_packed(packed: Any, perm_idx: Any = None, *, group_size: int) -> jax.Array:
    """MAX's packed symmetric GPTQ matrix → ``float32 W [K, N]`` in the row order the kernel multiplies.

    Without ``perm_idx`` row ``k`` uses group ``k // group_size``. With it
    (act-order), row ``i`` is original row ``perm_idx[i]`` and uses group
    ``i // group_size``, which is what ``perm_idx = argsort(g_idx)`` implies.
    """
    packed = jnp.asarray(packed)
    if packed.dtype != jnp.uint8 or packed.ndim != 2:
        raise ValueError(f"GPTQ: packed weight must be a uint8 matrix, got {packed.dtype}{list(packed.shape)}")
    qweight, scales, k = _gptq_split_packed(packed, group_size)
    q = gptq_unpack_int4(lax.bitcast_convert_type(qweight, jnp.int32))
    if perm_idx is not None:
        q = jnp.take(q, jnp.asarray(perm_idx), axis=0)
    groups = jnp.arange(k) // group_size
    return (q - 8).astype(jnp.float32) * scales.astype(jnp.float32)[groups]


def gptq_qmatmul(lhs: Any, packed: Any, perm_idx: Any = None, *, group_size: int) -> jax.Array:
    """``lhs @ W`` for MAX's packed GPTQ weight (``lhs`` already gathered by ``perm_idx`` for act-order).

    ``lhs [..., K]`` → ``[..., N]`` in ``lhs``'s dtype, float32 accumulation.
    """
    lhs = jnp.asarray(lhs)
    w = gptq_dequantize_packed(packed, perm_idx, group_size=group_size)
    if lhs.shape[-1:] != (w.shape[0],):
        raise ValueError(f"GPTQ qmatmul: lhs {list(lhs.shape)} does not match the packed weight (K = {w.shape[0]})")
    return _matmul_nt(lhs, w.T)


def gptq_pack(qweight: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MAX's packed GPTQ layout from AutoGPTQ tensors (host-side, numpy).

    Args:
        qweight: ``int32 [K/8, N]``.
        scales: ``float16 [K/g, N]``.

    Returns:
        ``uint8 [K/2 + 2*K/g, N]`` holding the raw little-endian bytes of
        ``qweight`` then ``scales`` (what MAX's GPTQLinear feeds to qmatmul).
    """
    qweight = np.ascontiguousarray(qweight, dtype="<i4")
    scales = np.ascontiguousarray(scales, dtype="<f2")
    if qweight.ndim != 2 or scales.ndim != 2 or qweight.shape[1] != scales.shape[1]:
        raise ValueError(
            f"gptq_pack: expected qweight [K/8, N] and scales [K/g, N], got {qweight.shape} and {scales.shape}"
        )
    n = qweight.shape[1]
    raw = np.concatenate([qweight.view(np.uint8).reshape(-1), scales.view(np.uint8).reshape(-1)])
    return raw.reshape(-1, n)


# ─── int8 per output channel ──────────────────────────────────────────────


def _int8_check(q: jax.Array, scale: jax.Array) -> None:
    if q.dtype != jnp.int8 or q.ndim != 2:
        raise ValueError(f"int8 qmatmul: weight must be an int8 matrix [N, K], got {q.dtype}{list(q.shape)}")
    if scale.ndim != 1 or scale.shape[0] != q.shape[0] or not jnp.issubdtype(scale.dtype, jnp.floating):
        raise ValueError(
            f"int8 qmatmul: scale must be a float vector [N] = [{q.shape[0]}], got {scale.dtype}{list(scale.shape)}"
        )


def int8_dequantize(weight: Any, scale: Any) -> jax.Array:
    """``int8 [N, K]`` and per-output-channel ``scale [N]`` → ``float32 [N, K]`` (``q * scale[n]``)."""
    q, s = jnp.asarray(weight), jnp.asarray(scale)
    _int8_check(q, s)
    return q.astype(jnp.float32) * s.astype(jnp.float32)[:, None]


def int8_qmatmul(lhs: Any, weight: Any, scale: Any) -> jax.Array:
    """``lhs @ int8_dequantize(weight, scale).T``: ``lhs [..., K]`` → ``[..., N]`` in ``lhs``'s dtype."""
    lhs = jnp.asarray(lhs)
    w = int8_dequantize(weight, scale)
    if lhs.shape[-1:] != (w.shape[1],):
        raise ValueError(
            f"int8 qmatmul: lhs {list(lhs.shape)} does not match weight {list(w.shape)} (K = {w.shape[1]})"
        )
    return _matmul_nt(lhs, w)
