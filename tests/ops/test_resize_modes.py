"""ops.resize_linear / resize_nearest / resize_bicubic (and ops.resize) against numpy references.

The references are written from the definitions of the modes (MAX's
``max/python/max/graph/ops/resize.py`` docstrings and its kernels
``max/kernels/src/nn/resize.mojo`` and ``bicubic.mojo``), one output sample at a
time. A source coordinate is computed as MAX's kernels compute it, in float32
with ``scale = out / in`` rounded to float32; so a tie of exact arithmetic can
land on either side (7 -> 2 asymmetric maps output 1 to 3.4999998, not 3.5),
as it does in MAX:

- coordinate_transform_mode 0 half_pixel ``(o + 0.5) / scale - 0.5``,
  1 align_corners ``o * (in - 1) / (out - 1)`` (0 for out == 1), 2 asymmetric
  ``o / scale``, 3 half_pixel_1D (half_pixel, 0 for out == 1);
- nearest: round_mode 0 ``ceil(x - 0.5)``, 1 ``floor(x + 0.5)``, 2 floor,
  3 ceil, clamped to the input;
- linear: the two neighbours of ``x`` weighted ``1 - t`` and ``t``, an index
  outside the input replaced by the edge one; with antialias (downscaling) a
  tent of half-width ``in / out`` around ``x + 0.5`` over every input sample,
  normalized;
- bicubic: Keys' cubic convolution with a = -0.75 over the 4 neighbours of
  ``(o + 0.5) * (in / out) - 0.5``, indices clamped.

They run eagerly (``maxfx.experimental.functional`` on ``Tensor``) and in a
``Graph`` run by an ``InferenceSession``; errors and ``jax.grad`` are checked too.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.experimental import functional as F
from maxfx.experimental.tensor import Tensor
from maxfx.graph import Graph, TensorType, ops
from maxfx.graph.ops import InterpolationMode
from tests.ops.harness import rand, run_op

HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC, HALF_PIXEL_1D = range(4)
HALF_DOWN, HALF_UP, FLOOR, CEIL = range(4)

# ─── numpy references ─────────────────────────────────────────────────────


f32 = np.float32


def source(o: int, n_in: int, n_out: int, mode: int) -> np.float32:
    """Source coordinate of output index ``o``, in float32 (MAX's ``coord_transform``)."""
    if mode == ALIGN_CORNERS:
        return f32(0) if n_out == 1 else f32(o) * f32((n_in - 1) / (n_out - 1))
    if mode == HALF_PIXEL_1D and n_out == 1:
        return f32(0)
    scale = f32(n_out / n_in)
    if mode == ASYMMETRIC:
        return f32(o) / scale
    return (f32(o) + f32(0.5)) / scale - f32(0.5)


def nearest_taps(n_in, n_out, mode, round_mode):
    def pick(x: np.float32) -> int:
        half = f32(0.5)
        i = [np.ceil(x - half), np.floor(x + half), np.floor(x), np.ceil(x)][round_mode]
        return min(max(int(i), 0), n_in - 1)

    return [[(pick(source(o, n_in, n_out, mode)), 1.0)] for o in range(n_out)]


def linear_taps(n_in, n_out, mode, antialias=False):
    taps = []
    for o in range(n_out):
        x = float(source(o, n_in, n_out, mode))
        if antialias and n_out < n_in:
            support, center = n_in / n_out, x + 0.5
            w = [max(0.0, 1 - abs((j + 0.5 - center) / support)) for j in range(n_in)]
            taps.append([(j, wj / sum(w)) for j, wj in enumerate(w) if wj])
        else:
            i0 = math.floor(x)
            t = x - i0
            taps.append([(min(max(i0, 0), n_in - 1), 1 - t), (min(max(i0 + 1, 0), n_in - 1), t)])
    return taps


def keys_cubic(s: float, a: float = -0.75) -> float:
    s = abs(s)
    if s <= 1:
        return (a + 2) * s**3 - (a + 3) * s**2 + 1
    if s < 2:
        return a * s**3 - 5 * a * s**2 + 8 * a * s - 4 * a
    return 0.0


def cubic_taps(n_in, n_out):
    taps = []
    for o in range(n_out):
        x = float((f32(o) + f32(0.5)) * (f32(n_in) / f32(n_out)) - f32(0.5))
        i0 = math.floor(x)
        t = x - i0
        taps.append([(min(max(i0 + k, 0), n_in - 1), keys_cubic(k - t)) for k in (-1, 0, 1, 2)])
    return taps


def np_resize(x, size, taps_of):
    """Apply ``taps_of(n_in, n_out)`` along every dim whose size changes, output sample by output sample."""
    out = np.asarray(x, np.float64)
    for axis, n_out in enumerate(size):
        n_in = out.shape[axis]
        if n_in == n_out:
            continue
        moved = np.moveaxis(out, axis, 0)
        res = np.zeros((n_out, *moved.shape[1:]))
        for o, taps in enumerate(taps_of(n_in, n_out)):
            for j, w in taps:
                res[o] += w * moved[j]
        out = np.moveaxis(res, 0, axis)
    return out


def ref_linear(x, size, mode=HALF_PIXEL, antialias=False):
    return np_resize(x, size, lambda n, m: linear_taps(n, m, mode, antialias))


def ref_nearest(x, size, mode=HALF_PIXEL, round_mode=HALF_DOWN):
    return np_resize(x, size, lambda n, m: nearest_taps(n, m, mode, round_mode)).astype(np.asarray(x).dtype)


def ref_bicubic(x, size):
    return np_resize(x, size, cubic_taps)


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def eager(fn, x, *args, **kwargs):
    """``fn`` (a functional op) on an eager Tensor, back as numpy."""
    out = fn(Tensor(x), *args, **kwargs)
    assert isinstance(out, Tensor)
    return out.to_numpy()


# ─── values, eager and in a graph ─────────────────────────────────────────

LINEAR_CASES = [
    ([1, 2, 5, 4], [1, 2, 9, 7]),  # upscale H and W
    ([1, 2, 9, 7], [1, 2, 4, 3]),  # downscale
    ([2, 3, 6, 5], [3, 2, 8, 5]),  # batch and channels change too
    ([4, 6], [7, 1]),  # rank 2, a dim of output size 1
    ([5, 3, 2], [2, 3, 6]),  # rank 3
]


@pytest.mark.parametrize("mode", [HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC, HALF_PIXEL_1D])
@pytest.mark.parametrize("shape,size", LINEAR_CASES)
def test_resize_linear_modes(rng, mode, shape, size):
    x = rand(rng, shape)
    want = ref_linear(x, size, mode)
    close(eager(F.resize_linear, x, size, coordinate_transform_mode=mode), want)
    got = run_op(lambda a: ops.resize_linear(a, size, mode), x)
    assert got.shape == tuple(size) and got.dtype == np.float32
    close(got, want)


@pytest.mark.parametrize("mode", [HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC])
@pytest.mark.parametrize("shape,size", [([1, 1, 9, 13], [1, 1, 4, 3]), ([2, 10], [2, 3]), ([7, 6], [3, 9])])
def test_resize_linear_antialias(rng, mode, shape, size):
    x = rand(rng, shape)
    want = ref_linear(x, size, mode, antialias=True)
    close(eager(F.resize_linear, x, size, mode, True), want)
    close(run_op(lambda a: ops.resize_linear(a, size, coordinate_transform_mode=mode, antialias=True), x), want)


def test_antialias_changes_only_downscaled_dims(rng):
    x = rand(rng, [12, 3])
    size = [4, 8]  # dim 0 downscaled (averaged), dim 1 upscaled (plain linear)
    aa, plain = ref_linear(x, size, antialias=True), ref_linear(x, size)
    assert not np.allclose(aa, plain)
    close(run_op(lambda a: ops.resize_linear(a, size, antialias=True), x), aa)
    up = [24, 8]
    close(run_op(lambda a: ops.resize_linear(a, up, antialias=True), x), ref_linear(x, up))


@pytest.mark.parametrize("round_mode", [HALF_DOWN, HALF_UP, FLOOR, CEIL])
@pytest.mark.parametrize("mode", [HALF_PIXEL, ALIGN_CORNERS, ASYMMETRIC, HALF_PIXEL_1D])
@pytest.mark.parametrize(
    "shape,size",
    [
        ([1, 2, 4, 6], [1, 2, 3, 9]),  # 4 -> 3 and 6 -> 9 hit exact .5 ties (sources 1.5, 0.5, 2.5...)
        ([1, 1, 4, 4], [1, 1, 2, 8]),  # 4 -> 2: half_pixel sources 0.5 and 2.5, ties
        ([3, 5], [5, 1]),  # batch-like dim and an output of size 1
        ([2, 7, 3], [4, 2, 3]),
    ],
)
def test_resize_nearest_modes(rng, mode, round_mode, shape, size):
    x = rand(rng, shape, np.int32, -100, 100)
    want = ref_nearest(x, size, mode, round_mode)
    got = eager(F.resize_nearest, x, size, coordinate_transform_mode=mode, round_mode=round_mode)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_op(lambda a: ops.resize_nearest(a, size, mode, round_mode), x), want)


def test_round_modes_differ_on_a_tie():
    # 4 -> 3, half_pixel: sources 1/6, 3/2, 17/6 (scale 0.75 and 1.5 are exact in float32);
    # only the tie 3/2 separates HalfDown from HalfUp.
    x = np.array([10, 20, 30, 40], np.int32)
    picks = {rm: run_op(lambda a, rm=rm: ops.resize_nearest(a, [3], round_mode=rm), x).tolist() for rm in range(4)}
    assert picks == {HALF_DOWN: [10, 20, 40], HALF_UP: [10, 30, 40], FLOOR: [10, 20, 30], CEIL: [20, 30, 40]}


def test_output_size_one_half_pixel_vs_half_pixel_1d_and_align_corners(rng):
    x = rand(rng, [2, 5])
    # half_pixel maps the single output to the center (source 2.0); half_pixel_1D and align_corners to 0.
    close(run_op(lambda a: ops.resize_linear(a, [2, 1], HALF_PIXEL), x), x[:, 2:3])
    close(run_op(lambda a: ops.resize_linear(a, [2, 1], HALF_PIXEL_1D), x), x[:, :1])
    close(run_op(lambda a: ops.resize_linear(a, [2, 1], ALIGN_CORNERS), x), x[:, :1])
    np.testing.assert_array_equal(run_op(lambda a: ops.resize_nearest(a, [2, 1], HALF_PIXEL_1D), x), x[:, :1])


@pytest.mark.parametrize(
    "shape,size",
    [
        ([1, 2, 5, 4], [1, 2, 9, 7]),
        ([2, 1, 9, 8], [2, 1, 4, 3]),
        ([1, 3, 4, 4], [1, 3, 4, 10]),
        ([2, 3, 4, 4], [3, 2, 6, 5]),
    ],
)
def test_resize_bicubic(rng, shape, size):
    x = rand(rng, shape)
    want = ref_bicubic(x, size)
    close(eager(F.resize_bicubic, x, size), want)
    close(run_op(lambda a: ops.resize_bicubic(a, size), x), want)


def test_resize_picks_each_op_with_its_defaults(rng):
    x = rand(rng, [1, 2, 5, 4])
    size = [1, 2, 7, 3]
    cases = [
        (InterpolationMode.BILINEAR, ref_linear(x, size)),
        (InterpolationMode.NEAREST, ref_nearest(x, size)),
        (InterpolationMode.BICUBIC, ref_bicubic(x, size)),
    ]
    for mode, want in cases:
        close(run_op(lambda a, mode=mode: ops.resize(a, size, mode), x), want)
        close(eager(F.resize, x, size, mode), want)


def test_identity_sizes_copy_the_input(rng):
    x = rand(rng, [2, 3, 4, 5])
    for fn in (ops.resize_linear, ops.resize_nearest, ops.resize_bicubic):
        np.testing.assert_array_equal(run_op(lambda a, fn=fn: fn(a, [2, 3, 4, 5]), x), x)


def test_dtypes(rng):
    # Half precision interpolates in float32 and rounds once at the end.
    xb = rand(rng, [1, 1, 4, 6], DType.bfloat16)
    got = run_op(lambda a: ops.resize_linear(a, [1, 1, 7, 3], 1), xb)
    assert got.dtype == xb.dtype
    close(got, ref_linear(xb.astype(np.float32), [1, 1, 7, 3], ALIGN_CORNERS), 2e-2)
    xh = rand(rng, [1, 1, 4, 4], np.float16)
    got = run_op(lambda a: ops.resize_bicubic(a, [1, 1, 6, 6]), xh)
    assert got.dtype == np.float16
    close(got, ref_bicubic(xh, [1, 1, 6, 6]), 1e-2)
    # Integers interpolate in float32 and round to the nearest value; nearest copies any dtype exactly.
    xi = rng.integers(0, 100, [3, 3]).astype(np.uint8)
    got = run_op(lambda a: ops.resize_linear(a, [5, 6], ASYMMETRIC), xi)
    assert got.dtype == np.uint8
    # A nearest integer to the reference (either one where it is a tie like 49.5).
    assert np.all(np.abs(got - ref_linear(xi, [5, 6], ASYMMETRIC)) <= 0.5 + 1e-4)
    xbool = rng.random([3, 4]) < 0.5
    np.testing.assert_array_equal(
        run_op(lambda a: ops.resize_nearest(a, [5, 2], 2, 2), xbool), ref_nearest(xbool, [5, 2], 2, 2)
    )


def test_symbolic_dims(rng):
    with Graph("resize_symbolic", input_types=[TensorType(DType.float32, ["batch", 2, 4, 4])]) as g:
        x = g.inputs[0].tensor
        lin = ops.resize_linear(x, ["batch", 2, 8, 6], coordinate_transform_mode=1)
        near = ops.resize_nearest(x, ["batch", 2, 3, 5], round_mode=1)
        cub = ops.resize_bicubic(x, ["batch", 2, 6, 2])
        assert [str(d) for d in lin.shape] == ["batch", "2", "8", "6"]
        assert [str(d) for d in cub.shape] == ["batch", "2", "6", "2"]
        assert lin.dtype == DType.float32
        g.output(lin, near, cub)
    model = InferenceSession().load(g)
    for batch in (1, 3):
        a = rand(rng, [batch, 2, 4, 4])
        lin, near, cub = (o.to_numpy() for o in model.execute(a))
        close(lin, ref_linear(a, [batch, 2, 8, 6], ALIGN_CORNERS))
        np.testing.assert_array_equal(near, ref_nearest(a, [batch, 2, 3, 5], HALF_PIXEL, HALF_UP))
        close(cub, ref_bicubic(a, [batch, 2, 6, 2]))


# ─── gradients ────────────────────────────────────────────────────────────


def _matrix(n_in, n_out, taps_of):
    m = np.zeros((n_out, n_in))
    for o, taps in enumerate(taps_of(n_in, n_out)):
        for j, w in taps:
            m[o, j] += w
    return m


def test_grad_through_resize_linear_antialias(rng):
    # resize is linear in x: d/dx sum(resize(x) * g) = Mh^T g Mw, with each axis' weight matrix M.
    x = rand(rng, [1, 1, 9, 4])
    g = rand(rng, [1, 1, 4, 6])
    mh = _matrix(9, 4, lambda n, m: linear_taps(n, m, HALF_PIXEL, True))
    mw = _matrix(4, 6, lambda n, m: linear_taps(n, m, HALF_PIXEL, False))
    want = mh.T @ g[0, 0] @ mw

    def loss(a):
        return jnp.sum(ops.resize_linear(a, [1, 1, 4, 6], antialias=True) * g)

    close(jax.grad(loss)(x)[0, 0], want)
    close(jax.jit(jax.grad(loss))(x)[0, 0], want)


def test_grad_through_resize_bicubic_and_nearest(rng):
    x = rand(rng, [1, 1, 3, 5])
    g = rand(rng, [1, 1, 6, 2])
    cubic = _matrix(3, 6, cubic_taps).T @ g[0, 0] @ _matrix(5, 2, cubic_taps)
    close(jax.grad(lambda a: jnp.sum(ops.resize_bicubic(a, [1, 1, 6, 2]) * g))(x)[0, 0], cubic)
    near = lambda n, m: nearest_taps(n, m, ASYMMETRIC, FLOOR)  # noqa: E731
    want = _matrix(3, 6, near).T @ g[0, 0] @ _matrix(5, 2, near)
    close(jax.grad(lambda a: jnp.sum(ops.resize_nearest(a, [1, 1, 6, 2], 2, 2) * g))(x)[0, 0], want)


# ─── errors ───────────────────────────────────────────────────────────────


def test_errors_name_the_op_and_what_is_expected():
    types = [TensorType(DType.float32, [1, 3, 8, 8]), TensorType(DType.float32, [4, 4, 2])]
    with Graph("resize_errors", input_types=types) as g:
        x, r3 = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError, match=r"resize_linear: coordinate_transform_mode must be 0-3, got 4 \(0 half_pixel"
        ):
            ops.resize_linear(x, [1, 3, 4, 4], coordinate_transform_mode=4)
        with pytest.raises(ValueError, match="resize_nearest: coordinate_transform_mode must be 0-3, got 'half_pixel'"):
            ops.resize_nearest(x, [1, 3, 4, 4], coordinate_transform_mode="half_pixel")
        with pytest.raises(ValueError, match=r"resize_nearest: round_mode must be 0-3, got -1 \(0 HalfDown"):
            ops.resize_nearest(x, [1, 3, 4, 4], round_mode=-1)
        with pytest.raises(
            ValueError,
            match=(
                r"resize_linear: size must have the same rank as input \(4\), got 2: "
                r"\[16, 16\] for input float32\[1, 3, 8, 8\]"
            ),
        ):
            ops.resize_linear(x, [16, 16])
        with pytest.raises(ValueError, match=r"resize_nearest: size must have the same rank as input \(3\), got 4"):
            ops.resize_nearest(r3, [1, 4, 4, 2])
        with pytest.raises(
            ValueError, match=r"resize_bicubic requires rank-4 \(NCHW\) input, got rank 3 \(float32\[4, 4, 2\]\)"
        ):
            ops.resize_bicubic(r3, [8, 8, 2])
        with pytest.raises(
            ValueError, match=r"resize_bicubic: size must have 4 elements for NCHW format, got 2: \[16, 16\]"
        ):
            ops.resize_bicubic(x, [16, 16])
        with pytest.raises(ValueError, match=r"resize_linear: output dims must be positive, got size \[1, 3, 0, 8\]"):
            ops.resize_linear(x, [1, 3, 0, 8])
        with pytest.raises(ValueError, match="resize_bicubic: output dims must be positive"):
            ops.resize_bicubic(x, [1, 3, -2, 8])
        with pytest.raises(TypeError, match="resize_nearest: size must be a sequence of dims"):
            ops.resize_nearest(x, 16)
        with pytest.raises(
            ValueError,
            match=r"resize: Input tensor must have rank 4 \(NCHW format\) for resize operation, but got rank 3",
        ):
            ops.resize(r3, [4, 4, 2, 2])
    # Eager tensors are checked the same way, before anything runs.
    t = Tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"resize_linear: size must have the same rank as input \(2\), got 1"):
        F.resize_linear(t, [4])
    with pytest.raises(ValueError, match="resize_bicubic requires rank-4"):
        F.resize_bicubic(t, [1, 1, 4, 4])
    with pytest.raises(ValueError, match="resize_nearest: round_mode must be 0-3, got 7"):
        F.resize_nearest(t, [4, 4], round_mode=7)
