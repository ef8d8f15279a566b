"""conv2d/conv3d/conv2d_transpose, pooling, fold, resize and irfft against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowering.ops.nn import Normalization
from maxfx.dtype import DType
from maxfx.graph import ConvInputLayout, FilterLayout, Graph, TensorType, ops
from maxfx.graph.ops import InterpolationMode
from tests.ops.harness import rand, run_op

# ─── numpy references (written from the definitions, independent of lax) ──


def np_conv(x, f, stride, dilation, padding, groups=1, bias=None):
    """Channels-last conv; f is (*kernel, C_in/groups, C_out); padding (lo, hi) per spatial dim."""
    x, f = x.astype(np.float64), f.astype(np.float64)
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0)] + [(padding[2 * i], padding[2 * i + 1]) for i in range(nd)] + [(0, 0)])
    kernel = f.shape[:nd]
    out_sp = [(xp.shape[1 + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    cin_g, cout = f.shape[-2], f.shape[-1]
    cout_g = cout // groups
    out = np.zeros((x.shape[0], *out_sp, cout))
    for idx in np.ndindex(*kernel):
        sl = tuple(
            slice(idx[i] * dilation[i], idx[i] * dilation[i] + stride[i] * (out_sp[i] - 1) + 1, stride[i])
            for i in range(nd)
        )
        patch = xp[(slice(None), *sl, slice(None))]
        for g in range(groups):
            out[..., g * cout_g : (g + 1) * cout_g] += (
                patch[..., g * cin_g : (g + 1) * cin_g] @ f[idx][:, g * cout_g : (g + 1) * cout_g]
            )
    return out if bias is None else out + bias


def np_conv_transpose(x, f, stride, dilation, padding, output_paddings, bias=None):
    """NHWC transposed conv by scattering: f is RSCF (kH, kW, C_out, C_in)."""
    x, f = x.astype(np.float64), f.astype(np.float64)
    n, h, w, _ = x.shape
    kh, kw, cout, _ = f.shape
    sizes = [
        (s - 1) * st + d * (k - 1) + 1 + op
        for s, st, d, k, op in zip((h, w), stride, dilation, (kh, kw), output_paddings)
    ]
    full = np.zeros((n, *sizes, cout))
    for a in range(kh):
        for b in range(kw):
            rows = slice(a * dilation[0], a * dilation[0] + stride[0] * (h - 1) + 1, stride[0])
            cols = slice(b * dilation[1], b * dilation[1] + stride[1] * (w - 1) + 1, stride[1])
            full[:, rows, cols, :] += x @ f[a, b].T
    oh = (h - 1) * stride[0] - padding[0] - padding[1] + dilation[0] * (kh - 1) + 1 + output_paddings[0]
    ow = (w - 1) * stride[1] - padding[2] - padding[3] + dilation[1] * (kw - 1) + 1 + output_paddings[1]
    out = full[:, padding[0] : padding[0] + oh, padding[2] : padding[2] + ow]
    return out if bias is None else out + bias


def np_pool(x, kernel, stride, dilation, padding, ceil_mode, mode, count_boundary=True):
    x = x.astype(np.float64)
    n, h, w, c = x.shape
    outs = []
    for size, k, s, d, p in zip((h, w), kernel, stride, dilation, padding):
        span = size + 2 * p - d * (k - 1) - 1
        outs.append((-(-span // s) if ceil_mode else span // s) + 1)
    out = np.zeros((n, *outs, c))
    for i in range(outs[0]):
        for j in range(outs[1]):
            rows = i * stride[0] - padding[0] + np.arange(kernel[0]) * dilation[0]
            cols = j * stride[1] - padding[1] + np.arange(kernel[1]) * dilation[1]
            rows, cols = rows[(rows >= 0) & (rows < h)], cols[(cols >= 0) & (cols < w)]
            win = x[:, rows][:, :, cols].reshape(n, -1, c)
            if mode == "max":
                out[:, i, j] = win.max(axis=1)
            else:
                div = kernel[0] * kernel[1] if count_boundary else max(win.shape[1], 1)
                out[:, i, j] = win.sum(axis=1) / div
    return out


def np_fold(x, output_size, kernel, stride, dilation, padding):
    n, ckk, _ = x.shape
    kh, kw = kernel
    c = ckk // (kh * kw)
    h, w = output_size[0] + 2 * padding[0], output_size[1] + 2 * padding[1]
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, c, h, w))
    for by in range(oh):
        for bx in range(ow):
            for ch in range(c):
                for i in range(kh):
                    for j in range(kw):
                        out[:, ch, by * stride[0] + i * dilation[0], bx * stride[1] + j * dilation[1]] += x[
                            :, ch * kh * kw + i * kw + j, by * ow + bx
                        ]
    return out[:, :, padding[0] : padding[0] + output_size[0], padding[1] : padding[1] + output_size[1]]


def np_roi_align(x, rois, oh, ow, scale, ratio, aligned, mode):
    """MAX's roi_align_nhwc kernel, loop for loop (float32 coordinates)."""
    f = np.float32
    _, h, w, c = x.shape
    out = np.zeros((len(rois), oh, ow, c), x.dtype)
    off = f(0.5 if aligned else 0.0)
    for ri, roi in enumerate(rois.astype(f)):
        b = int(roi[0])
        sw, sh, ew, eh = (roi[k] * f(scale) - off for k in (1, 2, 3, 4))
        rh, rw = (eh - sh, ew - sw) if aligned else (max(eh - sh, f(1)), max(ew - sw, f(1)))
        bh, bw = f(rh / f(oh)), f(rw / f(ow))
        gh = int(ratio) if ratio > 0 else int(np.ceil(bh))
        gw = int(ratio) if ratio > 0 else int(np.ceil(bw))
        count = max(gh * gw, 1)
        for ph in range(oh):
            for pw in range(ow):
                acc = np.zeros(c, x.dtype) if mode == "AVG" else np.full(c, -np.inf, x.dtype)
                for iy in range(gh):
                    for ix in range(gw):
                        y = f(sh + f(ph) * bh + (f(iy) + f(0.5)) * bh / f(gh))
                        xx = f(sw + f(pw) * bw + (f(ix) + f(0.5)) * bw / f(gw))
                        if not (-1 <= y <= h and -1 <= xx <= w):
                            pts = [(0, 0, 0.0)] * 4
                        else:
                            y, xx = max(y, f(0)), max(xx, f(0))
                            yl, xl = min(int(y), h - 1), min(int(xx), w - 1)
                            yh, xh = min(yl + 1, h - 1), min(xl + 1, w - 1)
                            ly, lx = y - f(yl), xx - f(xl)
                            hy, hx = f(1) - ly, f(1) - lx
                            pts = [(yl, xl, hy * hx), (yl, xh, hy * lx), (yh, xl, ly * hx), (yh, xh, ly * lx)]
                        for py, px, wt in pts:
                            v = x.dtype.type(wt) * x[b, py, px]
                            acc = acc + v if mode == "AVG" else np.maximum(acc, v)
                out[ri, ph, pw] = acc / count if mode == "AVG" else acc
    return out


def np_resize(x, out_hw, mode):
    """Per-pixel half-pixel resize (MAX/PyTorch formulas)."""
    n, c, h, w = x.shape
    oh, ow = out_hw

    def src(i, in_size, out_size):
        return (i + 0.5) * (in_size / out_size) - 0.5

    def cubic(t, a=-0.75):
        t = abs(t)
        if t <= 1:
            return (a + 2) * t**3 - (a + 3) * t**2 + 1
        if t < 2:
            return a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a
        return 0.0

    def taps(i, in_size, out_size):
        s = src(i, in_size, out_size)
        if mode == "nearest":
            return [(min(max(int(np.ceil(s - 0.5)), 0), in_size - 1), 1.0)]
        s0 = int(np.floor(s))
        t = s - s0
        if mode == "bilinear":
            return [(min(max(s0, 0), in_size - 1), 1 - t), (min(max(s0 + 1, 0), in_size - 1), t)]
        return [(min(max(s0 - 1 + k, 0), in_size - 1), cubic(k - 1 - t)) for k in range(4)]

    out = np.zeros((n, c, oh, ow))
    x = x.astype(np.float64)
    for i in range(oh):
        for j in range(ow):
            for yi, wy in taps(i, h, oh):
                for xj, wx in taps(j, w, ow):
                    out[:, :, i, j] += wy * wx * x[:, :, yi, xj]
    return out


def assert_close(got, want, tol):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


# ─── conv2d / conv3d ──────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "xshape,fshape,kwargs",
    [
        ([2, 6, 5, 3], [3, 3, 3, 4], {}),
        ([1, 9, 8, 2], [3, 2, 2, 5], dict(stride=(2, 1), dilation=(1, 2), padding=(1, 0, 2, 1))),
        ([2, 5, 5, 4], [2, 2, 2, 6], dict(groups=2, padding=(1, 1, 1, 1))),
    ],
)
def test_conv2d_matches_numpy(rng, xshape, fshape, kwargs):
    x, f, b = rand(rng, xshape), rand(rng, fshape), rand(rng, [fshape[-1]])
    kw = {"stride": (1, 1), "dilation": (1, 1), "padding": (0, 0, 0, 0), "groups": 1, **kwargs}
    got = run_op(lambda a, w, c: ops.conv2d(a, w, bias=c, **kwargs), x, f, b)
    assert_close(got, np_conv(x, f, kw["stride"], kw["dilation"], kw["padding"], kw["groups"], b), 1e-4)


def test_conv2d_layouts(rng):
    """NCHW input (output NCHW), FCRS and CFRS filters give the NHWC/RSCF result, transposed."""
    x, f = rand(rng, [2, 7, 6, 3]), rand(rng, [3, 2, 3, 4])
    want = np_conv(x, f, (2, 1), (1, 1), (1, 0, 0, 1))
    kw = dict(stride=(2, 1), padding=(1, 0, 0, 1))
    got_nchw = run_op(
        lambda a, w: ops.conv2d(a, w, input_layout=ConvInputLayout.NCHW, filter_layout=FilterLayout.FCRS, **kw),
        x.transpose(0, 3, 1, 2),
        f.transpose(3, 2, 0, 1),
    )
    assert_close(got_nchw, want.transpose(0, 3, 1, 2), 1e-4)
    got_cfrs = run_op(lambda a, w: ops.conv2d(a, w, filter_layout="CFRS", **kw), x, f.transpose(2, 3, 0, 1))
    assert_close(got_cfrs, want, 1e-4)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (DType.bfloat16, 5e-2), (np.float16, 5e-3), (np.int32, 0)])
def test_conv2d_dtypes(rng, dtype, tol):
    x, f = rand(rng, [1, 5, 5, 3], dtype), rand(rng, [2, 2, 3, 2], dtype)
    got = run_op(lambda a, w: ops.conv2d(a, w, padding=(1, 0, 0, 1)), x, f)
    assert got.dtype == x.dtype
    want = np_conv(x, f, (1, 1), (1, 1), (1, 0, 0, 1))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * 8)


def test_conv2d_symbolic_batch(rng):
    f = rand(rng, [3, 3, 2, 3])
    for batch in (1, 3):
        x = rand(rng, [batch, 6, 6, 2])
        got = run_op(
            lambda a, w: ops.conv2d(a, w, stride=(2, 2), padding=(1, 1, 1, 1)),
            x,
            f,
            symbolic=[["batch", None, None, None], None],
        )
        assert_close(got, np_conv(x, f, (2, 2), (1, 1), (1, 1, 1, 1)), 1e-4)


def test_conv3d_matches_numpy(rng):
    x, f, b = rand(rng, [1, 4, 5, 4, 2]), rand(rng, [2, 3, 2, 2, 3]), rand(rng, [3])
    kw = dict(stride=(1, 2, 1), dilation=(1, 1, 2), padding=(1, 0, 1, 1, 0, 1))
    got = run_op(lambda a, w, c: ops.conv3d(a, w, bias=c, **kw), x, f, b)
    assert_close(got, np_conv(x, f, kw["stride"], kw["dilation"], kw["padding"], 1, b), 1e-4)
    got_t = run_op(
        lambda a, w: ops.conv3d(a, w, input_layout=ConvInputLayout.NCHW, filter_layout=FilterLayout.FCQRS, groups=2),
        x.transpose(0, 4, 1, 2, 3),
        rand(rng, [4, 1, 2, 2, 2]),
    )
    assert got_t.shape == (1, 4, 3, 4, 3)


# ─── conv2d_transpose ─────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(stride=(2, 2)),
        dict(stride=(2, 3), padding=(1, 0, 1, 2), output_paddings=(1, 2)),
        dict(stride=(1, 2), dilation=(2, 1), padding=(1, 1, 0, 0), output_paddings=(1, 0)),
    ],
)
def test_conv2d_transpose_matches_numpy(rng, kwargs):
    x, f, b = rand(rng, [2, 3, 4, 3]), rand(rng, [3, 2, 5, 3]), rand(rng, [5])
    kw = {"stride": (1, 1), "dilation": (1, 1), "padding": (0, 0, 0, 0), "output_paddings": (0, 0), **kwargs}
    got = run_op(lambda a, w, c: ops.conv2d_transpose(a, w, bias=c, **kwargs), x, f, b)
    assert_close(
        got, np_conv_transpose(x, f, kw["stride"], kw["dilation"], kw["padding"], kw["output_paddings"], b), 1e-4
    )


def test_conv2d_transpose_pytorch_layouts(rng):
    """NCHW input with a CFRS filter: PyTorch's ConvTranspose2d (in, out, kH, kW) weight."""
    x, f = rand(rng, [1, 3, 3, 2]), rand(rng, [2, 2, 4, 2])
    want = np_conv_transpose(x, f, (2, 2), (1, 1), (0, 0, 0, 0), (0, 0))
    got = run_op(
        lambda a, w: ops.conv2d_transpose(
            a, w, stride=(2, 2), input_layout=ConvInputLayout.NCHW, filter_layout=FilterLayout.CFRS
        ),
        x.transpose(0, 3, 1, 2),
        f.transpose(3, 2, 0, 1),
    )
    assert_close(got, want.transpose(0, 3, 1, 2), 1e-4)


def test_conv_transpose_is_the_input_gradient_of_conv(rng):
    """Under jax.grad: d/dx sum(conv2d(x, f) * g) == conv2d_transpose(g, f) with the same geometry."""
    x, f = jnp.asarray(rand(rng, [1, 7, 6, 2])), jnp.asarray(rand(rng, [3, 3, 2, 4]))
    geo = dict(stride=(2, 2), padding=(1, 0, 1, 1))
    y = ops.conv2d(x, f, **geo)
    g = jnp.asarray(rand(rng, list(y.shape)))
    grad = jax.jit(jax.grad(lambda a: jnp.sum(ops.conv2d(a, f, **geo) * g)))(x)
    # conv2d maps 7 rows and 6 cols to 3x3; without output padding the transpose gives back 6x5.
    back = ops.conv2d_transpose(g, f, output_paddings=(1, 1), **geo)
    assert back.shape == x.shape
    np.testing.assert_allclose(np.asarray(grad), np.asarray(back), rtol=1e-4, atol=1e-4)


# ─── pooling ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "kernel,stride,dilation,padding,ceil_mode",
    [
        ((2, 2), 2, 1, 0, False),
        ((3, 2), (2, 1), 1, (1, 0), True),
        ((2, 3), 2, (2, 1), (1, 1), False),
        ((3, 3), 2, 1, 1, True),
    ],
)
def test_pools_match_numpy(rng, kernel, stride, dilation, padding, ceil_mode):
    x = rand(rng, [2, 7, 6, 3])
    geo = dict(stride=stride, dilation=dilation, padding=padding, ceil_mode=ceil_mode)
    t = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    ref = dict(stride=t(stride), dilation=t(dilation), padding=t(padding), ceil_mode=ceil_mode)
    mx, avg_in, avg_ex = run_op(
        lambda a: (
            ops.max_pool2d(a, kernel, **geo),
            ops.avg_pool2d(a, kernel, **geo),
            ops.avg_pool2d(a, kernel, count_boundary=False, **geo),
        ),
        x,
    )
    assert_close(mx, np_pool(x, kernel, mode="max", **ref), 1e-6)
    assert_close(avg_in, np_pool(x, kernel, mode="avg", **ref), 1e-5)
    assert_close(avg_ex, np_pool(x, kernel, mode="avg", count_boundary=False, **ref), 1e-5)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, DType.bfloat16])
def test_max_pool_dtypes(rng, dtype):
    x = rand(rng, [1, 5, 4, 2], dtype)
    got = run_op(lambda a: ops.max_pool2d(a, (2, 2), padding=1, ceil_mode=True), x)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.astype(np.float64), np_pool(x, (2, 2), (1, 1), (1, 1), (1, 1), True, "max"))


def test_avg_pool_half_and_symbolic(rng):
    x = rand(rng, [1, 6, 6, 2], np.float16)
    got = run_op(lambda a: ops.avg_pool2d(a, (2, 2), stride=2), x)
    assert got.dtype == np.float16
    assert_close(got, np_pool(x, (2, 2), (2, 2), (1, 1), (0, 0), False, "avg"), 2e-3)
    for h in (4, 7):
        x = rand(rng, [2, h, 5, 3])
        got = run_op(lambda a: ops.max_pool2d(a, (2, 2), stride=2), x, symbolic=[["n", "h", None, None]])
        assert_close(got, np_pool(x, (2, 2), (2, 2), (1, 1), (0, 0), False, "max"), 0)


# ─── fold ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "output_size,kernel,stride,dilation,padding",
    [((4, 5), (2, 2), 1, 1, 0), ((6, 5), (3, 2), (2, 1), (1, 2), (1, 0)), ((4, 4), (2, 2), 2, 1, 0)],
)
def test_fold_matches_numpy(rng, output_size, kernel, stride, dilation, padding):
    t = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    s, d, p = t(stride), t(dilation), t(padding)
    blocks = [(output_size[i] + 2 * p[i] - d[i] * (kernel[i] - 1) - 1) // s[i] + 1 for i in range(2)]
    x = rand(rng, [2, 3 * kernel[0] * kernel[1], blocks[0] * blocks[1]])
    got = run_op(lambda a: ops.fold(a, output_size, kernel, stride=stride, dilation=dilation, padding=padding), x)
    assert_close(got, np_fold(x, output_size, kernel, s, d, p), 1e-5)


def test_fold_bool_is_logical_or(rng):
    # MAX accepts bool blocks; overlapping True blocks stay True (numpy: the int sum is nonzero).
    x = rng.random([1, 4, 9]) < 0.3
    got = run_op(lambda a: ops.fold(a, (4, 4), (2, 2)), x)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, np_fold(x.astype(np.int32), (4, 4), (2, 2), (1, 1), (1, 1), (0, 0)) != 0)


def test_fold_symbolic_batch_and_errors(rng):
    x = rand(rng, [3, 8, 9])
    got = run_op(lambda a: ops.fold(a, (4, 4), (2, 2)), x, symbolic=[["batch", None, None]])
    assert_close(got, np_fold(x, (4, 4), (2, 2), (1, 1), (1, 1), (0, 0)), 1e-5)
    with Graph(
        "fold_err", input_types=[TensorType(DType.float32, [1, 10, 9]), TensorType(DType.float32, [1, 8, 7])]
    ) as g:
        a, b = g.inputs
        with pytest.raises(ValueError, match=r"fold.*multiple of the product of the total kernel size"):
            ops.fold(a, (4, 4), (2, 2))
        with pytest.raises(ValueError, match=r"fold.*must match the calculated number of blocks"):
            ops.fold(b, (4, 4), (2, 2))
        with pytest.raises(ValueError, match="fold.*rank"):
            ops.fold(ops.reshape(b, [56]), (4, 4), (2, 2))


# ─── resize ───────────────────────────────────────────────────────────────


@pytest.mark.parametrize("mode", list(InterpolationMode))
@pytest.mark.parametrize("out_hw", [(9, 7), (3, 2)])
def test_resize_matches_numpy(rng, mode, out_hw):
    x = rand(rng, [1, 2, 5, 4])
    got = run_op(lambda a: ops.resize(a, [1, 2, *out_hw], interpolation=mode), x)
    assert got.shape == (1, 2, *out_hw)
    assert_close(got, np_resize(x, out_hw, mode.value), 1e-5)


def test_resize_identity_default_and_dtypes(rng):
    x = rand(rng, [2, 3, 4, 5])
    for mode in InterpolationMode:
        assert_close(run_op(lambda a, mode=mode: ops.resize(a, [2, 3, 4, 5], mode), x), x.astype(np.float64), 1e-6)
    # The default is BILINEAR; a constant image stays constant under every mode.
    c = np.full((1, 1, 3, 3), 2.5, np.float32)
    assert_close(run_op(lambda a: ops.resize(a, (1, 1, 8, 5)), c), np.full((1, 1, 8, 5), 2.5), 1e-6)
    xb = rand(rng, [1, 1, 4, 4], DType.bfloat16)
    got = run_op(lambda a: ops.resize(a, [1, 1, 6, 6], InterpolationMode.BICUBIC), xb)
    assert got.dtype == xb.dtype
    assert_close(got, np_resize(xb.astype(np.float32), (6, 6), "bicubic"), 5e-2)
    xi = rand(rng, [1, 1, 3, 3], np.int32)
    np.testing.assert_array_equal(
        run_op(lambda a: ops.resize(a, [1, 1, 6, 2], "nearest"), xi), np_resize(xi, (6, 2), "nearest")
    )


def test_resize_any_dim_and_integer_dtypes(rng):
    # As in MAX (ONNX Resize), N and C may change too: each changed dim is interpolated on its own.
    x = rand(rng, [1, 3, 4, 4])
    got = run_op(lambda a: ops.resize(a, [2, 5, 4, 4], InterpolationMode.NEAREST), x)
    idx_c = np.clip(np.ceil((np.arange(5) + 0.5) * 3 / 5 - 0.5 - 0.5), 0, 2).astype(int)
    np.testing.assert_array_equal(got, x[[0, 0]][:, idx_c])
    # Integers interpolate in float32 and round to the nearest value of the dtype.
    xi = rng.integers(0, 100, [1, 1, 3, 3]).astype(np.int32)
    got = run_op(lambda a: ops.resize(a, [1, 1, 6, 6], InterpolationMode.BILINEAR), xi)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.round(np_resize(xi.astype(np.float32), (6, 6), "bilinear")).astype(np.int32))


def test_resize_symbolic_batch(rng):
    for batch in (1, 2):
        x = rand(rng, [batch, 2, 4, 4])
        got = run_op(
            lambda a: ops.resize(a, ["batch", 2, 8, 6], InterpolationMode.BICUBIC),
            x,
            symbolic=[["batch", None, None, None]],
        )
        assert_close(got, np_resize(x, (8, 6), "bicubic"), 1e-5)


# ─── irfft ────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_irfft_matches_numpy(rng, norm):
    re, im = rand(rng, [3, 6]), rand(rng, [3, 6])
    spec = np.stack([re, im], axis=-1)
    got_c, got_r, got_n, got_ax = run_op(
        lambda a, b, c: (
            ops.irfft(a, input_is_complex=True, normalization=norm),
            ops.irfft(b, normalization=norm),
            ops.irfft(b, n=7, normalization=norm),
            ops.irfft(c, n=4, axis=0, normalization=norm),
        ),
        spec,
        re,
        re.T.copy(),
    )
    assert_close(got_c, np.fft.irfft(re + 1j * im, norm=norm), 1e-5)
    assert_close(got_r, np.fft.irfft(re.astype(np.complex128), norm=norm), 1e-5)
    assert_close(got_n, np.fft.irfft(re.astype(np.complex128), n=7, norm=norm), 1e-5)
    assert_close(got_ax, np.fft.irfft(re.T.astype(np.complex128), n=4, axis=0, norm=norm), 1e-5)


def test_irfft_dtypes_enum_and_symbolic(rng):
    x = rand(rng, [2, 5], np.float64)
    got = run_op(lambda a: ops.irfft(a, n=12, normalization=Normalization.ORTHO), x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, np.fft.irfft(x, n=12, norm="ortho"), rtol=1e-12, atol=1e-12)
    xb = rand(rng, [2, 5], DType.bfloat16)
    got = run_op(lambda a: ops.irfft(a), xb)
    assert got.dtype == xb.dtype
    assert_close(got, np.fft.irfft(xb.astype(np.float64)), 3e-2)
    for batch in (1, 4):
        x = rand(rng, [batch, 5, 2])
        got = run_op(lambda a: ops.irfft(a, input_is_complex=True), x, symbolic=[["batch", None, None]])
        assert_close(got, np.fft.irfft(x[..., 0] + 1j * x[..., 1]), 1e-5)


# ─── traced use (jit / vmap) ──────────────────────────────────────────────


def test_ops_under_jit_and_vmap(rng):
    x, f = rand(rng, [4, 6, 6, 2]), rand(rng, [3, 3, 2, 3])
    got = jax.jit(lambda a, w: ops.conv2d(a, w, padding=(1, 1, 1, 1)))(x, f)
    assert_close(got, np_conv(x, f, (1, 1), (1, 1), (1, 1, 1, 1)), 1e-4)
    pooled = jax.vmap(lambda a: ops.max_pool2d(a, (2, 2), stride=2))(x[:, None])
    assert_close(pooled[:, 0], np_pool(x, (2, 2), (2, 2), (1, 1), (0, 0), False, "max"), 0)


# ─── errors ───────────────────────────────────────────────────────────────


def test_conv_errors():
    types = [
        TensorType(DType.float32, [1, 5, 5, 4]),
        TensorType(DType.float32, [3, 3, 4, 6]),
        TensorType(DType.float32, [3, 3, 4]),
        TensorType(DType.float32, [3, 3, 3, 6]),
        TensorType(DType.float32, [5]),
        TensorType(DType.int32, [3, 3, 4, 6]),
    ]
    with Graph("conv_err", input_types=types) as g:
        x, f, f3, fbad, b5, fi = g.inputs
        with pytest.raises(ValueError, match=r"conv2d: filter must have rank 4.*float32\[3, 3, 4\]"):
            ops.conv2d(x, f3)
        with pytest.raises(ValueError, match=r"conv2d: input must have rank 4"):
            ops.conv2d(f3, f)
        with pytest.raises(
            ValueError, match=r"conv2d: input channels do not match.*float32\[1, 5, 5, 4\].*float32\[3, 3, 3, 6\]"
        ):
            ops.conv2d(x, fbad)
        with pytest.raises(ValueError, match=r"conv2d: bias must have shape \[6\]"):
            ops.conv2d(x, f, bias=b5)
        with pytest.raises(ValueError, match=r"conv2d: input channels do not match"):
            ops.conv2d(x, f, groups=2)
        with pytest.raises(ValueError, match="conv2d: unsupported filter_layout"):
            ops.conv2d(x, f, filter_layout=FilterLayout.QRSCF)
        with pytest.raises(ValueError, match="conv2d: padding must have 4 values"):
            ops.conv2d(x, f, padding=(1, 1))
        with pytest.raises(ValueError, match="conv2d.*smaller than the dilated window"):
            ops.conv2d(x, f, dilation=(3, 3))
        with pytest.raises(ValueError, match="conv2d: stride must be >= 1"):
            ops.conv2d(x, f, stride=(0, 1))
        with pytest.raises(ValueError, match="conv2d.*incompatible input dtypes"):
            ops.conv2d(x, fi)
        with pytest.raises(ValueError, match="conv3d: input must have rank 5"):
            ops.conv3d(x, f)
        with pytest.raises(ValueError, match="conv2d_transpose: output padding must be smaller"):
            ops.conv2d_transpose(x, ops.permute(f, [0, 1, 3, 2]), output_paddings=(1, 0))
        with pytest.raises(ValueError, match="conv2d_transpose: input channels do not match"):
            ops.conv2d_transpose(x, f)
        with pytest.raises(ValueError, match="conv2d_transpose: unsupported filter_layout"):
            ops.conv2d_transpose(x, f, filter_layout=FilterLayout.FCRS)


def test_pool_resize_irfft_errors():
    types = [
        TensorType(DType.float32, [1, 4, 4, 2]),
        TensorType(DType.int32, [1, 4, 4, 2]),
        TensorType(DType.float32, [4, 4]),
        TensorType(DType.float32, [4, "n"]),
    ]
    with Graph("misc_err", input_types=types) as g:
        x, xi, m, msym = g.inputs
        with pytest.raises(ValueError, match="max_pool2d: input must have rank 4"):
            ops.max_pool2d(m, (2, 2))
        with pytest.raises(ValueError, match="avg_pool2d: input must have a floating-point dtype"):
            ops.avg_pool2d(xi, (2, 2))
        with pytest.raises(ValueError, match="max_pool2d.*output would be empty"):
            ops.max_pool2d(x, (5, 5))
        with pytest.raises(TypeError, match="max_pool2d: kernel_size must be a pair"):
            ops.max_pool2d(x, 2)
        with pytest.raises(
            ValueError,
            match=r"resize: Input tensor must have rank 4 \(NCHW format\) for resize operation, but got rank",
        ):
            ops.resize(m, [1, 1, 2, 2])
        with pytest.raises(
            ValueError, match=r"resize: shape must have 4 elements for NCHW format \(batch, channels, height, width\)"
        ):
            ops.resize(x, [8, 8])
        with pytest.raises(ValueError, match="resize: output dims must be positive"):
            ops.resize(x, [1, 0, 8, 8])
        with pytest.raises(ValueError, match="resize: interpolation must be a InterpolationMode"):
            ops.resize(x, [1, 4, 8, 8], interpolation="area")
        with pytest.raises(ValueError, match="irfft: Invalid normalization: none"):
            ops.irfft(m, normalization="none")
        with pytest.raises(ValueError, match="irfft: input_is_complex=True needs a trailing dim of 2"):
            ops.irfft(m, input_is_complex=True)
        with pytest.raises(ValueError, match="irfft: axis 2 is out of range"):
            ops.irfft(m, axis=2)
        with pytest.raises(ValueError, match="irfft: Axis dimension must be static: the transformed axis -1"):
            ops.irfft(msym)
        with pytest.raises(ValueError, match="irfft: input_tensor must have a floating-point dtype"):
            ops.irfft(xi)


def test_roi_align_symbolic_roi_count(rng):
    x = rand(rng, [1, 5, 5, 2])
    with Graph(
        "roi_align", input_types=[TensorType(DType.float32, [1, 5, 5, 2]), TensorType(DType.float32, ["m", 5])]
    ) as g:
        out = ops.roi_align(g.inputs[0].tensor, g.inputs[1].tensor, 2, 2, sampling_ratio=2.0, mode="MAX")
        assert str(out.type.shape[0]) == "m"
        g.output(out)
    from maxfx.engine import InferenceSession  # noqa: PLC0415

    model = InferenceSession().load(g)
    for m in (1, 3):
        rois = np.concatenate(
            [np.zeros((m, 1)), rng.uniform(0, 2, (m, 2)), rng.uniform(2.5, 5, (m, 2))], axis=1
        ).astype(np.float32)
        got = model.execute(x, rois)[0].to_numpy()
        np.testing.assert_allclose(got, np_roi_align(x, rois, 2, 2, 1.0, 2.0, False, "MAX"), rtol=1e-5, atol=1e-6)
