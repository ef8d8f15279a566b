"""Graph-API max.nn layers: seed 004, each layer against numpy, state dicts, subgraphs, hooks."""

from __future__ import annotations

import textwrap

import gguf
import ml_dtypes
import numpy as np
import pytest

from maxfx import nn
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, Weight, ops
from maxfx.graph.quantization import QuantizationEncoding
from tests.graph_run import run_graph

CPU = DeviceRef.CPU()


def _run(layer, *arrays, types=None):
    outs = run_graph(layer, *arrays, types=types, weights=getattr(layer, "state_dict", dict)())
    return outs if len(outs) > 1 else outs[0]


def _fill(layer, rng):
    state = {k: rng.normal(size=np.shape(v)).astype(np.asarray(v).dtype) for k, v in layer.state_dict().items()}
    layer.load_state_dict(state)
    return state


SEED_004 = """
    from maxfx import nn
    from maxfx.dtype import DType
    from maxfx.graph import Weight, ops, DeviceRef

    class Linear(nn.Module):
        def __init__(self, in_dim, out_dim):        # doc: `in_dims` (API_INVENTORY §6 #23)
            super().__init__()
            self.weight = Weight("weight", DType.float32, (in_dim, out_dim), DeviceRef.CPU())

        def __call__(self, x):
            return x @ self.weight                   # doc: `.T` on an (in, out) weight (§6 #24)

    class MLP(nn.Module):
        def __init__(self):                          # no super().__init__(), as in the doc
            self.up = Linear(5, 10)
            self.gate = Linear(5, 10)
            self.down = Linear(10, 5)

        def __call__(self, x):
            return self.down(ops.silu(self.gate(x)) + self.up(x))

    model = MLP()
    print({k: list(v.shape) for k, v in model.state_dict().items()})
"""


def test_seed_004_example(capsys):
    ns: dict = {}
    exec(compile(textwrap.dedent(SEED_004), "<seed 004>", "exec"), ns)  # noqa: S102 - seed example
    assert capsys.readouterr().out == "{'up.weight': [5, 10], 'gate.weight': [5, 10], 'down.weight': [10, 5]}\n"
    model, rng = ns["model"], np.random.default_rng(0)
    w = _fill(model, rng)
    x = rng.normal(size=(3, 5)).astype(np.float32)
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    ref = (silu(x @ w["gate.weight"]) + x @ w["up.weight"]) @ w["down.weight"]
    np.testing.assert_allclose(_run(model, x), ref, rtol=1e-5, atol=1e-5)


def test_linear_mlp_embedding_norms_against_numpy(rng):
    x = rng.normal(size=(4, 8)).astype(np.float32)
    lin = nn.Linear(8, 3, DType.float32, CPU, has_bias=True)
    w = _fill(lin, rng)
    np.testing.assert_allclose(_run(lin, x), x @ w["weight"].T + w["bias"], rtol=1e-5, atol=1e-5)

    clipped = nn.Linear(8, 3, DType.float32, CPU, clip_weight=0.5)
    w = _fill(clipped, rng)
    np.testing.assert_allclose(_run(clipped, x), x @ np.clip(w["weight"], -0.5, 0.5).T, rtol=1e-5, atol=1e-5)

    mlp = nn.MLP(DType.float32, None, 8, 16, [CPU], activation_function="gelu_tanh")
    w = _fill(mlp, rng)
    gelu = lambda z: 0.5 * z * (1 + np.tanh(0.7978845608 * (z + 0.044715 * z**3)))  # noqa: E731
    ref = (gelu(x @ w["gate_proj.weight"].T) * (x @ w["up_proj.weight"].T)) @ w["down_proj.weight"].T
    np.testing.assert_allclose(_run(mlp, x), ref, rtol=1e-4, atol=1e-4)

    emb = nn.Embedding(10, 4, DType.float32, CPU)
    w = _fill(emb, rng)
    ids = np.array([[1, 9], [0, 1]], np.int64)
    np.testing.assert_array_equal(_run(emb, ids), w["weight"][ids])

    ln = nn.LayerNorm(8, [CPU], DType.float32, eps=1e-5)
    w = _fill(ln, rng)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(
        _run(ln, x), (x - mu) / np.sqrt(var + 1e-5) * w["weight"] + w["bias"], rtol=1e-4, atol=1e-5
    )

    # MAX's defaults: computed in float32, returned in the input's dtype; no weights without elementwise_affine.
    xb = x.astype(ml_dtypes.bfloat16)
    xf = xb.astype(np.float32)
    mu, var = xf.mean(-1, keepdims=True), xf.var(-1, keepdims=True)
    out = _run(nn.LayerNorm(8, [CPU], DType.float32, elementwise_affine=False), xb)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(out.astype(np.float32), (xf - mu) / np.sqrt(var + 1e-5), rtol=1e-2, atol=1e-2)
    kept = nn.LayerNorm(8, [CPU], DType.bfloat16, keep_dtype=True, use_bias=False)
    assert sorted(kept.state_dict()) == ["weight"]
    wk = _fill(kept, rng)
    out = _run(kept, xb)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(
        out.astype(np.float32), (xf - mu) / np.sqrt(var + 1e-5) * wk["weight"].astype(np.float32), rtol=5e-2, atol=5e-2
    )

    rms = nn.RMSNorm(8, DType.float32, eps=1e-6, weight_offset=1.0)
    w = _fill(rms, rng)
    ref = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * (w["weight"] + 1.0)
    np.testing.assert_allclose(_run(rms, x), ref, rtol=1e-5, atol=1e-5)

    seq = nn.Sequential([nn.Linear(8, 8, DType.float32, CPU), nn.Linear(8, 2, DType.float32, CPU)])
    w = _fill(seq, rng)
    np.testing.assert_allclose(_run(seq, x), x @ w["0.weight"].T @ w["1.weight"].T, rtol=1e-4, atol=1e-4)

    with Graph("c", input_types=[TensorType(DType.float32, [4, 8])]) as g:
        g.output(nn.clamp.clamp(g.inputs[0].tensor, min=-0.5, max=0.25))
    np.testing.assert_array_equal(InferenceSession().load(g).execute(x)[0].to_numpy(), np.clip(x, -0.5, 0.25))


def test_sequential_takes_plain_callables_as_in_the_mlp_tutorial(rng):
    """Issue 35 item 3: Modular's "Build an MLP block" puts ``ops.relu`` in a Sequential ("LayerList: expected a Module,
    got function").
    """

    class MLPBlock(nn.Module):
        def __init__(self, in_features, out_features, hidden_features, activation=ops.relu):
            super().__init__()
            layers = [nn.Linear(in_features, hidden_features[0], DType.float32, CPU)]
            for a, b in zip(hidden_features, hidden_features[1:]):
                layers += [activation, nn.Linear(a, b, DType.float32, CPU)]
            layers += [activation, nn.Linear(hidden_features[-1], out_features, DType.float32, CPU)]
            self.model = nn.Sequential(layers)

        def __call__(self, x):
            return self.model(x)

    mlp = MLPBlock(8, 2, [16, 4])
    assert sorted(mlp.state_dict()) == [
        "model.0.weight",
        "model.2.weight",
        "model.4.weight",
    ]  # modules keep their positions
    assert len(mlp.model) == 5 and mlp.model[1] is ops.relu
    w = _fill(mlp, rng)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    ref = np.maximum(np.maximum(x @ w["model.0.weight"].T, 0) @ w["model.2.weight"].T, 0) @ w["model.4.weight"].T
    np.testing.assert_allclose(_run(mlp, x), ref, rtol=1e-4, atol=1e-4)
    seq = nn.Sequential([lambda v: v * 2.0, ops.tanh])
    assert seq.state_dict() == {}
    np.testing.assert_allclose(_run(seq, x), np.tanh(x * 2.0), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="expected a Module or a callable.*int"):
        nn.Sequential([nn.Linear(8, 8, DType.float32, CPU), 3])


def test_quantized_linear_matches_gguf_dequantize(rng):
    w = rng.normal(size=(6, 64)).astype(np.float32)
    packed = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    lin = nn.Linear(64, 6, DType.float32, CPU, quantization_encoding=QuantizationEncoding.Q4_0)
    assert list(lin.weight.shape) == [6, 36] and lin.weight.dtype is DType.uint8
    lin.load_state_dict({"weight": packed})
    x = rng.normal(size=(3, 64)).astype(np.float32)
    ref = x @ gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q4_0).T
    np.testing.assert_allclose(_run(lin, x), ref, rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="float8_config"):
        nn.Linear(4, 4, DType.float32, CPU, float8_config=object())


def test_state_dict_keys_are_the_weights_own_names():
    """As in MAX, a weight's state-dict key is its own name: an attribute ``fc1_weight``
    holding ``Weight("fc1.weight")`` loads from ``fc1.weight`` (checkpoint names need not
    be Python names), and ``strict=False`` ignores keys no weight has."""

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1_weight = Weight("fc1.weight", DType.float32, [2, 2], DeviceRef.CPU())
            self.bias = Weight("bias", DType.int32, [2], DeviceRef.CPU())

    m = Holder()
    assert set(m.state_dict()) == {"fc1.weight", "bias"}
    w = np.arange(4, dtype=np.float32).reshape(2, 2)
    m.load_state_dict(
        {"fc1.weight": w, "bias": np.array([5, 6], np.int32), "extra.key": np.zeros(2, np.float32)}, strict=False
    )
    np.testing.assert_array_equal(np.asarray(m.state_dict()["fc1.weight"]), w)
    with pytest.raises(ValueError, match="Unexpected keys in state_dict"):
        m.load_state_dict({"fc1.weight": w, "bias": np.array([5, 6], np.int32), "extra.key": w})
    conv = nn.Conv2d(
        3, in_channels=2, out_channels=4, dtype=DType.float32
    )  # its `filter` loads from a PyTorch-style `weight`
    assert set(conv.state_dict()) == {"weight"}


def test_state_dict_loading_errors():
    mlp = nn.MLP(DType.float32, None, 4, 8, [CPU])
    good = {k: np.zeros(np.shape(v), np.float32) for k, v in mlp.state_dict().items()}
    with pytest.raises(ValueError, match=r"missing weight\(s\) \['up_proj.weight'\]"):
        mlp.load_state_dict({k: v for k, v in good.items() if k != "up_proj.weight"})
    with pytest.raises(ValueError, match=r"unused key\(s\) \['extra'\]"):
        mlp.load_state_dict({**good, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match=r"'gate_proj.weight' expects float32\[8, 4\], got float32\[4, 8\]"):
        mlp.load_state_dict({**good, "gate_proj.weight": np.zeros((4, 8), np.float32)})
    assert mlp.gate_proj.weight._loaded_value is None  # nothing was bound
    mlp.load_state_dict({k: v for k, v in good.items() if k != "up_proj.weight"}, strict=False)
    with pytest.raises(ValueError, match="has no value"):
        mlp.state_dict(auto_initialize=False)
    assert set(mlp.raw_state_dict()) == set(good) and all(isinstance(v, Weight) for v in mlp.raw_state_dict().values())
    assert list(mlp.sublayers) == ["gate_proj", "down_proj", "up_proj"] and list(mlp.gate_proj.layer_weights) == [
        "weight"
    ]


def test_layer_list_subgraph_and_hooks(rng):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4, DType.float32, CPU)

        def __call__(self, x):
            return ops.relu(self.lin(x)) + x

    class Net(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.layers = nn.LayerList([Block() for _ in range(n)])

        def __call__(self, x):
            sub = self.layers[0].build_subgraph("block", [x.type], weight_prefix="layers.0.")
            for i in range(len(self.layers)):
                (x,) = ops.call(sub, x, prefix=f"layers.{i}.")
                x = x.tensor
            return x

    net = Net(3)
    w = _fill(net, rng)
    assert sorted(w) == ["layers.0.lin.weight", "layers.1.lin.weight", "layers.2.lin.weight"]
    x = rng.normal(size=(2, 4)).astype(np.float32)
    ref = x
    for i in range(3):
        ref = np.maximum(ref @ w[f"layers.{i}.lin.weight"].T, 0) + ref
    np.testing.assert_allclose(_run(net, x), ref, rtol=1e-5, atol=1e-5)
    assert [n for n, _ in nn.recursive_named_layers(net)] == [
        "",
        "layers",
        "layers.0",
        "layers.0.lin",
        "layers.1",
        "layers.1.lin",
        "layers.2",
        "layers.2.lin",
    ]

    seen = []
    nn.add_layer_hook(lambda layer, args, kwargs, out: seen.append(type(layer).__name__))
    try:
        lin = nn.Linear(4, 4, DType.float32, CPU)
        _fill(lin, rng)
        _run(lin, x)
        assert seen == ["Linear"]
        nn.add_layer_hook(lambda layer, args, kwargs, out: out * 0)  # a non-None return replaces the output
        assert (_run(lin, x) == 0).all()
    finally:
        nn.clear_hooks()


def test_module_names_and_aliases():
    assert nn.EmbeddingV2 is nn.Embedding
    assert nn.layer.Module is nn.Module and nn.linear.Linear is nn.Linear and nn.norm.RMSNorm is nn.RMSNorm
    lst = nn.LayerList([])
    lst.append(nn.Linear(2, 2, DType.float32, CPU))
    lst.insert(0, nn.Linear(2, 3, DType.float32, CPU))
    lst.extend([nn.Linear(3, 3, DType.float32, CPU)])
    assert len(lst) == 3 and list(lst.sublayers) == ["0", "1", "2"] and lst[0].out_dim == 3


def test_v1_layers_and_group_norm(rng):
    x = rng.normal(size=(3, 8)).astype(np.float32)
    w, b = rng.normal(size=(4, 8)).astype(np.float32), rng.normal(size=4).astype(np.float32)
    np.testing.assert_allclose(_run(nn.LinearV1(w, b), x), x @ w.T + b, rtol=1e-5, atol=1e-5)
    g, u, d = (rng.normal(size=s).astype(np.float32) for s in ((6, 8), (6, 8), (8, 6)))
    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    mlp = nn.MLPV1(nn.LinearV1(g), nn.LinearV1(d), nn.LinearV1(u))
    np.testing.assert_allclose(_run(mlp, x), (silu(x @ g.T) * (x @ u.T)) @ d.T, rtol=1e-4, atol=1e-4)
    table = rng.normal(size=(5, 3)).astype(np.float32)
    ids = np.array([4, 0], np.int64)
    np.testing.assert_array_equal(_run(nn.EmbeddingV1(table, CPU), ids), table[ids])
    gamma = rng.normal(size=8).astype(np.float32)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(
        _run(nn.LayerNormV1(gamma, eps=1e-6), x), (x - mu) / np.sqrt(var + 1e-6) * gamma, rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        _run(nn.ConstantLayerNorm(8, CPU, DType.float32), x), (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5
    )
    rms = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * gamma
    np.testing.assert_allclose(_run(nn.RMSNormV1(gamma), x), rms, rtol=1e-5, atol=1e-5)
    packed = gguf.quants.quantize(w.repeat(4, axis=1), gguf.GGMLQuantizationType.Q4_0)  # [4, 32] -> Q4_0
    xq = rng.normal(size=(2, 32)).astype(np.float32)
    ref = xq @ gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q4_0).T
    np.testing.assert_allclose(
        _run(nn.QLinearV1(packed, None, QuantizationEncoding.Q4_0), xq), ref, rtol=1e-4, atol=1e-3
    )

    gn = nn.GroupNorm(2, 4, device=CPU)
    st = _fill(gn, rng)
    img = rng.normal(size=(2, 4, 3, 3)).astype(np.float32)
    grp = img.reshape(2, 2, -1)
    normed = ((grp - grp.mean(-1, keepdims=True)) / np.sqrt(grp.var(-1, keepdims=True) + 1e-5)).reshape(img.shape)
    ref = normed * st["weight"][None, :, None, None] + st["bias"][None, :, None, None]
    np.testing.assert_allclose(_run(gn, img), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(3, 4)


def test_mlp_shards_sum_to_the_full_output(rng):
    mlp = nn.MLP(DType.float32, None, 4, 8, [CPU])
    st = _fill(mlp, rng)
    shards = mlp.shard([CPU, CPU])
    with Graph("s", input_types=[TensorType(DType.float32, [2, 4])]) as g:
        x = g.inputs[0].tensor
        g.output(mlp(x), shards[0](x) + shards[1](x))
    full, summed = InferenceSession().load(g, weights_registry=st).execute(rng.normal(size=(2, 4)).astype(np.float32))
    np.testing.assert_allclose(summed.to_numpy(), full.to_numpy(), rtol=1e-5, atol=1e-5)
    assert isinstance(mlp, nn.Shardable)
