"""Pallas (Triton backend) kernels for GGUF Q4_0, Q8_0, Q4_K, Q5_K and Q6_K matmuls.

``qmatmul(encoding, lhs, rhs)`` computes ``lhs @ dequantize(rhs).T`` for the
raw GGUF rows ``rhs uint8 [N, K/elems*bytes]`` (MAX's transposed-weight
convention) **without materialising the dequantized matrix**: the weight is
decoded tile by tile in registers inside the kernel (`_pallas_core`).

Prepared layout (`prepare`, run once per weight)
-----------------------------------------------
GGUF blocks are 18/34/144/210 bytes, which leaves their f16 fields unaligned
and their quant bytes in block-local orders. `prepare` repacks a weight once
into aligned planes (structure of arrays), each ``[Np, cols]`` with ``Np`` = N
rounded up to 128 and K padded to ``Kp`` = a multiple of 256 (padding has zero
scales). Within every 256-element K chunk ``c``:

* 4-bit codes ``qs uint8 [Np, Kp/2]``: byte ``128c + j`` holds element
  ``256c + j`` in its low nibble and ``256c + 128 + j`` in its high nibble, so
  the kernel gets two contiguous 128-wide tiles from one load.
* ``Q4_0``: ``qs``, ``d f16 [Np, Kp/32]`` (value ``d * (q - 8)``): 4.5 bits/weight.
* ``Q8_0``: ``q int8 [Np, Kp]``, ``d f16 [Np, Kp/32]``: 8.5 bits/weight.
* ``Q4_K``: ``qs``, ``sc uint8 [Np, Kp/32]`` and ``mn uint8 [Np, Kp/32]``
  (the unpacked 6-bit sub-block scales and mins), ``d f16 [Np, Kp/256]``,
  ``dmin f16 [Np, Kp/256]``; value ``(d*sc)*q - dmin*mn``: 4.625 bits/weight.
* ``Q5_K``: the Q4_K planes plus ``qh uint8 [Np, Kp/8]``, GGUF's own high-bit
  bytes: bit ``i`` of byte ``32c + j`` is the fifth bit of element
  ``256c + 32i + j``; value ``(d*sc)*(q | qh << 4) - dmin*mn``: 5.625 bits/weight.
* ``Q6_K``: ``ql uint8 [Np, Kp/2]`` (low 4 bits, nibble layout above),
  ``qh uint8 [Np, Kp/4]`` (byte ``64c + j`` holds the high 2 bits of
  element ``256c + 64i + j`` at bits ``2i``), ``sc int8 [Np, Kp/16]``,
  ``d f16 [Np, Kp/256]``; value ``(d*sc)*(q - 32)``: 6.5625 bits/weight.

The scale products are formed in float32 exactly as ``gguf.quants`` does, so
with float32 activations the decoded tile equals `reference.dequantize`.

Example:
    >>> import numpy as np
    >>> from custom_calls.qmatmul import pallas_gguf as pg
    >>> w = pg.prepare("Q4_0", np.zeros((3, 18), np.uint8))
    >>> w
    PreparedWeight(Q4_0, n=3, k=32, planes=[uint8[128, 128], float16[128, 8]])
    >>> pg.qmatmul("Q4_0", np.ones((2, 32), np.float32), w, interpret=True).shape
    (2, 3)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from custom_calls._pallas import pl
from custom_calls.qmatmul import reference as ref
from custom_calls.qmatmul._pallas_core import (
    CHUNK,
    N_ALIGN,
    Format,
    KernelConfig,
    PreparedWeight,
    matmul_checked,
)

__all__ = ["ENCODINGS", "FORMATS", "prepare", "qmatmul", "KernelConfig", "PreparedWeight"]

ENCODINGS = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


# ─── in-kernel decoders (refs → float32 tiles) ────────────────────────────


def _grouped(codes: jax.Array, scale: jax.Array) -> jax.Array:
    """``scale [bn, G]`` broadcast over ``G`` equal column groups of ``codes [bn, W]``."""
    bn, w = codes.shape
    g = scale.shape[1]
    return (scale[:, :, None] * codes.reshape(bn, g, w // g)).reshape(bn, w)


def _nibbles(q: jax.Array):
    """uint8 ``[bn, 128]`` chunk-split bytes → the chunk's two 128-wide code tiles (float32)."""
    return (q & 0xF).astype(jnp.float32), (q >> 4).astype(jnp.float32)


def _load_nibbles(q_ref, t):
    return q_ref[:, pl.ds(t * (CHUNK // 2), CHUNK // 2)]


def _load_q4_0(refs, t):
    qs, d = refs
    return _load_nibbles(qs, t), d[:, pl.ds(t * 8, 4)], d[:, pl.ds(t * 8 + 4, 4)]


def _dequant_q4_0(loaded, bn):
    q, d0, d1 = loaded
    return [_grouped(c - 8.0, d.astype(jnp.float32)) for c, d in zip(_nibbles(q), (d0, d1))]


def _load_q8_0(refs, t):
    q, d = refs
    return tuple(q[:, pl.ds(t * CHUNK + 128 * p, 128)] for p in range(2)) + tuple(
        d[:, pl.ds(t * 8 + 4 * p, 4)] for p in range(2)
    )


def _dequant_q8_0(loaded, bn):
    q0, q1, d0, d1 = loaded
    return [_grouped(q.astype(jnp.float32), d.astype(jnp.float32)) for q, d in ((q0, d0), (q1, d1))]


def _load_q4_k(refs, t):
    qs, sc, mn, d, dmin = refs
    return (
        _load_nibbles(qs, t),
        sc[:, pl.ds(t * 8, 4)],
        sc[:, pl.ds(t * 8 + 4, 4)],
        mn[:, pl.ds(t * 8, 4)],
        mn[:, pl.ds(t * 8 + 4, 4)],
        d[:, pl.ds(t, 1)],
        dmin[:, pl.ds(t, 1)],
    )


def _dequant_q4_k(loaded, bn, codes=None):
    """Q4_K tiles; Q5_K passes its 5-bit ``codes`` (two float32 ``[bn, 128]``) in place of the nibbles."""
    q, sc0, sc1, mn0, mn1, d, dmin = loaded
    dd, dm = d.astype(jnp.float32), dmin.astype(jnp.float32)  # [bn, 1]
    out = []
    for c, sc, mn in zip(codes or _nibbles(q), (sc0, sc1), (mn0, mn1)):
        scale = dd * sc.astype(jnp.float32)  # [bn, 4], exact as in gguf
        minimum = dm * mn.astype(jnp.float32)
        out.append((scale[:, :, None] * c.reshape(bn, 4, 32) - minimum[:, :, None]).reshape(bn, 128))
    return out


def _load_q5_k(refs, t):
    qs, qh, *k_planes = refs
    return _load_q4_k((qs, *k_planes), t) + (qh[:, pl.ds(t * 32, 32)],)


def _fifth_bits(qh: jax.Array, part: int, bn: int) -> jax.Array:
    """uint8 ``[bn, 32]`` high-bit bytes → the fifth bits (0 or 16) of the chunk's ``part``-th 128-wide tile, uint8
    ``[bn, 128]``.

    Column ``32i + j`` of the tile is bit ``4 * part + i`` of byte ``j`` (a
    broadcast shift and a reshape: no concatenate, which Triton lacks).
    """
    shift = lax.broadcasted_iota(jnp.uint8, (1, 4, 1), 1) + jnp.uint8(4 * part)
    return (((qh[:, None, :] >> shift) & 1) << 4).reshape(bn, 128)


def _dequant_q5_k(loaded, bn):
    *k_loaded, qh = loaded
    lo, hi = k_loaded[0] & 0xF, k_loaded[0] >> 4
    codes = [(c | _fifth_bits(qh, p, bn)).astype(jnp.float32) for p, c in enumerate((lo, hi))]
    return _dequant_q4_k(k_loaded, bn, codes)


def _load_q6_k(refs, t):
    ql, qh, sc, d = refs
    return (
        ql[:, pl.ds(t * 128, 64)],
        ql[:, pl.ds(t * 128 + 64, 64)],
        qh[:, pl.ds(t * 64, 64)],
        *(sc[:, pl.ds(t * 16 + 4 * p, 4)] for p in range(4)),
        d[:, pl.ds(t, 1)],
    )


def _dequant_q6_k(loaded, bn):
    lo0, lo1, hi, s0, s1, s2, s3, d = loaded
    codes = (
        (lo0 & 0xF) | ((hi & 3) << 4),
        (lo1 & 0xF) | (((hi >> 2) & 3) << 4),
        (lo0 >> 4) | (((hi >> 4) & 3) << 4),
        (lo1 >> 4) | ((hi >> 6) << 4),
    )
    dd = d.astype(jnp.float32)
    return [_grouped(c.astype(jnp.float32) - 32.0, dd * s.astype(jnp.float32)) for c, s in zip(codes, (s0, s1, s2, s3))]


FORMATS: dict[str, Format] = {
    "Q4_0": Format("Q4_0", parts=2, part_width=128, load=_load_q4_0, dequant=_dequant_q4_0),
    "Q8_0": Format("Q8_0", parts=2, part_width=128, load=_load_q8_0, dequant=_dequant_q8_0),
    "Q4_K": Format("Q4_K", parts=2, part_width=128, load=_load_q4_k, dequant=_dequant_q4_k),
    "Q5_K": Format("Q5_K", parts=2, part_width=128, load=_load_q5_k, dequant=_dequant_q5_k),
    "Q6_K": Format("Q6_K", parts=4, part_width=64, load=_load_q6_k, dequant=_dequant_q6_k),
}


# ─── prepare: raw GGUF rows → planes (once per weight) ────────────────────


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def _f16(b: jax.Array, i: int) -> jax.Array:
    u16 = b[..., i].astype(jnp.uint16) | (b[..., i + 1].astype(jnp.uint16) << 8)
    return lax.bitcast_convert_type(u16, jnp.float16)


def _pad2(a: jax.Array, rows: int, cols: int) -> jax.Array:
    return jnp.pad(a, ((0, rows - a.shape[0]), (0, cols - a.shape[1])))


def pack_nibbles(codes: jax.Array) -> jax.Array:
    """``uint8 [R, Kp]`` 4-bit codes (Kp a multiple of 256) → ``uint8 [R, Kp/2]`` chunk-split nibbles."""
    r, kp = codes.shape
    c = codes.astype(jnp.uint8).reshape(r, kp // CHUNK, 2, CHUNK // 2)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(r, kp // 2)


def _pack_crumbs(codes: jax.Array) -> jax.Array:
    """``uint8 [R, Kp]`` 2-bit codes → ``uint8 [R, Kp/4]``: byte ``64c + j`` holds element ``256c + 64i + j`` at bits
    ``2i``.
    """
    r, kp = codes.shape
    c = codes.astype(jnp.uint8).reshape(r, kp // CHUNK, 4, CHUNK // 4)
    return (c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)).reshape(r, kp // 4)


def prepare(encoding: str, raw: Any) -> PreparedWeight:
    """Repack raw GGUF rows ``uint8 [N, K/elems*bytes]`` into the kernel layout (see module doc).

    Pure jnp (jit-able, no host sync). Do it once per weight and keep the
    result: that is the whole point (``dispatch`` caches it for concrete
    arrays; inside a traced function it runs per call).

    Raises:
        ValueError: an encoding without a kernel (e.g. ``"Q2_K"``), ``raw`` not
            a uint8 matrix, or a row length that is not a whole number of blocks.
    """
    if encoding not in FORMATS:
        raise ValueError(f"encoding: no Pallas kernel for {encoding!r}; kernels exist for {list(ENCODINGS)}")
    elems, nbytes = ref.block_shape(encoding)
    raw = jnp.asarray(raw)
    if raw.dtype != jnp.uint8 or raw.ndim != 2 or raw.shape[1] % nbytes or raw.shape[1] == 0:
        raise ValueError(
            f"rhs: {encoding} weight must be uint8 [N, a multiple of {nbytes} bytes], got {raw.dtype}{list(raw.shape)}"
        )
    n, nb = raw.shape[0], raw.shape[1] // nbytes
    k = nb * elems
    np_, kp = _round_up(n, N_ALIGN), _round_up(k, CHUNK)
    b = raw.reshape(n, nb, nbytes)
    if encoding == "Q4_0":
        qs = b[..., 2:18]
        codes = jnp.concatenate([qs & 0xF, qs >> 4], axis=-1).reshape(n, k)
        planes = [pack_nibbles(_pad2(codes, np_, kp)), _pad2(_f16(b, 0), np_, kp // 32)]
    elif encoding == "Q8_0":
        q = lax.bitcast_convert_type(b[..., 2:34], jnp.int8).reshape(n, k)
        planes = [_pad2(q, np_, kp), _pad2(_f16(b, 0), np_, kp // 32)]
    elif encoding in ("Q4_K", "Q5_K"):
        low = b[..., 16:144] if encoding == "Q4_K" else b[..., 48:176]
        codes = ref._low_nibble_subblocks(low).reshape(n, k)
        sc, mn = ref._k_scale_min(b[..., 4:16])  # [n, nb, 8] each
        high = [] if encoding == "Q4_K" else [_pad2(b[..., 16:48].reshape(n, nb * 32), np_, kp // 8)]
        planes = [
            pack_nibbles(_pad2(codes, np_, kp)),
            *high,
            _pad2(sc.reshape(n, nb * 8), np_, kp // 32),
            _pad2(mn.reshape(n, nb * 8), np_, kp // 32),
            _pad2(_f16(b, 0), np_, kp // CHUNK),
            _pad2(_f16(b, 2), np_, kp // CHUNK),
        ]
    else:  # Q6_K
        codes = _pad2(ref._q6_k_codes(b).reshape(n, k), np_, kp)
        sc = lax.bitcast_convert_type(b[..., 192:208], jnp.int8).reshape(n, nb * 16)
        planes = [
            pack_nibbles(codes & 0xF),
            _pack_crumbs(codes >> 4),
            _pad2(sc, np_, kp // 16),
            _pad2(_f16(b, 208), np_, kp // CHUNK),
        ]
    return PreparedWeight(encoding, planes, n, k, kp)


def qmatmul(
    encoding: str,
    lhs: Any,
    rhs: Any,
    *,
    config: KernelConfig | None = None,
    interpret: bool = False,
) -> jax.Array:
    """``lhs @ dequantize(encoding, rhs).T`` with the Pallas kernel (no dispatch, no fallback).

    Args:
        encoding: ``"Q4_0"``, ``"Q8_0"``, ``"Q4_K"``, ``"Q5_K"`` or ``"Q6_K"``.
        lhs: ``[..., K]`` float32, bfloat16 or float16.
        rhs: raw GGUF rows ``uint8 [N, row_bytes]`` (repacked here, per call)
            or a `PreparedWeight` from `prepare` (no per-call repack).
        config: tiling; None picks `_pallas_core.default_config` by M.
        interpret: run the kernel in Pallas interpret mode (CPU).

    Returns:
        ``[..., N]`` in ``lhs``'s dtype (float32 accumulation).

    Raises:
        ValueError: see `prepare`; ``lhs`` dtype not float32/bfloat16/float16;
            K mismatch.
    """
    w = rhs if isinstance(rhs, PreparedWeight) else prepare(encoding, rhs)
    if w.fmt != encoding:
        raise ValueError(f"rhs: prepared for {w.fmt}, called with encoding {encoding!r}")
    return matmul_checked(FORMATS[encoding], lhs, w, config, interpret=interpret, what=encoding, weight="rhs")
