"""Block-scaled (NVFP4, MXFP4, MXFP8) kernels of ``max.nn.kernels``, composed from graph ops.

Formats (OCP microscaling and NVIDIA's NVFP4): values are split along K into
blocks of ``sf_vector_size`` elements sharing one scale.

=======  ==========================  =================  ==============
format   values                      scales             sf_vector_size
=======  ==========================  =================  ==============
NVFP4    FP4 E2M1, 2 per uint8 byte  float8_e4m3fn      16
MXFP4    FP4 E2M1, 2 per uint8 byte  float8_e8m0fnu     32
MXFP8    float8_e4m3fn               float8_e8m0fnu     32
=======  ==========================  =================  ==============

A packed byte holds element ``2i`` in its low nibble and ``2i + 1`` in its high
nibble. Scales are ``[rows, ceil(K / sf_vector_size)]``, or interleaved in the
5-D tcgen05 layout ``[ceil(rows / 128), ceil(groups / 4), 32, 4, 4]`` where
scale ``(r, g)`` sits at ``[r // 128, g // 4, r % 32, (r % 128) // 32, g % 4]``
(`block_scales_interleave`). Every kernel takes either layout; the quantizer
returns the interleaved one only on Blackwell (sm10x) GPUs, as MAX does.

Example:
    >>> from maxfx.nn import kernels
    >>> kernels._is_sm10x_gpu()  # no Blackwell GPU here
    False
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.devices import accelerators
from lowering.dtypes import DType
from maxfx.graph import DeviceRef, ops
from maxfx.nn.kernels._scaled_matmul import _full_starts

__all__ = [
    "block_scales_interleave",
    "dynamic_block_scaled_matmul",
    "grouped_matmul_block_scaled",
    "quantize_dynamic_block_scaled",
]

_ATOM_ROWS, _ATOM_GROUPS = 128, 4  # one interleaved tile: 128 rows (32 x 4) by 4 scale groups
_FP4_LEVELS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1 magnitudes of codes 1..7
_FP4_VALUES = np.array([0.0, *_FP4_LEVELS, -0.0, *(-v for v in _FP4_LEVELS)], np.float32)  # code -> value
_SCALE_DTYPES = {DType.float8_e4m3fn: 16, DType.float8_e8m0fnu: 32}  # scale dtype -> its format's sf_vector_size
_SCALES_MSG = "float8_e4m3fn (NVFP4) or float8_e8m0fnu (MXFP4/MXFP8)"


def _is_sm10x_gpu() -> bool:
    """True when a Blackwell (compute capability 10.x) GPU is present: MAX's kernels then use interleaved scales.

    Example:
        >>> _is_sm10x_gpu()  # doctest: +SKIP
        False
    """
    for d in accelerators():
        cc = str(getattr(d, "compute_capability", "") or "")
        if cc.startswith("10."):
            return True
    return False


def _ceil(n: Any, d: int) -> int:
    return -(-int(n) // d)


# ─── scale layouts ────────────────────────────────────────────────────────


def block_scales_interleave(scales: Any, sf_vector_size: int = 16) -> Any:
    """Scales ``[rows, groups]`` in the 5-D tcgen05 layout ``[ceil(rows / 128), ceil(groups / 4), 32, 4, 4]`` (zero
    padded).

    Example:
        >>> s5 = block_scales_interleave(weight_scales, sf_vector_size=16)  # doctest: +SKIP
    """
    where = "block_scales_interleave"
    if scales.rank != 2:
        raise ValueError(f"{where}: expected scales of rank 2 [rows, groups], was {scales.rank}")
    if scales.dtype not in _SCALE_DTYPES:
        raise TypeError(f"{where}: scales dtype must be {_SCALES_MSG}, got {scales.dtype}")
    if int(sf_vector_size) != _SCALE_DTYPES[scales.dtype]:
        raise ValueError(
            f"{where}: sf_vector_size {sf_vector_size} does not match {scales.dtype} scales (expected "
            f"{_SCALE_DTYPES[scales.dtype]})"
        )
    rows, groups = int(scales.shape[0]), int(scales.shape[1])
    tr, tg = _ceil(rows, _ATOM_ROWS), _ceil(groups, _ATOM_GROUPS)
    # Padding and layout moves run in float32: the scale dtypes only need to round-trip exactly.
    s = ops.pad(scales.cast(DType.float32), [0, tr * _ATOM_ROWS - rows, 0, tg * _ATOM_GROUPS - groups])
    s = ops.reshape(s, [tr, 4, 32, tg, 4])  # row = tile*128 + (r%128)//32 * 32 + r%32
    return ops.permute(s, [0, 3, 2, 1, 4]).cast(scales.dtype)


def _scales_2d(where: str, name: str, scales: Any, rows: Any, groups: int) -> Any:
    """``scales`` as float32 ``[rows, groups]`` from the plain or the interleaved layout."""
    if scales.rank == 2:
        if int(scales.shape[1]) != groups or scales.shape[0] != rows:
            raise ValueError(f"{where}: expected {name} of shape [{rows}, {groups}], got {list(scales.shape)}")
        return scales.cast(DType.float32)
    if scales.rank != 5 or [int(d) for d in scales.shape[2:]] != [32, 4, 4]:
        raise ValueError(
            f"{where}: expected {name} to have rank 5 [*, *, 32, 4, 4] (or rank 2), was {scales.rank}: "
            f"{list(scales.shape)}"
        )
    tr, tg = int(scales.shape[0]), int(scales.shape[1])
    if tg != _ceil(groups, _ATOM_GROUPS) or tr * _ATOM_ROWS < int(rows):
        raise ValueError(
            f"{where}: {name} {list(scales.shape)} does not cover [{rows}, {groups}] scales (expected [>= "
            f"{_ceil(rows, _ATOM_ROWS)}, {_ceil(groups, _ATOM_GROUPS)}, 32, 4, 4])"
        )
    s = ops.permute(scales.cast(DType.float32), [0, 3, 2, 1, 4])
    return ops.reshape(s, [tr * _ATOM_ROWS, tg * _ATOM_GROUPS])[: int(rows), :groups]


# ─── values ───────────────────────────────────────────────────────────────


def _fp4_unpack(x: Any) -> Any:
    """uint8 ``[rows, c]`` of packed E2M1 pairs → float32 ``[rows, 2c]``."""
    b = x.cast(DType.int32)
    table = ops.constant(_FP4_VALUES, DType.float32, x.device)
    lo, hi = ops.gather(table, b % 16, axis=0), ops.gather(table, b // 16, axis=0)
    return ops.reshape(ops.stack([lo, hi], axis=-1), [x.shape[0], 2 * int(x.shape[1])])


def _fp4_pack(v: Any) -> Any:
    """float32 ``[rows, K]`` (K even) → uint8 ``[rows, K / 2]`` E2M1 codes, rounded to nearest even and saturated."""
    r = ops.cast(ops.cast(v, DType.float4_e2m1fn), DType.float32)
    levels = ops.constant(np.array(_FP4_LEVELS, np.float32), DType.float32, v.device)
    mag = ops.sum(ops.cast(ops.greater_equal(ops.unsqueeze(ops.abs(r), -1), levels), DType.int32), axis=-1)
    # The sign bit follows the input, so small negatives become -0 (code 8) as in a hardware E2M1 conversion.
    code = ops.squeeze(mag, -1) + ops.cast(ops.greater(ops.constant(0.0, DType.float32, v.device), v), DType.int32) * 8
    pairs = ops.reshape(code, [v.shape[0], int(v.shape[1]) // 2, 2])
    return (pairs[:, :, 0] + pairs[:, :, 1] * 16).cast(DType.uint8)


def _values(x: Any) -> Any:
    """float32 element values of block-scaled data: unpacked FP4 (uint8) or float8."""
    return _fp4_unpack(x) if x.dtype == DType.uint8 else x.cast(DType.float32)


def _dequantize(where: str, name: str, x: Any, scales: Any, sf_vector_size: int) -> Any:
    """float32 ``values * scales`` of ``x [rows, K or K/2]`` with its block scales."""
    v = _values(x)
    k = int(v.shape[1])
    groups = _ceil(k, sf_vector_size)
    s = _scales_2d(where, f"{name}_scales", scales, x.shape[0], groups)
    full = ops.repeat_interleave(s, sf_vector_size, axis=1)[:, :k]
    return v * full


def _tensor_sf(tensor_sf: Any, device: Any) -> Any:
    if isinstance(tensor_sf, (int, float)):
        return ops.constant(float(tensor_sf), DType.float32, device)
    return tensor_sf.cast(DType.float32).to(device).reshape([])


def _sf_size(where: str, scales_dtype: DType, sf_vector_size: int | None) -> int:
    if scales_dtype not in _SCALE_DTYPES:
        raise TypeError(f"{where}: a_scales dtype must be {_SCALES_MSG}, but got {scales_dtype}")
    want = _SCALE_DTYPES[scales_dtype]
    if sf_vector_size is not None and int(sf_vector_size) != want:
        raise ValueError(f"{where}: sf_vector_size must be {want} for {scales_dtype} scales, got {sf_vector_size}")
    return want


# ─── quantization ─────────────────────────────────────────────────────────


def quantize_dynamic_block_scaled(
    input: Any,  # noqa: A002 - MAX's name
    tensor_sf: Any = 1.0,
    sf_vector_size: int = 16,
    scales_type: DType = DType.float8_e4m3fn,
    out_type: DType = DType.uint8,
) -> tuple[Any, Any]:
    """Block-scaled quantization of bfloat16 ``input [M, K]`` (NVFP4, MXFP4 or MXFP8 by ``scales_type``/``out_type``).

    ``y = input * tensor_sf`` (``tensor_sf`` is the inverted global scale); each
    block of ``sf_vector_size`` gets ``scale = amax / elem_max`` (NVFP4: rounded to
    float8_e4m3fn) or the power of two ``2**(floor(log2(amax)) - emax)`` (MX),
    and ``q = y / scale`` rounded to nearest even and saturated. Returns ``(q,
    scales)``: ``q`` uint8 ``[M, K / 2]`` (FP4 pairs) or float8_e4m3fn ``[M, K]``;
    scales ``[M, K / sf_vector_size]`` (interleaved 5-D on sm10x GPUs).

    Example:
        >>> q, s = quantize_dynamic_block_scaled(x, 1.0, sf_vector_size=32, scales_type=DType.float8_e8m0fnu,
        ...     out_type=DType.float8_e4m3fn)  # doctest: +SKIP
    """
    where = "quantize_dynamic_block_scaled"
    if input.rank != 2:
        raise ValueError(f"{where}: input tensor must be rank 2 tensor, got {list(input.shape)}")
    if input.dtype != DType.bfloat16:
        raise ValueError(f"{where}: input tensor dtype must be bfloat16, got {input.dtype}")
    if out_type not in (DType.uint8, DType.float8_e4m3fn):
        raise ValueError(f"{where}: out_type must be uint8 (fp4-e2m1fnX2) or float8_e4m3fn (MXFP8), got {out_type}")
    sf = _sf_size(where, DType(scales_type), sf_vector_size)
    if out_type == DType.float8_e4m3fn and scales_type != DType.float8_e8m0fnu:
        raise ValueError(f"{where}: MXFP8 (out_type float8_e4m3fn) needs float8_e8m0fnu scales, got {scales_type}")
    k = int(input.shape[1])
    if k % sf:
        raise ValueError(f"{where}: input.shape[1] ({k}) must be a multiple of sf_vector_size ({sf})")
    dev, m = input.device, input.shape[0]
    y = ops.reshape(input.cast(DType.float32) * _tensor_sf(tensor_sf, dev), [m, k // sf, sf])
    amax = ops.max(ops.abs(y), axis=-1)  # [m, groups, 1]
    fp4 = out_type == DType.uint8
    elem_max = 6.0 if fp4 else 448.0
    zero = ops.constant(0.0, DType.float32, dev)
    if scales_type == DType.float8_e4m3fn:
        scale = ops.cast(amax / elem_max, DType.float8_e4m3fn)
    else:
        emax = 2.0 if fp4 else 8.0  # exponent of the element format's largest normal
        safe = ops.where(ops.greater(amax, zero), amax, ops.constant(1.0, DType.float32, dev))
        exponent = ops.floor(ops.log(safe) / float(np.log(2.0))) - emax
        scale = ops.cast(ops.pow(ops.constant(2.0, DType.float32, dev), exponent), DType.float8_e8m0fnu)
    s32 = ops.cast(scale, DType.float32)
    q = y / ops.where(ops.greater(s32, zero), s32, ops.constant(1.0, DType.float32, dev))
    q = ops.reshape(ops.min(ops.max(q, -elem_max), elem_max), [m, k])
    out = _fp4_pack(q) if fp4 else ops.cast(q, DType.float8_e4m3fn)
    scales = ops.reshape(scale, [m, k // sf])
    return out, (block_scales_interleave(scales, sf) if _is_sm10x_gpu() else scales)


# ─── matmuls ──────────────────────────────────────────────────────────────


def dynamic_block_scaled_matmul(
    a: Any,
    b: Any,
    a_scales: Any,
    b_scales: Any,
    tensor_sf: Any = 1.0,
    sf_vector_size: int = 16,
    out_type: DType = DType.bfloat16,
) -> Any:
    """``(deq(a) @ deq(b).T) * tensor_sf`` for block-scaled ``a [M, K']`` and transposed ``b [N, K']``.

    ``K'`` is ``K / 2`` for packed FP4 (uint8) and ``K`` for float8 (MXFP8).

    Example:
        >>> y = dynamic_block_scaled_matmul(xq, wq, xs, ws, alpha)  # doctest: +SKIP
    """
    where = "dynamic_block_scaled_matmul"
    if a.rank != 2 or b.rank != 2:
        raise ValueError(f"{where}: Both a and b must be rank 2 tensors, got {list(a.shape)} and {list(b.shape)}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{where}: The second dimension of b must match the second dimension of a: {list(a.shape)} vs "
            f"{list(b.shape)}"
        )
    if a.dtype != b.dtype or a_scales.dtype != b_scales.dtype:
        raise TypeError(
            f"{where}: a and b dtypes {a.dtype}, {b.dtype} must match, as do a and b scales dtypes {a_scales.dtype}, "
            f"{b_scales.dtype}"
        )
    if a.dtype not in (DType.uint8, DType.float8_e4m3fn):
        raise ValueError(f"{where}: A dtype must be uint8 (fp4-e2m1fnX2) or float8_e4m3fn (MXFP8), got {a.dtype}")
    sf = _sf_size(where, a_scales.dtype, sf_vector_size)
    for t, name in ((b, "b"), (a_scales, "a_scales"), (b_scales, "b_scales")):
        if t.device != a.device:
            raise ValueError(f"{where}: expected a and {name} to have the same device, got {a.device} and {t.device}")
    out = _dequantize(where, "a", a, a_scales, sf) @ _dequantize(where, "b", b, b_scales, sf).T
    return (out * _tensor_sf(tensor_sf, a.device)).cast(out_type)


def _row_groups(starts: Any, rows: Any, n_groups: int) -> Any:
    """Group index (int32, clipped to ``n_groups - 1``) of each of ``rows`` ragged rows."""
    r = ops.range(0, rows, 1, dtype=DType.int32, device=starts.device)
    after = ops.greater_equal(ops.unsqueeze(r, 1), ops.unsqueeze(starts[1:].cast(DType.int32), 0))  # [rows, G]
    g = ops.squeeze(ops.sum(ops.cast(after, DType.int32), axis=-1), -1)
    return ops.min(g, n_groups - 1)


def grouped_matmul_block_scaled(
    hidden_states: Any,
    weight: Any,
    a_scales: Any,
    b_scales: Any,
    expert_start_indices: Any,
    a_scale_offsets: Any,
    expert_ids: Any,
    expert_scales: Any,
    expert_usage_stats_host: Any,
    out_type: DType = DType.bfloat16,
) -> Any:
    """MoE grouped matmul over block-scaled tokens ``[T, K']`` and experts ``[E, N, K']`` (NVFP4/MXFP4/MXFP8).

    Rows ``[starts[i], starts[i+1])`` use expert ``expert_ids[i]``; their output is
    multiplied by ``expert_scales[expert_ids[i]]``. ``a_scales`` is interleaved
    ``[tiles, ceil(groups / 4), 32, 4, 4]``: row ``r`` of group ``i`` reads scale row
    ``r + 128 * a_scale_offsets[i]`` (each expert's scales may start on a fresh
    128-row tile); ``b_scales`` is ``[E, ceil(N / 128), ceil(groups / 4), 32, 4, 4]``.

    Example:
        >>> y = grouped_matmul_block_scaled(h, w, hs, ws, starts, scale_offsets, ids, scales, stats)  # doctest: +SKIP
    """
    where = "grouped_matmul_block_scaled"
    if hidden_states.dtype != weight.dtype:
        raise ValueError(
            f"{where}: expected hidden_states and weight to have the same dtype, but got {hidden_states.dtype} and "
            f"{weight.dtype}"
        )
    if a_scales.dtype != b_scales.dtype:
        raise ValueError(
            f"{where}: expected a_scales and b_scales to have the same dtype, but got {a_scales.dtype} and "
            f"{b_scales.dtype}"
        )
    sf = _sf_size(where, a_scales.dtype, None)
    for t, name in (
        (weight, "weight"),
        (a_scales, "a_scales"),
        (b_scales, "b_scales"),
        (expert_start_indices, "expert_start_indices"),
        (a_scale_offsets, "a_scale_offsets"),
        (expert_ids, "expert_ids"),
        (expert_scales, "expert_scales"),
    ):
        if t.device != hidden_states.device:
            raise ValueError(
                f"{where}: expected hidden_states and {name} to have the same device, but got {hidden_states.device} "
                f"and {t.device}"
            )
    if hidden_states.dtype not in (DType.uint8, DType.float8_e4m3fn) or (
        hidden_states.dtype == DType.float8_e4m3fn and sf != 32
    ):
        raise TypeError(
            f"{where}: hidden_states must be uint8 (packed FP4) or float8_e4m3fn with float8_e8m0fnu scales (MXFP8), "
            f"got {hidden_states.dtype} with {a_scales.dtype} scales"
        )
    if hidden_states.rank != 2 or weight.rank != 3:
        raise ValueError(
            f"{where}: expected hidden_states of rank 2 and weight of rank 3, was {hidden_states.rank} and "
            f"{weight.rank}"
        )
    if a_scales.rank != 5:
        raise ValueError(f"{where}: expected a_scales to have rank 5, was {a_scales.rank}")
    if b_scales.rank != 6:
        raise ValueError(f"{where}: expected b_scales to have rank 6, was {b_scales.rank}")
    n_exp = int(expert_ids.shape[0])
    if weight.shape[2] != hidden_states.shape[1] or int(weight.shape[0]) != n_exp or int(b_scales.shape[0]) != n_exp:
        raise ValueError(
            f"{where}: expected weight (and b_scales) of shape [num_experts={n_exp}, *, {hidden_states.shape[1]}], got "
            f"{list(weight.shape)} and {list(b_scales.shape)}"
        )
    for t, name in ((a_scale_offsets, "a_scale_offsets"), (expert_scales, "expert_scales")):
        if t.rank != 1 or int(t.shape[0]) != n_exp:
            raise ValueError(f"{where}: expected {name} of shape [{n_exp}], got {list(t.shape)}")

    h = _values(hidden_states)  # [T, K]
    t_rows, k = hidden_states.shape[0], int(h.shape[1])
    groups = _ceil(k, sf)
    tiles = int(a_scales.shape[0])
    sa = _scales_2d(where, "a_scales", a_scales, tiles * _ATOM_ROWS, groups)  # every scale row the tiles hold
    starts = _full_starts(where, expert_start_indices, n_exp)
    g = _row_groups(starts, t_rows, n_exp)
    scale_row = (
        ops.range(0, t_rows, 1, dtype=DType.int32, device=h.device)
        + ops.gather(a_scale_offsets.cast(DType.int32), g, axis=0) * _ATOM_ROWS
    )
    scale_row = ops.min(ops.max(scale_row, 0), tiles * _ATOM_ROWS - 1)
    h = h * ops.repeat_interleave(ops.gather(sa, scale_row, axis=0), sf, axis=1)[:, :k]
    n = int(weight.shape[1])
    w_vals = ops.reshape(_values(ops.reshape(weight, [n_exp * n, int(weight.shape[2])])), [n_exp, n, k])
    sb = ops.stack(
        [_scales_2d(where, "b_scales", b_scales[e], n, groups) for e in range(n_exp)], axis=0
    )  # [E, N, groups]
    w = w_vals * ops.repeat_interleave(sb, sf, axis=2)[:, :, :k]
    out = ops.grouped_matmul_ragged(h, w, starts, expert_ids, expert_usage_stats_host)  # float32 [T, N]
    ids = ops.min(ops.max(expert_ids.cast(DType.int64), 0), n_exp - 1)
    row_scale = ops.gather(ops.gather(expert_scales.cast(DType.float32), ids, axis=0), g, axis=0)
    return (out * ops.unsqueeze(row_scale, 1)).cast(out_type)


def check_same_device(where: str, input: Any, named: list[tuple[Any, str]]) -> None:  # noqa: A002
    """MAX's device check of the fused kernels: every tensor on ``input``'s device."""
    if not all(t.device == input.device for t, _ in named):
        listing = "\n".join(f"  {name}={t.device}" for t, name in named)
        raise ValueError(
            f"{where}: expected all tensors to be on the same device as input ({input.device}), but got:\n{listing}"
        )


def check_layer_idx_on_cpu(where: str, layer_idx: Any) -> None:
    """MAX keeps ``layer_idx`` on the host: it indexes the cache."""
    if layer_idx.device != DeviceRef.CPU():
        raise ValueError(f"{where}: expected layer_idx to be on CPU device, but got {layer_idx.device}")
