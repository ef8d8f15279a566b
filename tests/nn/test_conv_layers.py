"""max.nn.conv / max.nn.conv_transpose layers against direct-loop numpy convolutions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from maxfx import nn
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, ShardingStrategy, TensorType, Weight, ops
from maxfx.nn import conv as conv_mod
from maxfx.nn import conv_transpose as convt_mod
from tests.graph_run import run_graph

CPU = DeviceRef.CPU()


# ─── numpy references ─────────────────────────────────────────────────────


def np_conv(x, w, stride, pad, dil, groups):
    """Channels-last N-d cross-correlation by explicit loops over output positions.

    x: (N, *spatial, C_in); w: (*kernel, C_in/groups, C_out); pad: (lo0, hi0, lo1, hi1, ...).
    """
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0)] + [(pad[2 * i], pad[2 * i + 1]) for i in range(nd)] + [(0, 0)])
    kernel, cin_g, cout = w.shape[:nd], w.shape[nd], w.shape[-1]
    cout_g = cout // groups
    out_sp = [(xp.shape[1 + i] - dil[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    out = np.zeros((x.shape[0], *out_sp, cout), np.float64)
    for pos in itertools.product(*[range(o) for o in out_sp]):
        for g in range(groups):
            acc = 0.0
            for k in itertools.product(*[range(kk) for kk in kernel]):
                idx = tuple(pos[i] * stride[i] + k[i] * dil[i] for i in range(nd))
                patch = xp[(slice(None), *idx, slice(g * cin_g, (g + 1) * cin_g))]  # (N, cin_g)
                acc = acc + patch @ w[(*k, slice(None), slice(g * cout_g, (g + 1) * cout_g))]
            out[(slice(None), *pos, slice(g * cout_g, (g + 1) * cout_g))] = acc
    return out


def np_conv_transpose_1d(x, w, stride, pad_lo, pad_hi, dil, out_pad):
    """x: (N, L, C_in); w: (k, C_out, C_in). Scatter-add every input position's contribution."""
    n, length, _ = x.shape
    k, cout, _ = w.shape
    full = (length - 1) * stride + dil * (k - 1) + 1 + out_pad
    out = np.zeros((n, full, cout), np.float64)
    for i in range(length):
        for j in range(k):
            out[:, i * stride + j * dil] += x[:, i] @ w[j].T
    return out[:, pad_lo : full - pad_hi]


def run(layer, x, registry=None):
    reg = layer.state_dict() if registry is None else registry
    # The engine refuses strided inputs and weights (as MAX does): permuted layouts are passed as contiguous copies.
    reg = {k: np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v for k, v in reg.items()}
    return run_graph(layer, np.ascontiguousarray(x), weights=reg)[0]


def fill(layer, rng):
    state = {k: rng.normal(size=np.shape(v)).astype(np.float32) for k, v in layer.state_dict().items()}
    layer.load_state_dict(state)
    return state


# ─── Conv1D / Conv2d / Conv3D ─────────────────────────────────────────────


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1)])
def test_conv1d_matches_numpy(rng, stride, padding, dilation, groups):
    conv = nn.Conv1D(
        3, 4, 6, DType.float32, stride=stride, padding=padding, dilation=dilation, num_groups=groups, has_bias=True
    )
    w = fill(conv, rng)
    assert list(conv.filter.shape) == [3, 4 // groups, 6] and conv.stride == stride and conv.padding == padding
    x = rng.normal(size=(2, 9, 4)).astype(np.float32)
    ref = np_conv(x, w["weight"], (stride,), (padding, padding), (dilation,), groups) + w["bias"]
    np.testing.assert_allclose(run(conv, x), ref, rtol=1e-4, atol=1e-4)


def test_conv1d_permute_takes_pytorch_layouts(rng):
    conv = nn.Conv1D(3, 4, 5, DType.float32, padding=1, permute=True, name="c")
    w = fill(conv, rng)
    assert list(conv.filter.shape) == [5, 4, 3]  # (out, in, k)
    assert conv.filter.name == "c.weight"  # keyed by the Weight's own name, as in MAX (not the attribute)
    x = rng.normal(size=(2, 4, 7)).astype(np.float32)  # (N, C, L)
    ref = np_conv(x.transpose(0, 2, 1), w["c.weight"].transpose(2, 1, 0), (1,), (1, 1), (1,), 1).transpose(0, 2, 1)
    np.testing.assert_allclose(run(conv, x), ref, rtol=1e-4, atol=1e-4)


def test_conv1d_from_existing_weights_as_in_the_seed_example(rng):
    # Seed 002's conv page: nn.Conv1D(filter=Weight, bias=Weight, stride=1, padding=1) on (batch, seq, channels).
    filt = Weight("filter_weight", DType.float32, [3, 16, 32], CPU)
    bias = Weight("bias_weight", DType.float32, [32], CPU)
    conv = nn.Conv1D(filter=filt, bias=bias, stride=1, padding=1)
    x = rng.normal(size=(2, 10, 16)).astype(np.float32)
    with Graph("conv_example", input_types=[TensorType(DType.float32, [2, 10, 16])]) as g:
        out = conv(g.inputs[0].tensor)
        assert str(out.shape) == "[Dim(2), Dim(10), Dim(32)]"
        g.output(out)
    f = rng.normal(size=(3, 16, 32)).astype(np.float32)
    b = rng.normal(size=(32,)).astype(np.float32)
    got = InferenceSession().load(g, weights_registry={"filter_weight": f, "bias_weight": b}).execute(x)[0].to_numpy()
    np.testing.assert_allclose(got, np_conv(x, f, (1,), (1, 1), (1,), 1) + b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("permute", [False, True])
def test_conv2d_matches_numpy(rng, permute):
    conv = nn.Conv2d(
        (2, 3),
        4,
        6,
        DType.float32,
        stride=(2, 1),
        padding=(1, 0, 2, 1),
        dilation=(1, 2),
        num_groups=2,
        has_bias=True,
        permute=permute,
    )
    w = fill(conv, rng)
    x = rng.normal(size=(2, 7, 8, 4)).astype(np.float32)
    rscf = w["weight"].transpose(2, 3, 1, 0) if permute else w["weight"]
    ref = np_conv(x, rscf, (2, 1), (1, 0, 2, 1), (1, 2), 2) + w["bias"]
    got = run(conv, x.transpose(0, 3, 1, 2) if permute else x)
    np.testing.assert_allclose(got.transpose(0, 2, 3, 1) if permute else got, ref, rtol=1e-4, atol=1e-4)


def test_conv2d_padding_forms_and_shard(rng):
    assert nn.Conv2d(3, 2, 2, DType.float32, padding=1).padding == (1, 1, 1, 1)
    assert nn.Conv2d(3, 2, 2, DType.float32, padding=(1, 2)).padding == (1, 1, 2, 2)
    conv = nn.Conv2d(3, 2, 4, DType.float32, has_bias=True)
    with pytest.raises(ValueError, match="set sharding_strategy first"):
        conv.shard([CPU, CPU])
    with pytest.raises(ValueError, match="only replicate"):
        conv.sharding_strategy = ShardingStrategy.rowwise(2)
    conv.sharding_strategy = ShardingStrategy.replicate(2)
    w = fill(conv, rng)
    shards = conv.shard([CPU, CPU])
    assert len(shards) == 2 and all(list(s.filter.shape) == [3, 3, 2, 4] for s in shards)
    x = rng.normal(size=(1, 5, 5, 2)).astype(np.float32)
    ref = np_conv(x, w["weight"], (1, 1), (0, 0, 0, 0), (1, 1), 1) + w["bias"]
    for s in shards:
        np.testing.assert_allclose(run(s, x, registry=w), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("permute", [False, True])
def test_conv3d_matches_numpy(rng, permute):
    conv = nn.Conv3D(
        2,
        2,
        3,
        in_channels=3,
        out_channels=4,
        dtype=DType.float32,
        stride=(1, 2, 1),
        padding=(1, 0, 0, 1, 1, 1),
        has_bias=True,
        permute=permute,
    )
    w = fill(conv, rng)
    x = rng.normal(size=(1, 4, 5, 5, 3)).astype(np.float32)
    qrscf = w["weight"].transpose(2, 3, 4, 1, 0) if permute else w["weight"]
    ref = np_conv(x, qrscf, (1, 2, 1), (1, 0, 0, 1, 1, 1), (1, 1, 1), 1) + w["bias"]
    got = run(conv, x.transpose(0, 4, 1, 2, 3) if permute else x)
    np.testing.assert_allclose(got.transpose(0, 2, 3, 4, 1) if permute else got, ref, rtol=1e-4, atol=1e-4)


def test_v1_layers_match_numpy(rng):
    x1 = rng.normal(size=(2, 8, 4)).astype(np.float32)
    f1 = rng.normal(size=(3, 2, 4)).astype(np.float32)
    b1 = rng.normal(size=(4,)).astype(np.float32)
    got = run(nn.Conv1DV1(f1, b1, stride=2, padding=1, groups=2), x1, registry={})
    np.testing.assert_allclose(got, np_conv(x1, f1, (2,), (1, 1), (1,), 2) + b1, rtol=1e-4, atol=1e-4)

    x2 = rng.normal(size=(1, 6, 6, 3)).astype(np.float32)
    f2 = rng.normal(size=(3, 3, 3, 5)).astype(np.float32)
    got = run(nn.Conv2dV1(f2, None, stride=2, padding=(1, 1, 0, 0), dilation=1), x2, registry={})
    np.testing.assert_allclose(got, np_conv(x2, f2, (2, 2), (1, 1, 0, 0), (1, 1), 1), rtol=1e-4, atol=1e-4)

    x3 = rng.normal(size=(1, 3, 4, 4, 2)).astype(np.float32)
    f3 = rng.normal(size=(2, 2, 2, 2, 3)).astype(np.float32)
    got = run(nn.Conv3DV1(f3, padding=1), x3, registry={})
    np.testing.assert_allclose(got, np_conv(x3, f3, (1, 1, 1), (1,) * 6, (1, 1, 1), 1), rtol=1e-4, atol=1e-4)


# ─── transposed ───────────────────────────────────────────────────────────


@pytest.mark.parametrize("stride,padding,dilation,output_padding", [(1, 0, 1, 0), (2, 1, 1, 1), (3, 2, 2, 0)])
def test_conv_transpose1d_matches_numpy(rng, stride, padding, dilation, output_padding):
    conv = nn.ConvTranspose1d(3, 4, 5, DType.float32, stride, padding, dilation, output_padding, has_bias=True)
    w = fill(conv, rng)
    x = rng.normal(size=(2, 6, 4)).astype(np.float32)
    ref = np_conv_transpose_1d(x, w["weight"], stride, padding, padding, dilation, output_padding) + w["bias"]
    np.testing.assert_allclose(run(conv, x), ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose1d_permute_takes_pytorch_layouts(rng):
    conv = nn.ConvTranspose1d(4, 3, 2, DType.float32, stride=2, padding=(1, 0), permute=True)
    w = fill(conv, rng)
    assert list(conv.weight.shape) == [3, 2, 4] and conv.padding == (0, 0, 1, 0)  # PyTorch (in, out, k)
    x = rng.normal(size=(2, 3, 5)).astype(np.float32)  # (N, C_in, L)
    ref = np_conv_transpose_1d(x.transpose(0, 2, 1), w["weight"].transpose(2, 1, 0), 2, 1, 0, 1, 0)
    np.testing.assert_allclose(run(conv, x), ref.transpose(0, 2, 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("permute", [False, True])
def test_weight_norm_conv_transpose1d(rng, permute):
    layer = nn.WeightNormConvTranspose1d(3, 4, 2, DType.float32, stride=2, has_bias=True, permute=permute)
    w = fill(layer, rng)
    assert sorted(w) == ["bias", "weight_g", "weight_v"] and list(layer.weight_g.shape) == [4, 1, 1]
    v = w["weight_v"] if permute else w["weight_v"].transpose(2, 1, 0)  # (in, out, k) as in PyTorch
    weight = w["weight_g"] * v / np.sqrt((v.astype(np.float64) ** 2).sum(axis=(1, 2), keepdims=True))
    x = rng.normal(size=(1, 5, 4)).astype(np.float32)
    ref = np_conv_transpose_1d(x, weight.transpose(2, 1, 0), 2, 0, 0, 1, 0) + w["bias"]
    got = run(layer, x.transpose(0, 2, 1) if permute else x)
    np.testing.assert_allclose(got.transpose(0, 2, 1) if permute else got, ref, rtol=1e-4, atol=1e-4)


# ─── errors ───────────────────────────────────────────────────────────────


def _build(layer, shape):
    with Graph("bad", input_types=[TensorType(DType.float32, shape)]) as g:
        layer(g.inputs[0].tensor)


def test_bad_inputs_name_the_layer_and_shapes():
    with pytest.raises(ValueError, match=r"Conv2d: expected a rank-4 NHWC input, got shape \[1, 5, 3\]"):
        _build(nn.Conv2d(3, 3, 4, DType.float32), [1, 5, 3])
    with pytest.raises(
        ValueError, match=r"Conv2d: the input \[1, 5, 5, 2\] \(NHWC\) has 2 channels, expected in_channels=3"
    ):
        _build(nn.Conv2d(3, 3, 4, DType.float32), [1, 5, 5, 2])
    with pytest.raises(
        ValueError, match=r"Conv1D: the input \[1, 3, 9\] \(\(N, C, L\)\) has 3 channels, expected in_channels=4"
    ):
        _build(nn.Conv1D(3, 4, 4, DType.float32, permute=True), [1, 3, 9])
    with pytest.raises(ValueError, match=r"Conv3D: expected a rank-5 NDHWC input"):
        _build(nn.Conv3D(1, 1, 1, 2, 2, DType.float32), [1, 2, 2, 2])
    with pytest.raises(ValueError, match=r"ConvTranspose1d: the input \[1, 5, 3\] .* expected in_channels=4"):
        _build(nn.ConvTranspose1d(3, 4, 2, DType.float32), [1, 5, 3])
    with pytest.raises(ValueError, match="divisible by num_groups=3"):
        nn.Conv2d(3, 4, 6, DType.float32, num_groups=3)
    with pytest.raises(ValueError, match="Conv2d: padding must be"):
        nn.Conv2d(3, 4, 6, DType.float32, padding=(1, 2, 3))
    with pytest.raises(ValueError, match="Conv3D: stride must be"):
        nn.Conv3D(1, 1, 1, 2, 2, DType.float32, stride=(1, 0, 1))
    with pytest.raises(TypeError, match="Conv1D: pass kernel_size"):
        nn.Conv1D(3, 4)
    with pytest.raises(ValueError, match="Conv2dV1: filter must have rank 4"):
        _build(nn.Conv2dV1(np.zeros((3, 3, 2), np.float32)), [1, 4, 4, 2])
    # A too-small input is rejected by the op with the shapes.
    with pytest.raises(ValueError, match="conv2d"):
        _build(nn.Conv2d(5, 2, 2, DType.float32), [1, 3, 3, 2])


def test_public_module_names():
    for mod in (conv_mod, convt_mod):
        for name in mod.__all__:
            assert getattr(nn, name) is getattr(mod, name)
    assert nn.conv is conv_mod and nn.conv_transpose is convt_mod
    _ = ops  # the layers compose graph ops only
