"""float8: Float8Config parsing, the float8 kernels of maxfx.nn.kernels and float8 Linear, against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from maxfx import nn
from maxfx.dtype import DType
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType
from maxfx.nn import kernels
from maxfx.nn.float8_config import (
    Float8Config,
    Float8InputScaleSpec,
    Float8WeightScaleSpec,
    parse_float8_config,
)
from maxfx.nn.float8_config import (
    Float8ScaleGranularity as G,
)
from maxfx.nn.float8_config import (
    Float8ScaleOrigin as O,
)
from tests.graph_run import run_graph

CPU = DeviceRef.CPU()
F8 = ml_dtypes.float8_e4m3fn
FMAX = 448.0


def run(fn, *arrays):
    outs = run_graph(fn, *arrays)
    return outs if len(outs) > 1 else outs[0]


def expand(s, shape):
    for ax in (0, 1):
        block = -(-shape[ax] // s.shape[ax])
        s = np.repeat(s, block, axis=ax)[: shape[0]] if ax == 0 else np.repeat(s, block, axis=1)[:, : shape[1]]
    return s


# ─── config ───────────────────────────────────────────────────────────────


def test_specs_and_config_properties():
    w = Float8WeightScaleSpec(G.BLOCK, DType.float32, block_size=(128, 128))
    assert (w.is_block, w.is_tensor, w.is_rowwise, w.is_colwise) == (True, False, False, False)
    i = Float8InputScaleSpec(G.COLWISE, O.DYNAMIC, DType.bfloat16, activation_scale_ub=1200.0)
    assert i.is_colwise and not i.is_block and i.block_size is None
    cfg = Float8Config(i, w, {0, 1}, {1}, quant_method="fp8")
    assert cfg.is_dynamic and not cfg.is_static and cfg.embedding_output_dtype is None
    assert str(G.ROWWISE) == "rowwise" and O("static") is O.STATIC
    with pytest.raises(ValueError, match="BLOCK granularity needs block_size"):
        Float8WeightScaleSpec(G.BLOCK, DType.float32)
    with pytest.raises(ValueError, match="block_size must be two positive ints"):
        Float8InputScaleSpec(G.BLOCK, O.DYNAMIC, DType.float32, block_size=(1, 0))


class HFConfig:
    def __init__(self, qc, layers=2):
        self.quantization_config, self.num_hidden_layers = qc, layers


def test_parse_fbgemm_compressed_tensors_and_fp8():
    sd = {
        "layers.0.mlp.down_proj.weight_scale": np.zeros((8, 1), np.float32),
        "embed_tokens.weight": np.zeros((4, 4), ml_dtypes.bfloat16),
    }
    fb = parse_float8_config(
        HFConfig(
            {
                "quant_method": "fbgemm_fp8",
                "activation_scale_ub": 1200.0,
                "modules_to_not_convert": [f"model.layers.1.mlp.{p}" for p in ("gate_proj", "up_proj", "down_proj")],
            }
        ),
        sd,
        DType.float8_e4m3fn,
    )
    assert fb.quant_method == "fbgemm_fp8" and fb.input_scale.is_colwise and fb.is_dynamic
    assert (
        fb.weight_scale.is_rowwise
        and fb.weight_scale.dtype is DType.float32
        and fb.input_scale.activation_scale_ub == 1200.0
    )
    assert fb.mlp_in_float8 == {0} and fb.attn_qkv_in_float8 == {0, 1} and fb.embedding_output_dtype is DType.bfloat16

    ct = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "group_0": {
                "input_activations": {"dynamic": False, "strategy": "tensor"},
                "weights": {"dynamic": False, "strategy": "channel"},
            }
        },
        "ignore": ["lm_head"],
    }
    sd2 = {
        "layers.0.mlp.down_proj.input_scale": np.zeros((), np.float32),
        "layers.0.mlp.down_proj.weight_scale": np.zeros((8, 1), ml_dtypes.bfloat16),
        "lm_head.weight": np.zeros((2, 2), np.float16),
    }
    cfg = parse_float8_config({"quantization_config": ct, "num_hidden_layers": 1}, sd2, DType.float8_e4m3fn)
    assert cfg.is_static and cfg.input_scale.is_tensor and cfg.input_scale.dtype is DType.float32
    assert (
        cfg.weight_scale.is_rowwise
        and cfg.weight_scale.dtype is DType.bfloat16
        and cfg.embedding_output_dtype is DType.float16
    )

    fp8 = parse_float8_config(
        HFConfig({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}),
        {},
        DType.float8_e4m3fn,
    )
    assert (
        fp8.weight_scale.block_size == (128, 128)
        and fp8.input_scale.is_block
        and fp8.input_scale.block_size == (1, 128)
    )
    assert fp8.embedding_output_dtype is DType.float8_e4m3fn


def test_parse_errors_and_non_float8():
    assert parse_float8_config(HFConfig(None), {}, DType.bfloat16) is None
    with pytest.raises(ValueError, match="has no quantization_config"):
        parse_float8_config(HFConfig(None), {}, DType.float8_e4m3fn)
    with pytest.raises(ValueError, match="unsupported float8 quant_method 'awq'"):
        parse_float8_config(HFConfig({"quant_method": "awq"}), {}, DType.float8_e4m3fn)
    with pytest.raises(ValueError, match="mixes float8 and unquantized"):
        parse_float8_config(
            HFConfig({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["model.layers.0.mlp.up_proj"]}),
            {},
            DType.float8_e4m3fn,
        )
    with pytest.raises(ValueError, match=r"row-wise \[N, 1\] weight scales"):
        parse_float8_config(
            HFConfig({"quant_method": "fbgemm_fp8"}),
            {"a.weight_scale": np.zeros((4,), np.float32)},
            DType.float8_e4m3fn,
        )


# ─── kernels ──────────────────────────────────────────────────────────────

IN_DYN = Float8InputScaleSpec(G.COLWISE, O.DYNAMIC, DType.float32)
W_ROW = Float8WeightScaleSpec(G.ROWWISE, DType.float32)


def test_quantize_kernels_against_numpy(rng):
    x = rng.normal(size=(4, 16)).astype(np.float32)
    q = run(lambda a: kernels.quantize_static_scaled_float8(a, a[0, 0].reshape([1]) * 0 + 4.0), x)
    np.testing.assert_array_equal(q.astype(np.float32), np.clip(x * 4.0, -FMAX, FMAX).astype(F8).astype(np.float32))
    q, s = run(lambda a: kernels.quantize_dynamic_scaled_float8(a, IN_DYN, W_ROW, scales_type=DType.float32), x)
    ref_s = np.abs(x).max(-1, keepdims=True) / FMAX
    np.testing.assert_allclose(s, ref_s, rtol=1e-6)
    np.testing.assert_allclose(q.astype(np.float32) * s, x, rtol=0.07, atol=1e-6)
    block_in = Float8InputScaleSpec(G.BLOCK, O.DYNAMIC, DType.float32, block_size=(1, 8))
    x3 = rng.normal(size=(2, 3, 16)).astype(np.float32)
    q, s = run(
        lambda a: kernels.batched_quantize_dynamic_scaled_float8(a, block_in, W_ROW, scales_type=DType.float32), x3
    )
    assert s.shape == (2, 3, 2)
    np.testing.assert_allclose(s, np.abs(x3.reshape(2, 3, 2, 8)).max(-1) / FMAX, rtol=1e-6)


def test_scaled_matmul_kernels_against_numpy(rng):
    a, b = rng.normal(size=(4, 16)).astype(F8), rng.normal(size=(6, 16)).astype(F8)
    sa, sb = rng.uniform(0.5, 2, (4, 1)).astype(np.float32), rng.uniform(0.5, 2, (6, 1)).astype(np.float32)
    ref = (a.astype(np.float32) * sa) @ (b.astype(np.float32) * sb).T
    got = run(lambda *v: kernels.dynamic_scaled_matmul(*v, IN_DYN, W_ROW, out_type=DType.float32), a, b, sa, sb)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    bat = [np.stack([t, t]) for t in (a, b, sa, sb)]
    got = run(lambda *v: kernels.batched_dynamic_scaled_fp8_matmul(*v, IN_DYN, W_ROW, out_type=DType.float32), *bat)
    np.testing.assert_allclose(got, np.stack([ref, ref]), rtol=1e-5, atol=1e-4)
    s1, s2 = np.array([0.5], np.float32), np.array([3.0], np.float32)
    got = run(kernels.matmul_static_scaled_float8, a, b, s1, s2)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(
        got.astype(np.float32), 1.5 * a.astype(np.float32) @ b.astype(np.float32).T, rtol=1e-2, atol=1e-2
    )


def test_grouped_scaled_kernel_and_fnuz(rng):
    h = rng.normal(size=(5, 8)).astype(F8)
    w = rng.normal(size=(2, 3, 8)).astype(F8)
    hs, ws = rng.uniform(0.5, 2, (5, 1)).astype(np.float32), rng.uniform(0.5, 2, (2, 3, 1)).astype(np.float32)
    starts, ids, stats = np.array([0, 2, 5], np.uint32), np.array([1, 0], np.uint32), np.array([3, 2], np.uint32)
    got = run(
        lambda *v: kernels.grouped_dynamic_scaled_fp8_matmul(*v, IN_DYN, W_ROW, out_type=DType.float32),
        h,
        w,
        hs,
        ws,
        starts,
        ids,
        stats,
    )
    hd, wd = h.astype(np.float32) * hs, w.astype(np.float32) * ws
    ref = np.concatenate([hd[:2] @ wd[1].T, hd[2:] @ wd[0].T])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)

    assert kernels.needs_fp8_fnuz_conversion() is False
    wf = rng.normal(size=(3, 4)).astype(F8)
    s = np.array([0.25], np.float32)
    w2, s2 = run(kernels.normalize_e4m3fn_to_e4m3fnuz, wf, s)
    assert w2.dtype == ml_dtypes.float8_e4m3fnuz
    np.testing.assert_array_equal(w2.astype(np.float32) * s2, wf.astype(np.float32) * s)
    same_w, same_s = run(kernels.convert_weights_to_fp8_fnuz_if_needed, wf, s)
    np.testing.assert_array_equal(same_w.astype(np.float32), wf.astype(np.float32))


def test_kernel_errors():
    with Graph("e", input_types=[TensorType(DType.float32, [2, 3, 4]), TensorType(DType.float8_e4m3fn, [2, 4])]) as g:
        x3, w = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"quantize_dynamic_scaled_float8: input must have rank 2"):
            kernels.quantize_dynamic_scaled_float8(x3, IN_DYN, W_ROW)
        with pytest.raises(TypeError, match="input_scale_spec must be a Float8InputScaleSpec"):
            kernels.dynamic_scaled_matmul(w, w, w, w, W_ROW, W_ROW)
        with pytest.raises(ValueError, match=r"matmul_static_scaled_float8: input_scale must be a scalar"):
            kernels.matmul_static_scaled_float8(w, w, w, w)
        with pytest.raises(ValueError, match=r"normalize_e4m3fn_to_e4m3fnuz: weight must be float8_e4m3fn"):
            kernels.normalize_e4m3fn_to_e4m3fnuz(x3, x3)


# ─── float8 Linear ────────────────────────────────────────────────────────


def _f8_linear(cfg, rng, out_dim=6, in_dim=16, bias=True):
    lin = nn.Linear(in_dim, out_dim, DType.float32, CPU, has_bias=bias, float8_config=cfg)
    w = rng.normal(size=(out_dim, in_dim)).astype(F8)
    shape = tuple(int(d) for d in lin.weight_scale.shape)
    state = {"weight": w, "weight_scale": rng.uniform(0.5, 2, size=shape).astype(np.float32)}
    if bias:
        state["bias"] = rng.normal(size=out_dim).astype(np.float32)
    if lin.input_scale is not None:
        state["input_scale"] = np.array(0.02, np.float32)
    lin.load_state_dict(state)
    return lin, state


def _run_layer(layer, x):
    return run_graph(layer, x, types=[TensorType(DType.float32, list(x.shape))], weights=layer.state_dict())[0]


@pytest.mark.parametrize(
    "inp,wspec",
    [
        (Float8InputScaleSpec(G.TENSOR, O.STATIC, DType.float32), Float8WeightScaleSpec(G.TENSOR, DType.float32)),
        (Float8InputScaleSpec(G.COLWISE, O.DYNAMIC, DType.float32), Float8WeightScaleSpec(G.ROWWISE, DType.float32)),
        (Float8InputScaleSpec(G.TENSOR, O.DYNAMIC, DType.float32), Float8WeightScaleSpec(G.ROWWISE, DType.float32)),
        (
            Float8InputScaleSpec(G.BLOCK, O.DYNAMIC, DType.float32, block_size=(1, 8)),
            Float8WeightScaleSpec(G.BLOCK, DType.float32, block_size=(4, 8)),
        ),
    ],
    ids=["static-tensor", "dynamic-token-rowwise", "dynamic-tensor", "block"],
)
def test_float8_linear_against_numpy(rng, inp, wspec):
    lin, st = _f8_linear(Float8Config(inp, wspec), rng)
    assert lin.weight.dtype is DType.float8_e4m3fn
    x = rng.normal(size=(2, 3, 16)).astype(np.float32)
    w = st["weight"].astype(np.float32) * expand(np.atleast_2d(st["weight_scale"]), (6, 16))
    exact = x @ w.T + st["bias"]
    got = _run_layer(lin, x)
    assert got.shape == (2, 3, 6)
    # Reference with the activations quantized the same way (independent numpy quantizer).
    x2 = x.reshape(6, 16)
    if inp.origin is O.STATIC:
        xq = np.clip(x2 / 0.02, -FMAX, FMAX).astype(F8).astype(np.float32) * 0.02
    else:
        g = 8 if inp.is_block else 16
        xr = x2.reshape(6, -1, g) if not inp.is_tensor else x2.reshape(1, 1, -1)
        s = np.abs(xr).max(-1, keepdims=True) / FMAX
        xq = (np.clip(xr / s, -FMAX, FMAX).astype(F8).astype(np.float32) * s).reshape(6, 16)
    np.testing.assert_allclose(got.reshape(6, 6), xq @ w.T + st["bias"], rtol=1e-4, atol=1e-4)
    assert np.abs(got - exact).max() < 0.1 * np.abs(exact).max()  # float8 activations: a few % error


def test_float8_linear_errors(rng):
    with pytest.raises(TypeError, match="float8_config must be a Float8Config"):
        nn.Linear(4, 4, DType.float32, CPU, float8_config={"quant_method": "fp8"})
    with pytest.raises(ValueError, match="static float8 input scales must be per tensor"):
        nn.Linear(
            4,
            4,
            DType.float32,
            CPU,
            float8_config=Float8Config(Float8InputScaleSpec(G.COLWISE, O.STATIC, DType.float32), W_ROW),
        )
    lin, _ = _f8_linear(Float8Config(IN_DYN, W_ROW), rng)
    with pytest.raises(ValueError, match="input last dim 8 must equal in_dim 16"):
        _run_layer(lin, np.zeros((2, 8), np.float32))
    lin.sharding_strategy = __import__("maxfx.graph", fromlist=["ShardingStrategy"]).ShardingStrategy.rowwise(2)
    shards = lin.shard([CPU, CPU])  # float8 layers shard as in MAX: row-wise scales follow the weight's rows
    assert [[int(d) for d in s.weight_scale.shape] for s in shards] == [[3, 1], [3, 1]]
    mlp = nn.MLP(DType.float32, None, 8, 16, [CPU], float8_config=Float8Config(IN_DYN, W_ROW))
    assert sorted(mlp.state_dict()) == sorted(
        f"{p}.{n}" for p in ("down_proj", "gate_proj", "up_proj") for n in ("weight", "weight_scale")
    )
    assert BufferType  # imported for the buffer kernels' tests elsewhere
