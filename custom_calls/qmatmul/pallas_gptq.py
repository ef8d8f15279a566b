"""Pallas (Triton backend) kernels for GPTQ int4 and int8 per-channel matmuls.

GPTQ (MAX's packed symmetric variant, see `reference.gptq_pack`):
``gptq_qmatmul(lhs, packed, perm_idx, group_size=g)`` = ``lhs @ W`` with
``W[i, n] = (q[perm_idx[i], n] - 8) * scales[i // g, n]`` (``lhs`` already
gathered by ``perm_idx`` for act-order, as MAX's GPTQLinear does).

Prepared layout (`prepare_gptq`, once per weight): ``qs uint8 [Np, Kp/2]`` (the
weight transposed to ``[N, K]``, 4-bit codes in the chunk-split nibble layout
of ``pallas_gguf``) and ``s f16 [Np, Kp/g]``. **Act-order**: the activations
arrive gathered by ``perm_idx`` (so consecutive K positions share a group), and
the prepare step applies ``perm_idx`` to the packed weight rows once; the
kernel then sees an ordinary grouped weight and nothing is permuted per call.
Group sizes: powers of two ≥ 32 (the kernel's column tiles are 128 wide and its
chunks 256); others are rejected here (`dispatch` falls back to the reference).

int8 per output channel: ``int8_qmatmul(lhs, weight int8 [N, K], scale [N])``.
Prepared planes ``q int8 [Np, Kp]`` and ``s f32 [Np, 1]``; the kernel
multiplies raw int8 tiles and applies ``scale[n]`` once to the accumulator.

Example:
    >>> import numpy as np
    >>> from custom_calls.qmatmul import pallas_gptq as pq
    >>> packed = np.zeros((256 // 2 + 2 * 256 // 128, 8), np.uint8)   # K=256, N=8, g=128
    >>> pq.gptq_qmatmul(np.ones((1, 256), np.float32), packed, group_size=128, interpret=True).shape
    (1, 8)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from custom_calls._pallas import pl
from custom_calls.qmatmul import reference as ref
from custom_calls.qmatmul._pallas_core import CHUNK, N_ALIGN, Format, KernelConfig, PreparedWeight, matmul_checked
from custom_calls.qmatmul.pallas_gguf import _grouped, _load_nibbles, _nibbles, _pad2, _round_up, pack_nibbles

__all__ = [
    "gptq_format",
    "prepare_gptq",
    "gptq_qmatmul",
    "INT8_FORMAT",
    "prepare_int8",
    "int8_qmatmul",
    "supported_group_size",
]


def supported_group_size(group_size: int) -> bool:
    """Whether the kernel tiles GPTQ groups of this size (a power of two ≥ 32)."""
    return isinstance(group_size, int) and group_size >= 32 and group_size & (group_size - 1) == 0


@functools.cache
def gptq_format(group_size: int) -> Format:
    """The kernel `Format` of GPTQ int4 with ``group_size`` (a power of two ≥ 32)."""
    g = group_size
    half = CHUNK // 2

    def load(refs, t):
        qs, s = refs
        if g <= half:  # 128/g groups per 128-wide part
            ng = half // g
            scales = tuple(s[:, pl.ds(t * (CHUNK // g) + p * ng, ng)] for p in range(2))
        else:  # one group spans this whole chunk
            scales = (s[:, pl.ds(t // (g // CHUNK), 1)],) * 2
        return (_load_nibbles(qs, t),) + scales

    def dequant(loaded, bn):
        q, s0, s1 = loaded
        return [_grouped(c - 8.0, s.astype(jnp.float32)) for c, s in zip(_nibbles(q), (s0, s1))]

    return Format(f"GPTQ_g{g}", parts=2, part_width=half, load=load, dequant=dequant)


def prepare_gptq(packed: Any, perm_idx: Any = None, *, group_size: int) -> PreparedWeight:
    """MAX's packed GPTQ ``uint8 [K/2 + 2K/g, N]`` (+ optional ``perm_idx [K]``) → kernel planes.

    Pure jnp, jit-able; run it once per weight.

    Raises:
        ValueError: ``group_size`` not a power of two ≥ 32, a malformed packed
            matrix, or ``perm_idx`` of the wrong length.
    """
    if not supported_group_size(group_size):
        raise ValueError(f"group_size: the GPTQ kernel needs a power of two >= 32, got {group_size!r}")
    packed = jnp.asarray(packed)
    if packed.dtype != jnp.uint8 or packed.ndim != 2:
        raise ValueError(f"packed: GPTQ packed weight must be a uint8 matrix, got {packed.dtype}{list(packed.shape)}")
    qweight, scales, k = ref._gptq_split_packed(packed, group_size)
    n = packed.shape[1]
    codes = ref.gptq_unpack_int4(lax.bitcast_convert_type(qweight, jnp.int32))  # [K, N]
    if perm_idx is not None:
        perm_idx = jnp.asarray(perm_idx)
        if perm_idx.shape != (k,):
            raise ValueError(f"perm_idx: expected shape [{k}], got {list(perm_idx.shape)}")
        codes = jnp.take(codes, perm_idx, axis=0)
    np_, kp = _round_up(n, N_ALIGN), _round_up(k, CHUNK)
    qs = pack_nibbles(_pad2(codes.T.astype(jnp.uint8), np_, kp))
    s = _pad2(scales.T, np_, kp // group_size)
    return PreparedWeight(f"GPTQ_g{group_size}", [qs, s], n, k, kp, (group_size,))


def gptq_qmatmul(
    lhs: Any,
    packed: Any,
    perm_idx: Any = None,
    *,
    group_size: int,
    config: KernelConfig | None = None,
    interpret: bool = False,
) -> jax.Array:
    """``lhs @ W`` for a packed GPTQ weight with the Pallas kernel (no dispatch, no fallback).

    Args:
        lhs: ``[..., K]`` float32/bfloat16/float16, already gathered by ``perm_idx``.
        packed: MAX's packed ``uint8 [K/2 + 2K/g, N]`` or a `PreparedWeight`
            from `prepare_gptq` (then ``perm_idx`` is ignored: it was applied).
        perm_idx: act-order permutation ``[K]`` or None.
        group_size: the GPTQ group size.

    Returns:
        ``[..., N]`` in ``lhs``'s dtype, float32 accumulation.
    """
    w = packed if isinstance(packed, PreparedWeight) else prepare_gptq(packed, perm_idx, group_size=group_size)
    return matmul_checked(gptq_format(group_size), lhs, w, config, interpret=interpret, what="GPTQ")


# ─── int8 per output channel ──────────────────────────────────────────────


def _load_int8(refs, t):
    q = refs[0]
    return tuple(q[:, pl.ds(t * CHUNK + 128 * p, 128)] for p in range(2))


def _dequant_int8(loaded, bn):
    return [q.astype(jnp.float32) for q in loaded]


INT8_FORMAT = Format("INT8", parts=2, part_width=128, load=_load_int8, dequant=_dequant_int8, row_scale=True)


def prepare_int8(weight: Any, scale: Any) -> PreparedWeight:
    """``int8 [N, K]`` + ``scale [N]`` → planes ``q int8 [Np, Kp]``, ``s f32 [Np, 1]``.

    Raises:
        ValueError: weight not an int8 matrix or scale not a float ``[N]`` vector.
    """
    q, s = jnp.asarray(weight), jnp.asarray(scale)
    ref._int8_check(q, s)
    n, k = q.shape
    np_, kp = _round_up(n, N_ALIGN), _round_up(k, CHUNK)
    return PreparedWeight("INT8", [_pad2(q, np_, kp), _pad2(s.astype(jnp.float32)[:, None], np_, 1)], n, k, kp)


def int8_qmatmul(
    lhs: Any,
    weight: Any,
    scale: Any = None,
    *,
    config: KernelConfig | None = None,
    interpret: bool = False,
) -> jax.Array:
    """``lhs @ (weight * scale[:, None]).T`` with the Pallas kernel; ``weight`` may be a `PreparedWeight`."""
    w = weight if isinstance(weight, PreparedWeight) else prepare_int8(weight, scale)
    return matmul_checked(INT8_FORMAT, lhs, w, config, interpret=interpret, what="int8")
