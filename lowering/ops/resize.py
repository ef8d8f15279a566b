"""Resize: ``resize`` and MAX's ``resize_linear``, ``resize_nearest`` and ``resize_bicubic``.

One op, ``resize``, serves the four fronts (MAX's ``ops.resize`` picks one of
the three others by its `InterpolationMode`, with their default settings).
Every dim whose size changes is resampled on its own, in turn (the filters are
separable): an output index is mapped to a source coordinate, the source
samples around it are weighted ("taps"), and the impl gathers the taps and sums
them. The taps of an axis are computed in numpy from the static sizes, in
float32 and with the formulas of MAX's kernels (``max/kernels/src/nn/resize.mojo``
and ``bicubic.mojo``), so the same output indices are picked at rounding ties.

Coordinate transformation modes (``coordinate_transform_mode``), with
``scale = out / in`` rounded to float32 and ``o`` the output index:

- ``0`` half_pixel: ``(o + 0.5) / scale - 0.5``;
- ``1`` align_corners: ``o * (in - 1) / (out - 1)`` (``0`` when ``out == 1``);
- ``2`` asymmetric: ``o / scale``;
- ``3`` half_pixel_1D: half_pixel, but ``0`` when ``out == 1``.

Nearest rounding modes (``round_mode``) of a coordinate ``x``: ``0`` HalfDown
``ceil(x - 0.5)``, ``1`` HalfUp ``floor(x + 0.5)``, ``2`` Floor, ``3`` Ceil.
Bicubic is Keys' cubic convolution with ``a = -0.75`` (PyTorch's, OpenCV's) on
half-pixel coordinates ``(o + 0.5) * (in / out) - 0.5``, edge samples repeated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax.numpy as jnp
import numpy as np

from lowering.context import bind
from lowering.dims import Dim, StaticDim, format_shape
from lowering.ops import _rules as R
from lowering.registry import OpDef, OpError, front, register
from lowering.types import InterpolationMode, TensorType

__all__ = ["resize", "resize_linear", "resize_nearest", "resize_bicubic"]

_NEAREST, _LINEAR, _BICUBIC = InterpolationMode.NEAREST, InterpolationMode.BILINEAR, InterpolationMode.BICUBIC
_OP_NAMES = {_NEAREST: "resize_nearest", _LINEAR: "resize_linear", _BICUBIC: "resize_bicubic"}

# MAX's CoordinateTransformationMode and RoundMode (plain ints in its Python API).
HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC, HALF_PIXEL_1D = range(4)
_COORDINATE_MODES = "0 half_pixel, 1 align_corners, 2 asymmetric, 3 half_pixel_1D"
HALF_DOWN, HALF_UP, FLOOR, CEIL = range(4)
_ROUND_MODES = "0 HalfDown ceil(x - 0.5), 1 HalfUp floor(x + 0.5), 2 Floor, 3 Ceil"

_F32 = np.float32
_HALF = np.float32(0.5)


# ─── rule ─────────────────────────────────────────────────────────────────


def _resize_rule(x, *, shape, interpolation, coordinate_transform_mode, round_mode, antialias) -> TensorType:
    # The fronts check their arguments under their own names first; this repeats the checks
    # for inputs the fronts cannot see the rank of (e.g. Python lists).
    op = _OP_NAMES[interpolation]
    x = R.require_tensor(op, x)
    if len(shape) != x.rank:
        raise OpError(
            f"{op}: size must have the same rank as input ({x.rank}), got {len(shape)}: {format_shape(shape)} for "
            f"input {R.fmt(x)}"
        )
    if interpolation is _BICUBIC and x.rank != 4:
        raise OpError(f"{op} requires rank-4 (NCHW) input, got rank {x.rank} ({R.fmt(x)})")
    _check_dims(op, shape, "size")
    for axis, (n, o) in enumerate(zip(x.shape, shape)):
        if isinstance(n, StaticDim) and n.dim == 0:
            raise OpError(f"{op}: dim {axis} of input {R.fmt(x)} is empty; it cannot be resized to {o}")
    return TensorType(x.dtype, list(shape), x.device)


# ─── taps: per output index, the source indices it reads and their weights ──


def _source_coords(in_size: int, out_size: int, mode: int) -> np.ndarray:
    """float32 source coordinate of each output index (MAX's ``coord_transform``)."""
    o = np.arange(out_size, dtype=_F32)
    if out_size == 1 and mode in (ALIGN_CORNERS, HALF_PIXEL_1D):
        return np.zeros(1, _F32)
    if mode == ALIGN_CORNERS:
        return o * _F32((in_size - 1) / (out_size - 1))
    scale = _F32(out_size / in_size)
    if mode == ASYMMETRIC:
        return o / scale
    return (o + _HALF) / scale - _HALF


def _nearest_index(in_size: int, out_size: int, mode: int, round_mode: int) -> np.ndarray:
    x = _source_coords(in_size, out_size, mode)
    rounded = (np.ceil(x - _HALF), np.floor(x + _HALF), np.floor(x), np.ceil(x))[round_mode]
    # MAX clamps above only (min(i, in - 1)); below 0 its kernel would read out of bounds.
    return np.clip(rounded, 0, in_size - 1).astype(np.int32)


def _linear_taps(in_size: int, out_size: int, mode: int, antialias: bool) -> tuple[np.ndarray, np.ndarray]:
    """MAX's ``interpolate_point_1d``: a tent filter around each center, taps inside the input, weights normalized."""
    scale = _F32(out_size / in_size)
    center = _source_coords(in_size, out_size, mode) + _HALF
    # Antialiasing widens the tent by 1 / scale when downscaling.
    support = _F32(1) / scale if antialias and scale < 1 else _F32(1)
    inv_support = _F32(1) / support
    first = np.maximum(np.trunc(center - support + _HALF).astype(np.int64), 0)
    end = np.minimum(np.trunc(center + support + _HALF).astype(np.int64), in_size)
    count = max(int((end - first).max()), 1)
    k = first[:, None] + np.arange(count)
    dist = ((k.astype(_F32) + _HALF) - center[:, None]) * inv_support
    weight = np.where((k < end[:, None]) & (dist < 1), _F32(1) - np.abs(dist), _F32(0)).astype(np.float64)
    total = weight.sum(1, keepdims=True)
    empty = total[:, 0] == 0  # no tap inside the input (never for in-range coordinates): take the edge sample
    weight[empty, 0], total[empty] = 1.0, 1.0
    return np.clip(k, 0, in_size - 1), weight / total


def _cubic(t: np.ndarray) -> np.ndarray:
    # Keys' cubic convolution with a = -0.75, in float32 as MAX's cubic_kernel writes it.
    a = _F32(-0.75)
    t = np.abs(t).astype(_F32)
    t2 = t * t
    t3 = t2 * t
    near = (a + 2) * t3 - (a + 3) * t2 + 1
    far = a * t3 - 5 * a * t2 + 8 * a * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0)).astype(_F32)


def _cubic_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """MAX's ``resize_bicubic``: 4 taps around ``(o + 0.5) * (in / out) - 0.5``, edge indices clamped."""
    x = (np.arange(out_size, dtype=_F32) + _HALF) * (_F32(in_size) / _F32(out_size)) - _HALF
    x0 = np.floor(x)
    k = np.arange(4)
    index = np.clip(x0.astype(np.int64)[:, None] + k - 1, 0, in_size - 1)
    return index, _cubic((k.astype(_F32) - _F32(1)) - (x - x0)[:, None])


# ─── impl ─────────────────────────────────────────────────────────────────


def _from_float(v, dtype):
    """Interpolated values back in ``dtype``: integers and bools round to the nearest value in range."""
    if jnp.issubdtype(dtype, jnp.floating):
        return v.astype(dtype)
    if dtype == jnp.bool_:
        return v >= 0.5
    info = jnp.iinfo(dtype)
    return jnp.clip(jnp.round(v), info.min, info.max).astype(dtype)


def _resize_impl(x, *, shape, interpolation, coordinate_transform_mode, round_mode, antialias):
    changed = [(axis, n, int(o)) for axis, (n, o) in enumerate(zip(x.shape, shape)) if n != int(o)]
    if interpolation is _NEAREST:
        for axis, n, o in changed:
            x = jnp.take(x, _nearest_index(n, o, coordinate_transform_mode, round_mode), axis=axis, mode="clip")
        return x
    if not changed:
        return x
    acc = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    out = x.astype(acc)
    for axis, n, o in changed:
        index, weight = (
            _cubic_taps(n, o) if interpolation is _BICUBIC else _linear_taps(n, o, coordinate_transform_mode, antialias)
        )
        taps = index.shape[1]
        gathered = jnp.take(out, index.reshape(-1), axis=axis, mode="clip").reshape(
            (*out.shape[:axis], o, taps, *out.shape[axis + 1 :])
        )
        w = jnp.asarray(weight, acc).reshape((o, taps) + (1,) * (out.ndim - axis - 1))
        out = jnp.sum(gathered * w, axis=axis + 1)
    return _from_float(out, x.dtype)


resize_p = register(OpDef("resize", rule=_resize_rule, impl=_resize_impl))


# ─── fronts ───────────────────────────────────────────────────────────────


def _mode_param(op: str, value: Any, name: str, listing: str) -> int:
    """MAX's check (``value not in (0, 1, 2, 3)``), then the int."""
    try:
        ok = not isinstance(value, (str, bytes)) and value in (0, 1, 2, 3)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise OpError(f"{op}: {name} must be 0-3, got {value!r} ({listing})")
    return int(value)


def _size_dims(op: str, size: Any, name: str) -> tuple[Dim, ...]:
    if hasattr(size, "type") or isinstance(size, (str, bytes)) or not isinstance(size, Iterable):
        raise TypeError(
            f"{op}: {name} must be a sequence of dims (ints or dim names), got {type(size).__name__} {size!r}"
        )
    return tuple(Dim(d) for d in size)


def _check_dims(op: str, dims: Any, name: str) -> None:
    if any(isinstance(d, StaticDim) and d.dim <= 0 for d in dims):
        raise OpError(f"{op}: output dims must be positive, got {name} {format_shape(dims)}")


def _input_rank(x: Any) -> tuple[int, str] | None:
    """The rank of ``x`` and how to show it, where the front can see it (graph values, tensors, arrays)."""
    t = getattr(x, "type", None)
    if isinstance(t, TensorType):
        return t.rank, R.fmt(t)
    shape = getattr(x, "shape", None)
    if isinstance(shape, Iterable) and not callable(shape):
        dims = list(shape)
        return len(dims), f"shape {format_shape(dims)}"
    return None


def _check_same_rank(op: str, x: Any, dims: tuple[Dim, ...]) -> None:
    seen = _input_rank(x)
    if seen is not None and len(dims) != seen[0]:
        raise OpError(
            f"{op}: size must have the same rank as input ({seen[0]}), got {len(dims)}: {format_shape(dims)} for input "
            f"{seen[1]}"
        )


def _bind(
    x: Any,
    dims: tuple[Dim, ...],
    mode: InterpolationMode,
    coordinate_transform_mode: int = HALF_PIXEL,
    round_mode: int = HALF_DOWN,
    antialias: bool = False,
) -> Any:
    return bind(
        resize_p,
        x,
        shape=dims,
        interpolation=mode,
        coordinate_transform_mode=coordinate_transform_mode,
        round_mode=round_mode,
        antialias=antialias,
    )


@front()
def resize_linear(input, size, coordinate_transform_mode=0, antialias=False):  # noqa: A002 - MAX's names
    """Resize a tensor of any rank to ``size`` with linear interpolation (bilinear on images).

    Each dim whose size changes, batch and channels included, is interpolated
    on its own with a tent filter. An output index ``o`` maps to the source
    coordinate ``x`` given by ``coordinate_transform_mode`` (computed in
    float32 as MAX's kernel does, with ``scale = out / in`` rounded to float32):

    - ``0`` half_pixel (default): ``(o + 0.5) / scale - 0.5``, PyTorch's
      ``align_corners=False``;
    - ``1`` align_corners: ``o * (in - 1) / (out - 1)``, the corner samples are
      kept (``0`` when ``out == 1``);
    - ``2`` asymmetric: ``o / scale``;
    - ``3`` half_pixel_1D: half_pixel, except that a dim of output size 1 maps
      to ``0``.

    ``x`` is interpolated between its two neighbours; a neighbour outside the
    input is dropped and the other weight renormalized (the edge sample
    repeats). With ``antialias=True`` a downscaled dim widens the tent by
    ``1 / scale`` and weighs every sample under it (PyTorch's bilinear
    ``antialias=True``); upscaling is unaffected. Integer and bool inputs are
    interpolated in float32 and rounded to the nearest value of their dtype.

    Args:
        input: the tensor to resize.
        size: the output shape, one dim per input dim (ints or dim names).
        coordinate_transform_mode: ``0``-``3`` as above.
        antialias: widen the filter when downscaling.

    Returns:
        A tensor of shape ``size`` and ``input``'s dtype.

    Raises:
        ValueError: ``coordinate_transform_mode`` not 0-3, ``size`` of another
            rank than ``input``, or a dim of ``size`` not positive.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[0.0, 1.0, 2.0, 3.0]])
        >>> ops.resize_linear(x, [1, 6])  # half_pixel: sources -0.17 (clamped to 0), 0.5, 1.17, 1.83, 2.5, 3.17
        TensorType(dtype=float32, shape=[Dim(1), Dim(6)], device=cpu:0): [0.0, 0.5, 1.1666..., 1.8333..., 2.5, 3.0]
        >>> ops.resize_linear(x, [1, 7], coordinate_transform_mode=1)  # align_corners
        TensorType(dtype=float32, shape=[Dim(1), Dim(7)], device=cpu:0): [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
        >>> ops.resize_linear(x, [1, 2], antialias=True)  # a tent 2 samples wide each side: weights 3, 3, 1 (/ 7)
        TensorType(dtype=float32, shape=[Dim(1), Dim(2)], device=cpu:0): [0.7142..., 2.2857...]
    """
    op = "resize_linear"
    mode = _mode_param(op, coordinate_transform_mode, "coordinate_transform_mode", _COORDINATE_MODES)
    dims = _size_dims(op, size, "size")
    _check_same_rank(op, input, dims)
    _check_dims(op, dims, "size")
    return _bind(input, dims, _LINEAR, coordinate_transform_mode=mode, antialias=bool(antialias))


@front()
def resize_nearest(input, size, coordinate_transform_mode=0, round_mode=0):  # noqa: A002 - MAX's names
    """Resize a tensor of any rank to ``size`` by picking the nearest input sample.

    Each dim whose size changes, batch and channels included, maps an output
    index to a source coordinate ``x`` by ``coordinate_transform_mode`` (``0``
    half_pixel, the default; ``1`` align_corners; ``2`` asymmetric; ``3``
    half_pixel_1D; see `resize_linear`) and rounds it by ``round_mode``:

    - ``0`` HalfDown (default): ``ceil(x - 0.5)``, ties go down;
    - ``1`` HalfUp: ``floor(x + 0.5)``, ties go up;
    - ``2`` Floor: ``floor(x)``;
    - ``3`` Ceil: ``ceil(x)``.

    The index is clamped to the input (PyTorch's ``mode="nearest"`` is
    asymmetric with Floor, ``"nearest-exact"`` half_pixel with HalfUp). Values
    are copied, so every dtype resizes exactly.

    Args:
        input: the tensor to resize.
        size: the output shape, one dim per input dim (ints or dim names).
        coordinate_transform_mode: ``0``-``3`` as above.
        round_mode: ``0``-``3`` as above.

    Returns:
        A tensor of shape ``size`` and ``input``'s dtype.

    Raises:
        ValueError: ``coordinate_transform_mode`` or ``round_mode`` not 0-3,
            ``size`` of another rank than ``input``, or a dim of ``size`` not
            positive.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> x = Tensor(np.array([[10, 20, 30, 40]], np.int32))
        >>> ops.resize_nearest(x, [1, 3])  # half_pixel sources 0.17, 1.5, 2.83; HalfDown rounds the tie 1.5 to 1
        TensorType(dtype=int32, shape=[Dim(1), Dim(3)], device=cpu:0): [10, 20, 40]
        >>> ops.resize_nearest(x, [1, 3], round_mode=1)  # HalfUp rounds it to 2
        TensorType(dtype=int32, shape=[Dim(1), Dim(3)], device=cpu:0): [10, 30, 40]
        >>> ops.resize_nearest(x, [1, 2], coordinate_transform_mode=2, round_mode=2)  # PyTorch's "nearest"
        TensorType(dtype=int32, shape=[Dim(1), Dim(2)], device=cpu:0): [10, 30]
    """
    op = "resize_nearest"
    mode = _mode_param(op, coordinate_transform_mode, "coordinate_transform_mode", _COORDINATE_MODES)
    rounding = _mode_param(op, round_mode, "round_mode", _ROUND_MODES)
    dims = _size_dims(op, size, "size")
    _check_same_rank(op, input, dims)
    _check_dims(op, dims, "size")
    return _bind(input, dims, _NEAREST, coordinate_transform_mode=mode, round_mode=rounding)


@front()
def resize_bicubic(input, size):  # noqa: A002 - MAX's names
    """Resize an NCHW tensor to ``size`` with bicubic interpolation.

    PyTorch's and OpenCV's bicubic: Keys' cubic convolution with ``a = -0.75``
    over the 4x4 samples around the half-pixel source coordinate
    ``(o + 0.5) * (in / out) - 0.5``, indices outside the input clamped to the
    edge; no antialiasing. MAX's kernel resamples H and W; here a batch or
    channel dim whose size changes is resampled the same way (MAX leaves that
    case undefined). Integer and bool inputs are interpolated in float32 and
    rounded to the nearest value of their dtype.

    Args:
        input: ``(N, C, H, W)``.
        size: the output shape ``(N, C, H_out, W_out)`` (ints or dim names).

    Returns:
        A tensor of shape ``size`` and ``input``'s dtype.

    Raises:
        ValueError: ``input`` not rank 4, ``size`` not 4 dims, or a dim of
            ``size`` not positive.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[[[0.0, 1.0, 2.0, 3.0]]]])  # [1, 1, 1, 4]
        >>> ops.resize_bicubic(x, [1, 1, 1, 8])[0, 0, 0]  # sources -0.25, 0.25, ..., 3.25
        ... # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(8)], device=cpu:0):
        [-0.1054..., 0.1914..., 0.6679..., 1.2968..., 1.7031..., 2.3320..., 2.8085..., 3.1054...]
    """
    op = "resize_bicubic"
    dims = _size_dims(op, size, "size")
    seen = _input_rank(input)
    if seen is not None and seen[0] != 4:
        raise OpError(f"{op} requires rank-4 (NCHW) input, got rank {seen[0]} ({seen[1]})")
    if len(dims) != 4:
        raise OpError(f"{op}: size must have 4 elements for NCHW format, got {len(dims)}: {format_shape(dims)}")
    _check_dims(op, dims, "size")
    return _bind(input, dims, _BICUBIC)


@front(resize_p)
def resize(input, shape, interpolation=InterpolationMode.BILINEAR):  # noqa: A002 - MAX's names
    """Resize an NCHW tensor to ``shape``: `resize_linear`, `resize_nearest` or `resize_bicubic` with their defaults.

    ``BILINEAR`` is `resize_linear` with half-pixel centers and no
    antialiasing (PyTorch's ``align_corners=False``), ``NEAREST`` is
    `resize_nearest` with half-pixel centers and HalfDown rounding
    (``ceil(x - 0.5)``), ``BICUBIC`` is `resize_bicubic` (a = -0.75). Usually
    only H and W change; any dim may, each interpolated on its own.
    Integer and bool inputs are interpolated in float32 and rounded to the
    nearest value of their dtype (``NEAREST`` copies values).

    Args:
        input: ``(N, C, H, W)``.
        shape: ``(N_out, C_out, H_out, W_out)``, every dim positive.
        interpolation: an `InterpolationMode` (default BILINEAR).

    Raises:
        ValueError: input not rank 4, ``shape`` not 4 positive dims, or an
            unknown interpolation mode.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.graph.ops import InterpolationMode
        >>> x = Tensor([[[[0.0, 1.0], [2.0, 3.0]]]])  # NCHW [1, 1, 2, 2]
        >>> ops.resize(x, [1, 1, 4, 4])[0, 0]  # bilinear, half-pixel centers  # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(4), Dim(4)], device=cpu:0):
        [0.0, 0.25, 0.75, 1.0, 0.5, 0.75, 1.25, 1.5, 1.5, 1.75, 2.25, 2.5, 2.0, 2.25, 2.75, 3.0]
        >>> ops.resize(x, [1, 1, 3, 3], InterpolationMode.NEAREST)[0, 0]
        TensorType(dtype=float32, shape=[Dim(3), Dim(3)], device=cpu:0): [0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 3.0]
    """
    op = "resize"
    if hasattr(shape, "type") or isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
        raise OpError(f"{op}: shape must be 4 dims (N, C, H, W), got {shape!r}")
    dims = tuple(Dim(d) for d in shape)
    t = getattr(input, "type", None)
    if isinstance(t, TensorType) and t.rank != 4:
        # MAX's wording; the input's rank is checked before the shape's length, as there.
        raise OpError(
            f"{op}: Input tensor must have rank 4 (NCHW format) for resize operation, but got rank {t.rank} "
            f"({R.fmt(t)})"
        )
    if len(dims) != 4:
        raise OpError(
            f"{op}: shape must have 4 elements for NCHW format (batch, channels, height, width), got {len(dims)}: "
            f"{format_shape(dims)}"
        )
    mode = R.enum_param(op, interpolation, InterpolationMode, "interpolation")
    _check_dims(op, dims, "shape")
    return _bind(input, dims, mode)
