"""float8 ops: static and dynamic quantization, and the scaled matmul.

The registry ops under ``maxfx.nn.kernels``' float8 kernels (MAX's custom Mojo
kernels). Conventions:

- float8 values are any of the four float8 dtypes; quantization saturates to
  the dtype's finite range (a plain cast would give NaN above it).
- A *scale tensor* ``s`` of a matrix ``m`` has the matrix's rank; each of its
  last two dims is 1 (one scale for the whole dim), equal to the matrix dim
  (one scale per row/column), or ``ceil(dim / block)`` (one scale per block).
  This covers per-tensor, row-wise, column-wise and block-wise scaling
  (the grouped MoE matmuls of `lowering.ops.moe` use the same checks).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from lowering.context import bind
from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, OpError, front, register
from lowering.types import TensorType

__all__ = ["quantize_static_float8", "quantize_dynamic_float8", "scaled_matmul", "FLOAT8_DTYPES"]

FLOAT8_DTYPES = (DType.float8_e4m3fn, DType.float8_e4m3fnuz, DType.float8_e5m2, DType.float8_e5m2fnuz)


# ─── scale checks ─────────────────────────────────────────────────────────


def _check_scale_dim(op: str, scale_dim: Dim, dim: Dim, shapes: str, axis: int) -> None:
    """A scale dim is 1, the matrix dim itself, or ceil(dim / block) for some block."""
    if scale_dim == 1 or scale_dim == dim:
        return
    if not (isinstance(scale_dim, StaticDim) and isinstance(dim, StaticDim)):
        raise OpError(
            f"{op}: scale dim {axis} ({scale_dim}) must be 1 or equal {dim} when either is symbolic: {shapes}"
        )
    s, d = scale_dim.dim, dim.dim
    block = -(-d // s) if s > 0 else 0
    if s <= 0 or s > d or -(-d // block) != s:
        raise OpError(
            f"{op}: scale dim {axis} has {s} entries, which is not ceil({d} / block) for any block size: {shapes}"
        )


def check_scales(op: str, m: TensorType, s: TensorType, mname: str, sname: str) -> None:
    shapes = f"{mname} {R.fmt(m)}, {sname} {R.fmt(s)}"
    if s.rank != m.rank:
        raise OpError(f"{op}: {sname} must have the rank of {mname} ({m.rank}), got {shapes}")
    for ax in range(m.rank - 2):
        if s.shape[ax] != m.shape[ax]:
            raise OpError(f"{op}: {sname} batch dim {ax} must equal {mname}'s: {shapes}")
    for ax in (m.rank - 2, m.rank - 1):
        _check_scale_dim(op, s.shape[ax], m.shape[ax], shapes, ax)


def expand_scales(s, shape: tuple[int, ...]):
    """Scales repeated to the full matrix shape (each entry covers one block)."""
    s = s.astype(jnp.float32)
    for ax in (-2, -1):
        d, n = shape[ax], s.shape[ax]
        block = -(-d // n)
        s = jnp.repeat(s, block, axis=ax, total_repeat_length=block * n)
        s = lax.slice_in_dim(s, 0, d, axis=len(s.shape) + ax)
    return s


def dequant_scaled(m, s):
    return m.astype(jnp.float32) * expand_scales(s, m.shape)


def _f8_limit(dtype: DType) -> float:
    return float(jnp.finfo(dtype.to_numpy()).max)


# ─── float8 quantization ──────────────────────────────────────────────────


def _quantize_static_rule(x, scale, *, scale_is_inverted: bool, out_dtype: DType) -> TensorType:
    op = "quantize_static_scaled_float8"
    x = R.require_tensor(op, x, "x", kind=R.FLOAT)
    s = R.require_tensor(op, scale, "scale", kind=R.FLOAT)
    if any(d != 1 for d in s.shape):
        raise OpError(f"{op}: scale must be a scalar (shape [] or [1]), got {R.fmt(s)}")
    if out_dtype not in FLOAT8_DTYPES:
        raise OpError(f"{op}: out_type must be a float8 dtype, got {out_dtype}")
    return TensorType(out_dtype, x.shape, x.device)


def _quantize_static_impl(x, scale, *, scale_is_inverted: bool, out_dtype: DType):
    s = scale.astype(jnp.float32).reshape(())
    y = x.astype(jnp.float32) * s if scale_is_inverted else x.astype(jnp.float32) / s
    lim = _f8_limit(out_dtype)
    return jnp.clip(y, -lim, lim).astype(out_dtype.to_numpy())


quantize_static_float8_p = register(
    OpDef("quantize_static_float8", rule=_quantize_static_rule, impl=_quantize_static_impl, differentiable=False)
)


@front(quantize_static_float8_p)
def quantize_static_float8(x, scale, scale_is_inverted: bool = True, out_dtype: DType = DType.float8_e4m3fn):
    """``x * scale`` (``scale_is_inverted``) or ``x / scale``, saturated and cast to float8.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([1.0, -3.0, 1000.0])
        >>> q = ops.quantize_static_float8(x, Tensor(0.5))  # x * 0.5, saturated to float8's +-448
        >>> print(q.dtype)
        DType.float8_e4m3fn
        >>> ops.cast(q, DType.float32)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [0.5, -1.5, 448.0]
    """
    return bind(
        quantize_static_float8_p, x, scale, scale_is_inverted=bool(scale_is_inverted), out_dtype=DType(out_dtype)
    )


def _quantize_dynamic_rule(x, *, group_size: int, scale_ub: float, out_dtype: DType, scales_dtype: DType):
    op = "quantize_dynamic_scaled_float8"
    x = R.require_tensor(op, x, "input", kind=R.FLOAT)
    R.require_rank(op, x, lambda r: r >= 2, ">= 2", "input")
    k = R.static_int(op, x.shape[-1], "the last dim of input")
    g = k if group_size == -1 else group_size
    if g <= 0 or k % g:
        raise OpError(
            f"{op}: group_size_or_per_token={group_size} must be -1 or a positive divisor of the last dim {k}: input "
            f"{R.fmt(x)}"
        )
    if out_dtype not in FLOAT8_DTYPES:
        raise OpError(f"{op}: out_type must be a float8 dtype, got {out_dtype}")
    if not scales_dtype.is_float():
        raise OpError(f"{op}: scales_type must be a float dtype, got {scales_dtype}")
    if not scale_ub > 0:
        raise OpError(f"{op}: scale_ub must be positive, got {scale_ub}")
    return TensorType(out_dtype, x.shape, x.device), TensorType(scales_dtype, [*x.shape[:-1], k // g], x.device)


def _quantize_dynamic_impl(x, *, group_size: int, scale_ub: float, out_dtype: DType, scales_dtype: DType):
    k = x.shape[-1]
    g = k if group_size == -1 else group_size
    xr = x.astype(jnp.float32).reshape(*x.shape[:-1], k // g, g)
    amax = jnp.minimum(jnp.max(jnp.abs(xr), axis=-1), scale_ub)
    lim = _f8_limit(out_dtype)
    # Quantize with the scale as stored (rounded to scales_dtype) so q * scale round-trips.
    scale = (amax / lim).astype(scales_dtype.to_numpy())
    s32 = scale.astype(jnp.float32)
    safe = jnp.where(s32 == 0, 1.0, s32)
    q = jnp.clip(xr / safe[..., None], -lim, lim).astype(out_dtype.to_numpy())
    return q.reshape(x.shape), scale


quantize_dynamic_float8_p = register(
    OpDef(
        "quantize_dynamic_float8",
        rule=_quantize_dynamic_rule,
        impl=_quantize_dynamic_impl,
        multiple_results=True,
        differentiable=False,
    )
)


@front(quantize_dynamic_float8_p)
def quantize_dynamic_float8(
    x,
    group_size: int = -1,
    scale_ub: float = 1200.0,
    out_dtype: DType = DType.float8_e4m3fn,
    scales_dtype: DType = DType.bfloat16,
):
    """Per-group dynamic float8 quantization along the last dim: ``(q, scales)``.

    Each run of ``group_size`` elements (the whole last dim when -1) gets
    ``scale = min(amax, scale_ub) / float8_max``; ``q = x / scale`` saturated.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, -2.0, 0.5, 4.0], [0.1, 0.2, 0.3, 0.4]])
        >>> q, scales = ops.quantize_dynamic_float8(x, group_size=-1)  # one scale per row: amax / 448
        >>> print(q.dtype, scales.dtype)
        DType.float8_e4m3fn DType.bfloat16
        >>> ops.cast(scales, DType.float32)
        TensorType(dtype=float32, shape=[Dim(2), Dim(1)], device=cpu:0): [0.0089..., 0.0008...]
        >>> ops.cast(q, DType.float32) * ops.cast(scales, DType.float32)  # dequantized: close to x
        ... # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(2), Dim(4)], device=cpu:0):
        [0.9980..., -1.9960..., 0.4990..., 3.9921..., 0.0999..., 0.1999..., 0.3142..., 0.3999...]
    """
    return bind(
        quantize_dynamic_float8_p,
        x,
        group_size=int(group_size),
        scale_ub=float(scale_ub),
        out_dtype=DType(out_dtype),
        scales_dtype=DType(scales_dtype),
    )


# ─── scaled matmul ────────────────────────────────────────────────────────


def _scaled_matmul_rule(a, b, a_scales, b_scales, *, out_dtype: DType) -> TensorType:
    op = "scaled_matmul"
    a = R.require_tensor(op, a, "a", rank=(2, 3), kind=R.FLOAT8)
    b = R.require_tensor(op, b, "b", rank=(2, 3), kind=R.FLOAT8)
    sa = R.require_tensor(op, a_scales, "a_scales", kind=R.FLOAT)
    sb = R.require_tensor(op, b_scales, "b_scales", kind=R.FLOAT)
    shapes = f"a {R.fmt(a)}, b {R.fmt(b)} (b is transposed: [..., N, K])"
    if a.dtype is not b.dtype:
        raise OpError(f"{op}: a and b must have the same float8 dtype, got {shapes}")
    if a.rank != b.rank or (a.rank == 3 and a.shape[0] != b.shape[0]):
        raise OpError(f"{op}: a and b must both be matrices or batches of the same size, got {shapes}")
    if a.shape[-1] != b.shape[-1]:
        raise OpError(f"{op}: contracting dims differ ({a.shape[-1]} vs {b.shape[-1]}): {shapes}")
    check_scales(op, a, sa, "a", "a_scales")
    check_scales(op, b, sb, "b", "b_scales")
    if not out_dtype.is_float():
        raise OpError(f"{op}: out_type must be a float dtype, got {out_dtype}")
    device = R.input_device(a, b)
    return TensorType(out_dtype, [*a.shape[:-1], b.shape[-2]], device)


def _scaled_matmul_impl(a, b, a_scales, b_scales, *, out_dtype: DType):
    out = jnp.einsum(
        "...mk,...nk->...mn", dequant_scaled(a, a_scales), dequant_scaled(b, b_scales), precision=lax.Precision.HIGHEST
    )
    return out.astype(out_dtype.to_numpy())


scaled_matmul_p = register(
    OpDef("scaled_matmul", rule=_scaled_matmul_rule, impl=_scaled_matmul_impl, differentiable=False)
)


@front(scaled_matmul_p)
def scaled_matmul(a, b, a_scales, b_scales, out_dtype: DType = DType.bfloat16):
    """``(a * a_scales) @ (b * b_scales).T`` for float8 ``a [.., M, K]`` and ``b [.., N, K]``.

    Scales broadcast per tensor, row, column or block (see the module notes);
    the product accumulates in float32 and is cast to ``out_dtype``.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = ops.cast(Tensor([[1.0, 2.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]), DType.float8_e4m3fn)  # [M=2, K=4]
        >>> b = ops.cast(Tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]),
        ...     DType.float8_e4m3fn)  # [N=3, K]
        >>> a_scales = Tensor([[0.5]])  # per tensor
        >>> b_scales = Tensor([[1.0], [2.0], [1.0]])  # per row of b
        >>> ops.scaled_matmul(a, b, a_scales, b_scales, out_dtype=DType.float32)
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0): [0.5, 2.0, 2.0, 0.0, 1.0, 1.0]
    """
    return bind(scaled_matmul_p, a, b, a_scales, b_scales, out_dtype=DType(out_dtype))
