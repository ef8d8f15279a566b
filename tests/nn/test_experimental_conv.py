"""max.experimental.nn.conv (Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d) against direct-loop numpy
convolutions.
"""

from __future__ import annotations

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Sequential
from maxfx.experimental.nn import conv as conv_module
from maxfx.experimental.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d
from maxfx.experimental.tensor import Tensor, TensorType

# ─── numpy references (PyTorch layouts: channels-first, weight (C_out, C_in/G, *k)) ───


def np_conv(x, w, b, stride, pad, dil, groups):
    """N-d cross-correlation by explicit loops over kernel taps.

    x: (N, C_in, *spatial); w: (C_out, C_in/G, *kernel); pad: (lo0, hi0, lo1, hi1, ...).
    """
    nd = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pad[2 * i], pad[2 * i + 1]) for i in range(nd)])
    cout, cin_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
    cout_g = cout // groups
    out_sp = [(xp.shape[2 + i] - dil[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    out = np.zeros((x.shape[0], cout, *out_sp))
    for g in range(groups):
        xs = xp[:, g * cin_g : (g + 1) * cin_g]
        ws = w[g * cout_g : (g + 1) * cout_g].astype(np.float64)
        for k in np.ndindex(*kernel):
            window = tuple(
                slice(k[i] * dil[i], k[i] * dil[i] + (out_sp[i] - 1) * stride[i] + 1, stride[i]) for i in range(nd)
            )
            patch = xs[(slice(None), slice(None), *window)]  # (N, cin_g, *out_sp)
            out[:, g * cout_g : (g + 1) * cout_g] += np.einsum(
                "nc...,oc->no...", patch, ws[(slice(None), slice(None), *k)]
            )
    if b is not None:
        out += b.reshape(1, -1, *([1] * nd))
    return out


def np_conv_transpose_1d(x, w, b, stride, pad_lo, pad_hi, dil, out_pad, groups):
    """x: (N, C_in, L); w: (C_in, C_out/G, K). Scatter-add every input position's contribution."""
    n, cin, length = x.shape
    _, cout_g, k = w.shape
    cin_g = cin // groups
    full = (length - 1) * stride + dil * (k - 1) + 1 + out_pad
    out = np.zeros((n, cout_g * groups, full))
    for c in range(cin):
        g = c // cin_g
        for i in range(length):
            for j in range(k):
                out[:, g * cout_g : (g + 1) * cout_g, i * stride + j * dil] += x[:, c, i, None] * w[c, :, j]
    if b is not None:
        out += b.reshape(1, -1, 1)
    return out[:, :, pad_lo : full - pad_hi]


def np_conv_transpose_2d(x, w, b, stride, pad, dil, out_pad):
    """x: (N, C_in, H, W); w: (C_in, C_out, kH, kW); pad: (top, bottom, left, right).

    Scatter-add: input pixel (i, j) times tap (p, q) lands on output pixel
    (i * stride_h + p * dil_h, j * stride_w + q * dil_w) of the uncropped output.
    """
    n, cin, h, wd = x.shape
    _, cout, kh, kw = w.shape
    full = [(size - 1) * s + d * (k - 1) + 1 + o for size, s, d, k, o in zip((h, wd), stride, dil, (kh, kw), out_pad)]
    out = np.zeros((n, cout, *full))
    for i in range(h):
        for j in range(wd):
            for p in range(kh):
                for q in range(kw):
                    out[:, :, i * stride[0] + p * dil[0], j * stride[1] + q * dil[1]] += (
                        x[:, :, i, j].astype(np.float64) @ w[:, :, p, q]
                    )
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out[:, :, pad[0] : full[0] - pad[1], pad[2] : full[1] - pad[3]]


def _np(t):
    return t.to_numpy()


def _make(rng, cls, *args, **kwargs):
    """``cls(*args, **kwargs)`` with independent numpy weights loaded; returns ``(layer, weight, bias or None)``.

    The layer is built inside ``F.lazy()`` so that its random initial values,
    replaced at once, are never computed (each new shape would cost a compile).
    """
    with F.lazy():
        layer = cls(*args, **kwargs)
    state = {name: rng.normal(size=[int(d) for d in t.shape]).astype(np.float32) for name, t in layer.parameters}
    layer.load_state_dict(state)
    return layer, state["weight"], state.get("bias")


def _check(out, expect):
    np.testing.assert_allclose(out, expect, rtol=2e-4, atol=2e-4)


# ─── numerics ─────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "permute, stride, padding, dilation, groups, has_bias, batch",
    [
        (True, 1, 0, 1, 1, False, 1),
        (True, 2, 1, 1, 1, True, 2),
        (True, 1, (2, 0), 2, 2, True, 3),
        (False, 3, 2, 1, 1, True, 2),
        (False, 1, "same", 2, 2, False, 1),
        (True, 1, "same", 1, 4, True, 2),
    ],
)
def test_conv1d_matches_numpy(rng, permute, stride, padding, dilation, groups, has_bias, batch):
    conv, w, b = _make(
        rng,
        Conv1d,
        4,
        8,
        4,
        stride=stride,
        padding=padding,
        dilation=dilation,
        num_groups=groups,
        has_bias=has_bias,
        permute=permute,
    )
    x = rng.normal(size=(batch, 4, 11)).astype(np.float32)  # NCL
    w_pt = w if permute else w.transpose(2, 1, 0)  # (K, C_in/G, C_out) -> (C_out, C_in/G, K)
    expect = np_conv(x, w_pt, b, (conv.stride,), conv.padding[2:], (conv.dilation,), groups)
    out = _np(conv(Tensor(x if permute else x.transpose(0, 2, 1))))
    _check(out if permute else out.transpose(0, 2, 1), expect)
    if padding == "same":
        assert out.shape[2 if permute else 1] == 11


@pytest.mark.parametrize(
    "permute, kernel, stride, padding, dilation, groups, has_bias, batch",
    [
        (False, 3, 1, 0, 1, 1, True, 1),
        (False, (2, 3), (2, 1), (1, 2), 1, 2, False, 2),
        (True, 3, 2, (0, 1, 2, 0), (1, 2), 1, True, 2),
        (True, (3, 1), 1, 1, 2, 4, True, 1),
    ],
)
def test_conv2d_matches_numpy(rng, permute, kernel, stride, padding, dilation, groups, has_bias, batch):
    conv, w, b = _make(
        rng,
        Conv2d,
        kernel,
        4,
        8,
        stride=stride,
        padding=padding,
        dilation=dilation,
        num_groups=groups,
        has_bias=has_bias,
        permute=permute,
    )
    x = rng.normal(size=(batch, 4, 7, 6)).astype(np.float32)  # NCHW
    w_pt = w if permute else w.transpose(3, 2, 0, 1)  # RSCF -> FCRS
    expect = np_conv(x, w_pt, b, conv.stride, conv.padding, conv.dilation, groups)
    out = _np(conv(Tensor(x if permute else x.transpose(0, 2, 3, 1))))
    _check(out if permute else out.transpose(0, 3, 1, 2), expect)


@pytest.mark.parametrize(
    "permute, stride, padding, output_padding, dilation, groups, has_bias, batch",
    [
        (True, 1, 0, 0, 1, 1, False, 1),
        (True, 2, 1, 1, 1, 1, True, 2),
        (False, 3, (2, 0), 2, 2, 1, True, 2),
        (True, 2, 0, 0, 2, 2, True, 1),
        (False, 2, 1, 1, 1, 2, False, 3),
    ],
)
def test_conv_transpose1d_matches_numpy(
    rng, permute, stride, padding, output_padding, dilation, groups, has_bias, batch
):
    conv, w, b = _make(
        rng,
        ConvTranspose1d,
        4,
        6,
        3,
        stride=stride,
        padding=padding,
        output_padding=output_padding,
        dilation=dilation,
        num_groups=groups,
        has_bias=has_bias,
        permute=permute,
    )
    x = rng.normal(size=(batch, 4, 5)).astype(np.float32)  # NCL
    if permute:
        w_pt = w
    else:  # (K, C_out, C_in/G) -> (C_in, C_out/G, K): input channel g*cin_g + c, output g*cout_g + o
        cin_g, cout_g = 4 // groups, 6 // groups
        w_pt = np.concatenate([w[:, g * cout_g : (g + 1) * cout_g, :].transpose(2, 1, 0) for g in range(groups)])
        assert w_pt.shape == (4, cout_g, 3) and cin_g * groups == 4
    _, _, lo, hi = conv.padding
    expect = np_conv_transpose_1d(x, w_pt, b, stride, lo, hi, dilation, output_padding, groups)
    out = _np(conv(Tensor(x if permute else x.transpose(0, 2, 1))))
    _check(out if permute else out.transpose(0, 2, 1), expect)


def test_numpy_references_are_adjoint(rng):
    """The two references check each other: <conv(x, w), y> == <x, conv_transpose(y, w)> for any geometry."""
    stride, pad, dil = (2, 1), (1, 0, 2, 1), (1, 2)
    w = rng.normal(size=(3, 2, 3, 2))  # conv (C_out, C_in, kH, kW) == conv_transpose (C_in, C_out, kH, kW)
    x = rng.normal(size=(2, 2, 7, 6))
    y = rng.normal(size=np_conv(x, w, None, stride, pad, dil, 1).shape)
    back = np_conv_transpose_2d(y, w, None, stride, pad, dil, (0, 0))
    # A strided conv ignores trailing input rows/columns; output_padding grows the transpose to x's size.
    out_pad = [x.shape[2 + i] - back.shape[2 + i] for i in range(2)]
    back = np_conv_transpose_2d(y, w, None, stride, pad, dil, out_pad)
    assert back.shape == x.shape
    np.testing.assert_allclose(np.vdot(np_conv(x, w, None, stride, pad, dil, 1), y), np.vdot(x, back))


@pytest.mark.parametrize(
    "permute, kernel, stride, padding, dilation, groups, has_bias, batch",
    [
        (False, 2, 1, 0, 1, 1, True, 1),
        (True, (2, 3, 1), (2, 1, 2), (1, 0, 1), 1, 2, False, 2),
        (True, 2, 1, (1, 0, 0, 1, 2, 0), (2, 1, 1), 1, True, 1),
        (False, (1, 2, 2), 2, 1, (1, 2, 1), 4, True, 2),
    ],
)
def test_conv3d_matches_numpy(rng, permute, kernel, stride, padding, dilation, groups, has_bias, batch):
    conv, w, b = _make(
        rng,
        Conv3d,
        kernel,
        4,
        8,
        stride=stride,
        padding=padding,
        dilation=dilation,
        num_groups=groups,
        has_bias=has_bias,
        permute=permute,
    )
    x = rng.normal(size=(batch, 4, 5, 6, 5)).astype(np.float32)  # NCDHW
    w_pt = w if permute else w.transpose(4, 3, 0, 1, 2)  # QRSCF -> FCQRS
    expect = np_conv(x, w_pt, b, conv.stride, conv.padding, conv.dilation, groups)
    out = _np(conv(Tensor(x if permute else x.transpose(0, 2, 3, 4, 1))))
    _check(out if permute else out.transpose(0, 4, 1, 2, 3), expect)


@pytest.mark.parametrize(
    "permute, kernel, stride, padding, dilation, output_padding, has_bias, batch",
    [
        (False, 2, 1, 0, 1, 0, False, 1),
        (True, 3, 2, 1, 1, 1, True, 2),
        (False, (2, 3), (2, 3), (1, 0, 2, 1), (1, 2), (1, 2), True, 1),
        (True, (3, 2), (1, 2), (1, 2), (2, 1), (1, 0), False, 2),
    ],
)
def test_conv_transpose2d_matches_numpy(
    rng, permute, kernel, stride, padding, dilation, output_padding, has_bias, batch
):
    conv, w, b = _make(
        rng,
        ConvTranspose2d,
        kernel,
        4,
        6,
        stride=stride,
        padding=padding,
        dilation=dilation,
        output_padding=output_padding,
        has_bias=has_bias,
        permute=permute,
    )
    x = rng.normal(size=(batch, 4, 4, 5)).astype(np.float32)  # NCHW
    w_pt = w if permute else w.transpose(3, 2, 0, 1)  # RSCF (kH, kW, C_out, C_in) -> CFRS (C_in, C_out, kH, kW)
    expect = np_conv_transpose_2d(x, w_pt, b, conv.stride, conv.padding, conv.dilation, conv.output_padding)
    out = _np(conv(Tensor(x if permute else x.transpose(0, 2, 3, 1))))
    _check(out if permute else out.transpose(0, 3, 1, 2), expect)


def test_conv1d_weight_follows_the_input_dtype(rng):
    conv, w, _ = _make(rng, Conv1d, 2, 3, 2)
    x = rng.normal(size=(1, 2, 5))
    out = conv(Tensor(x))  # float64 input, float32 weight: the weight is cast (as in MAX)
    assert out.dtype == DType.float64
    _check(_np(out), np_conv(x, w, None, (1,), (0, 0), (1,), 1))


# ─── parameters and configuration ─────────────────────────────────────────


def _lazy(cls, *args, **kwargs):
    with F.lazy():  # shapes and names only: the random values are never computed
        return cls(*args, **kwargs)


def _shapes(layer):
    return {name: [int(d) for d in t.shape] for name, t in layer.parameters}


def test_parameter_names_shapes_and_stored_geometry():
    # Conv2d: RSCF by default, PyTorch's FCRS with permute; padding stored as 4 ints.
    c2 = _lazy(Conv2d, (3, 5), 6, 8, num_groups=2, has_bias=True, padding=(1, 2))
    assert _shapes(c2) == {"weight": [3, 5, 3, 8], "bias": [8]}
    assert (c2.kernel_size, c2.stride, c2.padding, c2.dilation, c2.permute) == (
        (3, 5),
        (1, 1),
        (1, 1, 2, 2),
        (1, 1),
        False,
    )
    assert _shapes(_lazy(Conv2d, 3, 6, 8, num_groups=2, permute=True)) == {"weight": [8, 3, 3, 3]}
    # Conv1d: permute=True by default (PyTorch order); padding stored as MAX's (0, 0, left, right).
    c1 = _lazy(Conv1d, 6, 4, 5, num_groups=2, has_bias=True, padding="same", dilation=2)
    assert c1.permute and _shapes(c1) == {"weight": [4, 3, 5], "bias": [4]}
    assert (c1.kernel_size, c1.stride, c1.dilation, c1.padding) == (5, 1, 2, (0, 0, 4, 4))
    assert _lazy(Conv1d, 2, 2, 4, padding="same").padding == (0, 0, 1, 2)
    assert _lazy(Conv1d, 2, 2, 3, padding=(2, 1)).padding == (0, 0, 2, 1)
    assert _shapes(_lazy(Conv1d, 6, 4, 5, num_groups=2, permute=False)) == {"weight": [5, 3, 4]}
    # ConvTranspose1d: PyTorch's (C_in, C_out/G, K) with permute (the default), else (K, C_out, C_in/G).
    t1 = _lazy(ConvTranspose1d, 6, 4, 3, stride=2, padding=1, output_padding=1, num_groups=2, has_bias=True)
    assert t1.permute and _shapes(t1) == {"weight": [6, 2, 3], "bias": [4]}
    assert (t1.padding, t1.output_padding, t1.stride, t1.dilation) == ((0, 0, 1, 1), (0, 1), 2, 1)
    assert _shapes(_lazy(ConvTranspose1d, 6, 4, 3, num_groups=2, permute=False)) == {"weight": [3, 4, 3]}
    # Without has_bias the bias is the literal 0, not a parameter.
    for layer in (_lazy(Conv2d, 1, 2, 2), _lazy(Conv1d, 2, 2, 1), _lazy(ConvTranspose1d, 2, 2, 1)):
        assert layer.bias == 0 and [n for n, _ in layer.parameters] == ["weight"] and not layer.has_bias


def test_conv3d_and_conv_transpose2d_parameters_and_stored_geometry():
    # Conv3d: QRSCF (kD, kH, kW, C_in/G, C_out) by default, PyTorch's FCQRS with permute; padding stored as 6 ints.
    c3 = _lazy(
        Conv3d, (1, 2, 3), 6, 8, num_groups=2, has_bias=True, padding=(1, 0, 2), stride=(1, 2, 1), dilation=(2, 1, 1)
    )
    assert not c3.permute and _shapes(c3) == {"weight": [1, 2, 3, 3, 8], "bias": [8]}
    assert (c3.kernel_size, c3.stride, c3.padding, c3.dilation, c3.num_groups) == (
        (1, 2, 3),
        (1, 2, 1),
        (1, 1, 0, 0, 2, 2),
        (2, 1, 1),
        2,
    )
    assert _lazy(Conv3d, 2, 2, 2, padding=(1, 2, 3, 4, 5, 6)).padding == (1, 2, 3, 4, 5, 6)
    assert _shapes(_lazy(Conv3d, 3, 6, 8, num_groups=2, permute=True)) == {"weight": [8, 3, 3, 3, 3]}
    # ConvTranspose2d: RSCF (kH, kW, C_out, C_in) by default, PyTorch's (C_in, C_out, kH, kW) with permute; no groups.
    t2 = _lazy(
        ConvTranspose2d,
        (2, 3),
        6,
        4,
        stride=(2, 1),
        padding=(1, 0),
        dilation=(1, 2),
        output_padding=(1, 1),
        has_bias=True,
    )
    assert not t2.permute and _shapes(t2) == {"weight": [2, 3, 4, 6], "bias": [4]}
    assert (t2.kernel_size, t2.stride, t2.padding, t2.dilation, t2.output_padding) == (
        (2, 3),
        (2, 1),
        (1, 1, 0, 0),
        (1, 2),
        (1, 1),
    )
    assert _lazy(ConvTranspose2d, 2, 2, 2, stride=2, output_padding=1).output_padding == (1, 1)
    assert _shapes(_lazy(ConvTranspose2d, 3, 6, 4, permute=True)) == {"weight": [6, 4, 3, 3]}
    assert not hasattr(t2, "num_groups")
    for layer in (_lazy(Conv3d, 1, 2, 2), _lazy(ConvTranspose2d, 1, 2, 2)):
        assert layer.bias == 0 and [n for n, _ in layer.parameters] == ["weight"] and not layer.has_bias
    layer = _lazy(ConvTranspose2d, 2, 2, 3, dtype=DType.float64, has_bias=True)
    assert layer.weight.dtype == DType.float64 and layer.bias.dtype == DType.float64


def test_default_init_is_standard_normal_and_state_dict():
    conv = Conv2d(3, 32, 32, has_bias=True, permute=True)
    state = conv.state_dict()
    assert {k: v.shape for k, v in state.items()} == {"weight": (32, 32, 3, 3), "bias": (32,)}
    w = state["weight"]  # 9216 samples
    assert w.dtype == np.float32 and abs(w.mean()) < 0.05 and abs(w.std() - 1) < 0.05
    layer = _lazy(Conv1d, 2, 3, 2, dtype=DType.float64, has_bias=True)
    assert layer.weight.dtype == DType.float64 and layer.bias.dtype == DType.float64 and layer.dtype == DType.float64


# ─── jit, grad and compile ───────────────────────────────────────────────


def test_layers_run_under_jit_grad_and_compile(rng):
    with F.lazy():
        net = Sequential(
            Conv1d(3, 4, 3, padding=1, has_bias=True),
            ConvTranspose1d(4, 4, 2, stride=2, num_groups=2, has_bias=True),
            Conv1d(4, 2, 3, stride=2, padding="same"),
        )
    net.load_state_dict(
        {name: rng.normal(size=[int(d) for d in t.shape]).astype(np.float32) for name, t in net.parameters}
    )
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    with F.lazy():  # the eager result, run as one fused program
        eager = _np(net(Tensor(x)))
    assert eager.shape == (2, 2, 8)
    _check(_np(jax.jit(lambda m, x: m(x))(net, Tensor(x))), eager)
    grads = jax.grad(lambda m, x: jnp.sum(m(x)))(net, Tensor(x))
    assert list(grads[1].weight.shape) == [4, 2, 2] and np.isfinite(_np(grads[0].bias)).all()
    compiled = net.compile(TensorType(DType.float32, ["batch", 3, 8]))
    _check(_np(compiled(Tensor(x))), eager)
    conv2, w, b = _make(rng, Conv2d, 3, 2, 4, padding=1, has_bias=True)
    x2 = rng.normal(size=(1, 5, 5, 2)).astype(np.float32)  # NHWC
    out = _np(conv2.compile(TensorType(DType.float32, [1, 5, 5, 2]))(Tensor(x2)))
    _check(
        out.transpose(0, 3, 1, 2),
        np_conv(x2.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), b, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    )


def test_conv3d_and_conv_transpose2d_run_under_jit(rng):
    conv3, w3, b3 = _make(rng, Conv3d, 2, 2, 4, stride=(1, 2, 1), padding=1, has_bias=True, permute=True)
    x3 = rng.normal(size=(1, 2, 3, 4, 3)).astype(np.float32)  # NCDHW
    out = _np(jax.jit(lambda m, x: m(x))(conv3, Tensor(x3)))
    _check(out, np_conv(x3, w3, b3, (1, 2, 1), (1,) * 6, (1, 1, 1), 1))
    up, wt, bt = _make(rng, ConvTranspose2d, 3, 2, 3, stride=2, padding=1, output_padding=1, has_bias=True)
    x2 = rng.normal(size=(2, 3, 4, 2)).astype(np.float32)  # NHWC
    out = _np(jax.jit(lambda m, x: m(x))(up, Tensor(x2)))
    assert out.shape == (2, 6, 8, 3)
    expect = np_conv_transpose_2d(
        x2.transpose(0, 3, 1, 2), wt.transpose(3, 2, 0, 1), bt, (2, 2), (1, 1, 1, 1), (1, 1), (1, 1)
    )
    _check(out.transpose(0, 3, 1, 2), expect)


@pytest.mark.parametrize("name", ["Conv3d", "ConvTranspose2d"])
def test_docstring_example_runs(name):
    """The class docstring's example runs as written (the suite's doctest collection covers only the op modules)."""
    [test] = [
        t
        for t in doctest.DocTestFinder().find(getattr(conv_module, name), name, module=conv_module, globs={})
        if t.examples
    ]
    report = []
    result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, out=report.append, clear_globs=True)
    assert result.attempted > 0 and result.failed == 0, "".join(report)


# ─── errors ───────────────────────────────────────────────────────────────


def test_bad_inputs_raise_clear_errors():
    with F.lazy():  # the errors come from the checks, before anything runs
        with pytest.raises(
            ValueError, match=r"Conv1d: the input \[1, 5, 8\] \(\(N, C, L\)\) has 5 channels, expected in_channels=4"
        ):
            Conv1d(4, 2, 3)(Tensor.ones([1, 5, 8]))
        with pytest.raises(ValueError, match=r"Conv1d: expected a rank-3 \(N, L, C\) input"):
            Conv1d(4, 2, 3, permute=False)(Tensor.ones([8, 4]))
        with pytest.raises(ValueError, match="Conv2d: the input .* has 3 channels, expected in_channels=4"):
            Conv2d(3, 4, 2)(Tensor.ones([1, 6, 6, 3]))  # NHWC by default
        with pytest.raises(ValueError, match=r"ConvTranspose1d: expected a rank-3 \(N, C, L\) input"):
            ConvTranspose1d(4, 2, 3)(Tensor.ones([1, 4, 1, 8]))
        with pytest.raises(ValueError, match="ConvTranspose1d: the input .* has 2 channels"):
            ConvTranspose1d(4, 2, 3)(Tensor.ones([1, 2, 8]))
        with pytest.raises(ValueError, match="the output would be empty"):  # kernel longer than the padded input
            Conv1d(2, 2, 5)(Tensor.ones([1, 2, 3]))
        with pytest.raises(ValueError, match=r"Conv3d: expected a rank-5 NDHWC input, got shape \[1, 6, 6, 2\]"):
            Conv3d(3, 2, 2)(Tensor.ones([1, 6, 6, 2]))
        with pytest.raises(
            ValueError, match=r"Conv3d: the input \[1, 3, 4, 4, 4\] \(NCDHW\) has 3 channels, expected in_channels=2"
        ):
            Conv3d(3, 2, 2, permute=True)(Tensor.ones([1, 3, 4, 4, 4]))
        with pytest.raises(ValueError, match="conv3d: input spatial dim D .* the output would be empty"):
            Conv3d(3, 2, 2)(Tensor.ones([1, 2, 6, 6, 2]))
        with pytest.raises(
            ValueError,
            match=r"ConvTranspose2d: the input \[1, 2, 3, 3\] \(NCHW\) has 2 channels, expected in_channels=3",
        ):
            ConvTranspose2d(2, 3, 2, permute=True)(Tensor.ones([1, 2, 3, 3]))
        with pytest.raises(ValueError, match=r"ConvTranspose2d: expected a rank-4 NHWC input"):
            ConvTranspose2d(2, 3, 2)(Tensor.ones([1, 3, 3]))
        with pytest.raises(
            ValueError, match="conv2d_transpose: output spatial dim 0 would be -2 .* reduce the padding"
        ):
            ConvTranspose2d(2, 2, 2, padding=(2, 0))(Tensor.ones([1, 1, 3, 2]))


def test_bad_configurations_raise_at_construction():
    with F.lazy():
        with pytest.raises(
            ValueError, match="Conv2d: in_channels=6 and out_channels=4 must both be divisible by num_groups=4"
        ):
            Conv2d(3, 6, 4, num_groups=4)
        with pytest.raises(ValueError, match="Conv1d: in_channels must be a positive int"):
            Conv1d(0, 4, 3)
        with pytest.raises(ValueError, match="Conv1d only supports padding='same'"):
            Conv1d(2, 2, 3, padding="valid")
        with pytest.raises(ValueError, match="Conv1d: padding must be"):
            Conv1d(2, 2, 3, padding=(1, 2, 3))
        with pytest.raises(ValueError, match="Conv2d: padding must be"):
            Conv2d(3, 2, 2, padding=(1, 1, 1))
        with pytest.raises(ValueError, match="Conv2d: stride must be"):
            Conv2d(3, 2, 2, stride=0)
        with pytest.raises(ValueError, match="Conv1d: kernel_size must be"):
            Conv1d(2, 2, 0)
        with pytest.raises(ValueError, match="ConvTranspose1d: output_padding must be smaller than stride or dilation"):
            ConvTranspose1d(2, 2, 3, stride=2, output_padding=2)
        with pytest.raises(
            ValueError, match="ConvTranspose1d: in_channels=3 and out_channels=4 must both be divisible"
        ):
            ConvTranspose1d(3, 4, 2, num_groups=2)
        with pytest.raises(
            ValueError, match="Conv3d: in_channels=6 and out_channels=4 must both be divisible by num_groups=4"
        ):
            Conv3d(2, 6, 4, num_groups=4)
        with pytest.raises(ValueError, match=r"Conv3d: kernel_size must be an int or 3 ints >= 1, got \(2, 2\)"):
            Conv3d((2, 2), 2, 2)
        with pytest.raises(
            ValueError, match=r"Conv3d: padding must be an int, 3 ints or 6 ints >= 0, got \(1, 1, 1, 1\)"
        ):
            Conv3d(2, 2, 2, padding=(1, 1, 1, 1))
        with pytest.raises(ValueError, match="Conv3d: dilation must be an int or 3 ints >= 1, got None"):
            Conv3d(2, 2, 2, dilation=None)
        with pytest.raises(ValueError, match="ConvTranspose2d: out_channels must be a positive int, got 0"):
            ConvTranspose2d(2, 2, 0)
        with pytest.raises(ValueError, match="ConvTranspose2d: padding must be an int, 2 ints or 4 ints >= 0, got -1"):
            ConvTranspose2d(2, 2, 2, padding=-1)
        with pytest.raises(ValueError, match="ConvTranspose2d: stride must be an int or 2 ints"):
            ConvTranspose2d(2, 2, 2, stride=(1, 1, 1))
        with pytest.raises(
            ValueError,
            match=(
                r"ConvTranspose2d: each output_padding must be smaller than its stride or its dilation, got "
                r"output_padding=\(1, 1\)"
            ),
        ):
            ConvTranspose2d(2, 2, 2, stride=(2, 1), output_padding=1)
        with pytest.raises(ValueError, match="ConvTranspose2d: output_padding must be an int or 2 ints >= 0"):
            ConvTranspose2d(2, 2, 2, output_padding=-1)
