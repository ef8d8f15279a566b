"""The eager Module layer (maxfx.experimental.nn = maxfx.nn.module_v3): seed 001/003 examples and behaviour."""

from __future__ import annotations

import textwrap

import jax
import numpy as np
import pytest

from lowering.compile import clear_cache, compile_stats
from maxfx.driver import CPU
from maxfx.dtype import DType
from maxfx.experimental import nn as exp_nn
from maxfx.experimental.tensor import Tensor, TensorType
from maxfx.nn import module_v3
from maxfx.nn.module_v3 import Embedding, LayerNorm, Linear, Module, ModuleList, Sequential, module_dataclass

# ─── seed examples (indentation restored; imports renamed max → maxfx) ──────

SEED_EXAMPLES = {
    "001_linear_dataclass": """
        from maxfx.experimental.tensor import Tensor
        from maxfx.experimental.nn import Module, module_dataclass

        @module_dataclass
        class Linear(Module):
            weight: Tensor
            bias: Tensor | int = 0

            def forward(self, x: Tensor) -> Tensor:
                return x @ self.weight.T + self.bias

        linear = Linear(Tensor.zeros([5, 4]))
        print(linear)
        print(linear(Tensor([1, 2, 3, 4])))
    """,
    "003_linear_call": """
        from maxfx.experimental.tensor import Tensor
        from maxfx.nn.module_v3 import Module, module_dataclass

        @module_dataclass
        class Linear(Module):
            weight: Tensor
            bias: Tensor | int = 0

            def __call__(self, x: Tensor) -> Tensor:
                return x @ self.weight.T + self.bias

        linear = Linear(Tensor.zeros([5, 4]))
        print(linear)
        print(linear(Tensor([1, 2, 3, 4])))
    """,
    "001_device": """
        from maxfx.experimental.nn import Linear
        model = Linear(2, 3)
        print(model.device)  # CPU() — CPU default
    """,
    "001_compile_fixed_shape": """
        from maxfx.dtype import DType
        from maxfx.experimental.tensor import Tensor, TensorType, defaults
        from maxfx.experimental.nn import Module, module_dataclass

        @module_dataclass
        class Linear(Module):
            weight: Tensor
            bias: Tensor

            def forward(self, x: Tensor) -> Tensor:
                return x @ self.weight.T + self.bias

        linear = Linear(
            weight=Tensor.zeros([10, 5]),
            bias=Tensor.zeros([10])
        )
        _, device = defaults()
        input_type = TensorType(DType.float32, [3, 5], device=device)
        model = linear.compile(input_type)
        input_data = Tensor.ones([3, 5], dtype=DType.float32)
        result = model(input_data)
        print(result)
    """,
    "001_input_types_compile": """
        from maxfx.experimental.nn import Linear
        model = Linear(10, 5)
        compiled = model.compile(*model.input_types())  # runs on CPU
    """,
    "001_load_state_two_args": """
        from maxfx.experimental.tensor import Tensor
        from maxfx.experimental.nn import Linear
        model = Linear(2, 3)
        weights = {
            "weight": Tensor.zeros([3, 2]),
            "bias": Tensor.zeros([3]),
        }
        model.load_state(lambda name, _: weights[name])
        assert model.weight.to_numpy().sum() == 0
    """,
    "001_mlp_parameters": """
        from maxfx.experimental.tensor import Tensor
        from maxfx.experimental.nn import Module, module_dataclass
        from maxfx.experimental.nn import Linear

        @module_dataclass
        class MLP(Module):
            fc1: Linear
            fc2: Linear

            def forward(self, x: Tensor) -> Tensor:
                return self.fc2(self.fc1(x))

        model = MLP(
            fc1=Linear(10, 20),
            fc2=Linear(20, 5)
        )
        total_params = sum(
            param.num_elements()
            for name, param in model.parameters
        )
        print(total_params)
        print({name for name, _ in model.parameters} == {'fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias'})
    """,
    "003_embedding": """
        from maxfx.dtype import DType
        from maxfx.experimental.tensor import Tensor
        from maxfx.nn.module_v3 import Embedding

        embedding = Embedding(vocab_size=1000, dim=128)
        tokens = Tensor.ones([10], dtype=DType.uint64)
        embedded = embedding(tokens)
        assert embedded.shape == [10, 128]

        embedding = Embedding(vocab_size=1000, dims=[16, 128])
        embedded = embedding(tokens)
        assert embedded.shape == [10, 16, 128]
    """,
    "003_linear": """
        from maxfx.experimental.tensor import Tensor
        from maxfx.nn.module_v3 import Linear

        model = Linear(5, 10)

        assert dict(model.parameters) == {
            "weight": model.weight, "bias": model.bias
        }

        result = model(Tensor.ones([5]))
        assert result.shape == [10]
    """,
    "003_compile_symbolic": """
        from maxfx.dtype import DType
        from maxfx.experimental import random
        from maxfx.experimental.tensor import Tensor, TensorType, defaults
        from maxfx.nn.module_v3 import Linear

        linear = Linear(2, 3)
        _, device = defaults()
        input_type = TensorType(DType.float32, ["batch", 2], device=device)
        model = linear.compile(input_type)

        print(model(random([3, 2], dtype=DType.float32)).shape)   # doc bug: `random` is a module (API_INVENTORY §6 #18)
        print(model(random([10, 2], dtype=DType.float32)).shape)
    """,
    "003_load_state": """
        from maxfx.experimental.tensor import Tensor
        from maxfx.nn.module_v3 import Linear

        model = Linear(2, 3)
        weights = {
            "weight": Tensor.zeros([3, 2]),
            "bias": Tensor.zeros([3]),
        }
        model.load_state(weights.__getitem__)
        model.load_state(weights)
    """,
    "003_sequential": """
        from maxfx.experimental import Tensor
        from maxfx.nn.module_v3 import LayerNorm, Linear, Sequential

        model = Sequential(
            Linear(5, 10),
            LayerNorm(10),
            Linear(10, 5),
        )

        result = model(Tensor.ones([5]))
        assert result.shape == [5]

        hidden_dims = [5, 10, 15, 20]

        model = Sequential(*(
            Linear(in_dim, out_dim) for in_dim, out_dim in
            zip(hidden_dims, hidden_dims[1:])
        ))
        assert [n for n, _ in model.parameters][-1] == "2.bias"
    """,
}

EXPECTED_OUTPUT = {
    # MAX's module_dataclass repr (rich): bias=0 equals its default, so it is omitted; the Tensor prints as its type
    "001_linear_dataclass": "Linear(weight=Tensor(dtype=float32, shape=[5, 4], device=cpu:0))\n"
    "TensorType(dtype=float32, shape=[Dim(5)], device=cpu:0): [0.0, 0.0, 0.0, 0.0, 0.0]\n",
    "001_device": "CPU()\n",
    "001_compile_fixed_shape": "TensorType(dtype=float32, shape=[Dim(3), Dim(10)], device=cpu:0): "
    + str([0.0] * 30)
    + "\n",  # printed flat, as MAX does
    "001_mlp_parameters": "325\nTrue\n",
    "003_compile_symbolic": "[Dim(3), Dim(3)]\n[Dim(10), Dim(3)]\n",
}


@pytest.mark.parametrize("name", sorted(SEED_EXAMPLES))
def test_seed_example(name, capsys):
    exec(compile(textwrap.dedent(SEED_EXAMPLES[name]), f"<{name}>", "exec"), {})  # noqa: S102 - seed examples
    out = capsys.readouterr().out
    if name in EXPECTED_OUTPUT:
        assert out == EXPECTED_OUTPUT[name]
    if name == "003_linear_call":
        assert out.endswith(": [0.0, 0.0, 0.0, 0.0, 0.0]\n")


# ─── behaviour ───────────────────────────────────────────────────────────


def test_same_classes_under_both_names():
    assert module_v3.Linear is exp_nn.Linear and module_v3.Module is exp_nn.Module
    assert Module[[Tensor], Tensor] is Module


@module_dataclass
class _MLP(Module):
    fc1: Linear
    fc2: Linear

    def forward(self, x):
        return self.fc2(exp_relu(self.fc1(x)))


def exp_relu(x):
    from maxfx import functional as F

    return F.relu(x)


def _mlp():
    return _MLP(fc1=Linear(4, 8), fc2=Linear(8, 3))


def _np_forward(m, x):
    h = np.maximum(x @ m.fc1.weight.to_numpy().T + m.fc1.bias.to_numpy(), 0)
    return h @ m.fc2.weight.to_numpy().T + m.fc2.bias.to_numpy()


def test_layers_against_numpy(rng):
    m = _mlp()
    x = rng.normal(size=(5, 4)).astype(np.float32)
    np.testing.assert_allclose(m(Tensor(x)).to_numpy(), _np_forward(m, x), rtol=1e-5, atol=1e-6)
    norm = LayerNorm(4)
    expect = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(norm(Tensor(x)).to_numpy(), expect, rtol=1e-5, atol=1e-5)
    emb = Embedding(6, dim=3)
    ids = np.array([[0, 5], [2, 2]], np.int64)
    np.testing.assert_array_equal(emb(Tensor(ids)).to_numpy(), emb.weight.to_numpy()[ids])
    nobias = Linear(4, 2, bias=False)
    assert nobias.bias == 0 and [n for n, _ in nobias.parameters] == ["weight"]
    np.testing.assert_allclose(nobias(Tensor(x)).to_numpy(), x @ nobias.weight.to_numpy().T, rtol=1e-5, atol=1e-6)
    w = Linear(100, 50).weight.to_numpy()
    assert np.abs(w).max() <= 0.1 and w.std() > 0.03  # uniform in ±1/sqrt(in_dim)


def test_tree_walks():
    m = Sequential(_mlp(), ModuleList([Linear(3, 3), Linear(3, 3)]))
    assert [n for n, _ in m.children] == ["0", "1"]
    assert [n for n, _ in m.descendants] == ["0", "0.fc1", "0.fc2", "1", "1.0", "1.1"]
    assert list(m.descendents) == list(m.descendants)
    names = [n for n, _ in m.parameters]
    assert names[:4] == ["0.fc1.weight", "0.fc1.bias", "0.fc2.weight", "0.fc2.bias"] and names[-1] == "1.1.bias"
    assert [n for n, _ in m[0].fc1.local_parameters] == ["weight", "bias"]
    assert set(m.state_dict()) == set(names)


def test_compile_symbolic_batch_matches_eager(rng):
    m = _mlp()
    compiled = m.compile(TensorType(DType.float32, ["batch", 4]))
    for batch in (1, 5, 64):
        x = rng.normal(size=(batch, 4)).astype(np.float32)
        np.testing.assert_allclose(compiled(Tensor(x)).to_numpy(), _np_forward(m, x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="input 0"):
        compiled(Tensor.ones([2, 5]))
    with pytest.raises(TypeError, match="forward takes 1 positional"):
        m.compile(TensorType(DType.float32, [1, 4]), TensorType(DType.float32, [1, 4]))
    # weights= overrides the parameters' values (e.g. from a checkpoint on the CPU)
    zeros = {n: np.zeros([int(d) for d in t.shape], np.float32) for n, t in m.parameters}
    out = m.compile(TensorType(DType.float32, [2, 4]), weights=zeros)(Tensor.ones([2, 4]))
    np.testing.assert_array_equal(out.to_numpy(), np.zeros((2, 3), np.float32))


def test_load_state_dict_errors_leave_the_module_unchanged():
    m = _mlp()
    before = {n: t.to_numpy().copy() for n, t in m.parameters}
    good = {n: np.ones([int(d) for d in t.shape], np.float32) for n, t in m.parameters}
    with pytest.raises(KeyError, match="fc2.bias"):
        m.load_state_dict({k: v for k, v in good.items() if k != "fc2.bias"})
    with pytest.raises(ValueError, match="unexpected key.*extra"):
        m.load_state_dict({**good, "extra": np.ones(1, np.float32)})
    bad = dict(good, **{"fc1.weight": np.ones((4, 8), np.float32)})
    with pytest.raises(ValueError, match=r"'fc1.weight' expects float32\[8, 4\], got float32\[4, 8\]"):
        m.load_state_dict(bad)
    for n, t in m.parameters:
        np.testing.assert_array_equal(t.to_numpy(), before[n])
    m.load_state_dict({**good, "extra": np.ones(1, np.float32)}, strict=False)
    assert all((t.to_numpy() == 1).all() for _, t in m.parameters)


def test_map_and_apply_parameters():
    m = _mlp()
    doubled = m.map_parameters(lambda _, t: t * 2)
    assert doubled is not m and doubled.fc1 is not m.fc1
    np.testing.assert_allclose(doubled.fc1.weight.to_numpy(), 2 * m.fc1.weight.to_numpy())
    seen = []
    m.apply_to_parameters(lambda name, t: (seen.append(name), t + 1)[1])
    assert seen == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    m.fc1.apply_to_local_parameters(lambda name, t: t * 0)
    assert m.fc1.weight.to_numpy().sum() == 0
    assert m.to(CPU()) is m and m.device == CPU() and m.fc1.device == CPU()


def test_modules_are_pytrees(rng):
    m = _mlp()
    leaves = jax.tree_util.tree_leaves(m)
    assert len(leaves) == 4 and all(isinstance(a, jax.Array) for a in leaves)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    out = jax.jit(lambda mod, x: mod(x))(m, Tensor(x))
    np.testing.assert_allclose(out.to_numpy(), _np_forward(m, x), rtol=1e-5, atol=1e-5)

    import jax.numpy as jnp

    def loss(mod, x):
        return jnp.sum(mod(x))

    grads = jax.grad(loss)(m, Tensor(x))
    assert isinstance(grads, _MLP)
    # d sum(W2 h + b2) / d b2 = batch size for each output
    np.testing.assert_allclose(grads.fc2.bias.to_numpy(), np.full(3, 2.0), rtol=1e-6)


def test_forward_must_be_defined():
    class Empty(Module):
        pass

    with pytest.raises(NotImplementedError, match="Empty must define forward"):
        Empty()(Tensor.ones([1]))


def _np_layer_norm(x, w, b, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


def _np_gelu(x):
    from math import erf, sqrt

    return 0.5 * x * (1 + np.vectorize(erf)(x / sqrt(2)))


def test_use_subgraphs_compiles_a_sequential_of_identical_blocks_once(rng):
    from maxfx import functional as F

    @module_dataclass
    class Block(Module):
        norm: LayerNorm
        up: Linear
        down: Linear

        def forward(self, x):
            return x + self.down(F.gelu(self.up(self.norm(x))))

    @module_dataclass
    class Net(Module):
        blocks: Sequential
        head: Linear

        def forward(self, x):
            return self.head(self.blocks(x))

    def np_net(net, x):
        p = {n: t.to_numpy() for n, t in net.parameters}
        for i in range(len(net.blocks)):
            b = f"blocks.{i}."
            h = _np_layer_norm(x, p[b + "norm.weight"], p[b + "norm.bias"]) @ p[b + "up.weight"].T + p[b + "up.bias"]
            x = x + _np_gelu(h) @ p[b + "down.weight"].T + p[b + "down.bias"]
        return x @ p["head.weight"].T + p["head.bias"]

    net = Net(
        blocks=Sequential(*[Block(LayerNorm(8), Linear(8, 16), Linear(16, 8)) for _ in range(4)]), head=Linear(8, 3)
    )
    x = rng.normal(size=(5, 8)).astype(np.float32)
    in_type = TensorType(DType.float32, ["batch", 8])
    clear_cache()
    grouped = net.compile(in_type, use_subgraphs=True)
    before = compile_stats()["compiles"]
    np.testing.assert_allclose(grouped(Tensor(x)).to_numpy(), np_net(net, x), rtol=1e-4, atol=1e-4)
    # One executable for the four blocks (one subgraph), one for the head; a new batch size compiles both again.
    assert compile_stats()["compiles"] - before == 2
    calls = [n for n in grouped.model._compiled.block.nodes if n.op == "call"]
    assert [n.params["prefix"] for n in calls] == [f"blocks.{i}." for i in range(4)]
    assert len({id(n.params["block"]) for n in calls}) == 1 and str(calls[0].params["block"]).count("layer_norm(") == 1
    # The blocks read their own weights under their own names: nothing stacked or copied.
    assert sorted(grouped.model._compiled.weights) == sorted(n for n, _ in net.parameters)
    x2 = rng.normal(size=(3, 8)).astype(np.float32)
    np.testing.assert_allclose(grouped(Tensor(x2)).to_numpy(), np_net(net, x2), rtol=1e-4, atol=1e-4)
    # Off by default: the Sequential is traced as written, block by block.
    unrolled = str(net.compile(in_type).model._compiled.block)
    assert "call(" not in unrolled and unrolled.count("layer_norm(") == 4
    # Blocks that differ (in class, or in a static field such as eps) are traced as written too.
    mixed = Sequential(Linear(8, 8), LayerNorm(8))
    assert "call(" not in str(
        mixed.compile(TensorType(DType.float32, [2, 8]), use_subgraphs=True).model._compiled.block
    )
    eps = Sequential(LayerNorm(8), LayerNorm(8, eps=1e-3))
    assert "call(" not in str(eps.compile(TensorType(DType.float32, [2, 8]), use_subgraphs=True).model._compiled.block)


def test_use_subgraphs_leaves_a_sequential_subclass_with_its_own_forward_alone():
    class Residual(Sequential):
        def forward(self, x):
            return x + super().forward(x)

    net = Residual(Linear(4, 4), Linear(4, 4))
    x = np.ones((2, 4), np.float32)
    compiled = net.compile(TensorType(DType.float32, [2, 4]), use_subgraphs=True)
    assert "call(" not in str(compiled.model._compiled.block)
    expect = x
    for layer in net:
        expect = expect @ layer.weight.to_numpy().T + layer.bias.to_numpy()
    np.testing.assert_allclose(compiled(Tensor(x)).to_numpy(), x + expect, rtol=1e-5, atol=1e-5)


def test_use_subgraphs_on_the_sequential_itself_and_with_weight_overrides(rng):
    net = Sequential(Linear(4, 4), Linear(4, 4), Linear(4, 4))
    other = {n: rng.normal(size=tuple(int(d) for d in t.shape)).astype(np.float32) for n, t in net.parameters}
    compiled = net.compile(TensorType(DType.float32, [2, 4]), weights=other, use_subgraphs=True)
    pieces = compiled.model._compiled._pieces.pieces  # three calls of one subgraph, nothing else to run
    assert [[n.op for n in p.nodes] for p in pieces] == [["call"]] * 3 and len(
        {p.block.structure_key() for p in pieces}
    ) == 1
    x = rng.normal(size=(2, 4)).astype(np.float32)
    expect = x
    for i in range(3):
        expect = expect @ other[f"{i}.weight"].T + other[f"{i}.bias"]
    np.testing.assert_allclose(compiled(Tensor(x)).to_numpy(), expect, rtol=1e-5, atol=1e-5)


def test_compile_weights_override_is_checked():
    m = _mlp()
    with pytest.raises(
        ValueError, match=r"compile\(weights=...\): weight 'fc1.weight' expects float32\[8, 4\], got float32\[4, 8\]"
    ):
        m.compile(TensorType(DType.float32, [2, 4]), weights={"fc1.weight": np.zeros((4, 8), np.float32)})
    with pytest.raises(ValueError, match="unknown parameter name.*'fc9.weight'"):
        m.compile(TensorType(DType.float32, [2, 4]), weights={"fc9.weight": np.zeros((4, 8), np.float32)})


def test_module_v3_path_has_every_experimental_nn_name():
    """MAX 26.1's ``max.nn.module_v3`` path (docstrings still use it, e.g. Conv3d's): the same objects."""
    import maxfx.experimental.nn as experimental_nn

    assert sorted(module_v3.__all__) == sorted(experimental_nn.__all__)
    assert all(getattr(module_v3, n) is getattr(experimental_nn, n) for n in experimental_nn.__all__)
