"""maxfx.interop.flax: parameters between maxfx Modules and flax.nnx, both directions."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lowering.dtypes import DType
from maxfx.experimental.nn import Embedding, LayerNorm, Linear, Module, Sequential
from maxfx.experimental.tensor import Tensor
from maxfx.interop.flax import StructureMismatchError, flax_paths, from_flax, to_flax


def _x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _np_layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


# ─── single layers ─────────────────────────────────────────────────────────


@pytest.mark.parametrize("bias", [True, False])
def test_linear_to_flax(rng, bias):
    layer = Linear(4, 3, bias=bias)
    flax_layer = to_flax(layer, nnx.Linear(4, 3, use_bias=bias, rngs=nnx.Rngs(0)))
    x = _x(rng, 5, 4)
    w = layer.weight.to_numpy()
    ref = x @ w.T + (layer.bias.to_numpy() if bias else 0)
    np.testing.assert_allclose(np.asarray(flax_layer(x)), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer(Tensor(x)).to_numpy(), ref, rtol=1e-5, atol=1e-5)


def test_linear_from_flax(rng):
    flax_layer = nnx.Linear(4, 3, rngs=nnx.Rngs(1))
    flax_layer.bias[...] = jnp.arange(3.0)  # a non-zero bias, so a dropped bias would show
    layer = from_flax(flax_layer, Linear(4, 3))
    x = _x(rng, 2, 4)
    np.testing.assert_allclose(layer(Tensor(x)).to_numpy(), np.asarray(flax_layer(x)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(layer.weight.to_numpy(), np.asarray(flax_layer.kernel[...]).T)


def test_embedding_both_directions(rng):
    emb = Embedding(7, dim=3)
    flax_emb = to_flax(emb, nnx.Embed(7, 3, rngs=nnx.Rngs(0)))
    ids = np.array([[0, 6, 2], [3, 3, 1]], np.int32)
    np.testing.assert_array_equal(np.asarray(flax_emb(ids)), emb.weight.to_numpy()[ids])
    other = nnx.Embed(7, 3, rngs=nnx.Rngs(5))
    from_flax(other, emb)
    np.testing.assert_array_equal(emb(Tensor(ids, dtype=DType.int32)).to_numpy(), np.asarray(other(ids)))


def test_layer_norm_both_directions(rng):
    norm = LayerNorm(6)
    norm.weight = Tensor(_x(rng, 6))
    norm.bias = Tensor(_x(rng, 6))
    flax_norm = to_flax(norm, nnx.LayerNorm(6, epsilon=1e-5, rngs=nnx.Rngs(0)))
    x = _x(rng, 3, 6)
    ref = _np_layer_norm(x, norm.weight.to_numpy(), norm.bias.to_numpy(), 1e-5)
    np.testing.assert_allclose(np.asarray(flax_norm(x)), ref, rtol=1e-4, atol=1e-5)
    flax_norm.scale[...] = jnp.full(6, 2.0)
    back = from_flax(flax_norm, LayerNorm(6))
    np.testing.assert_allclose(back(Tensor(x)).to_numpy(), np.asarray(flax_norm(x)), rtol=1e-4, atol=1e-5)
    assert flax_paths(back, flax_norm) == {"weight": "scale", "bias": "bias"}


def test_layer_norm_eps_mismatch_is_an_error():
    with pytest.raises(StructureMismatchError, match=r"eps=1e-05.*epsilon=1e-06"):
        to_flax(LayerNorm(4), nnx.LayerNorm(4, rngs=nnx.Rngs(0)))  # nnx's default epsilon is 1e-6


# ─── Sequential, custom modules, states ─────────────────────────────────────


def _pair():
    ours = Sequential(Linear(4, 8), LayerNorm(8), Linear(8, 2))
    theirs = nnx.Sequential(
        nnx.Linear(4, 8, rngs=nnx.Rngs(0)),
        nnx.LayerNorm(8, epsilon=1e-5, rngs=nnx.Rngs(0)),
        nnx.Linear(8, 2, rngs=nnx.Rngs(1)),
    )
    return ours, theirs


def test_sequential_both_directions(rng):
    ours, theirs = _pair()
    x = _x(rng, 5, 4)
    to_flax(ours, theirs)
    np.testing.assert_allclose(np.asarray(theirs(x)), ours(Tensor(x)).to_numpy(), rtol=1e-4, atol=1e-5)
    assert flax_paths(ours, theirs)["2.weight"] == "layers/2/kernel"
    fresh = Sequential(Linear(4, 8), LayerNorm(8), Linear(8, 2))
    from_flax(nnx.state(theirs), fresh)
    np.testing.assert_allclose(fresh(Tensor(x)).to_numpy(), np.asarray(theirs(x)), rtol=1e-4, atol=1e-5)


def test_state_and_dict_targets_are_copies():
    ours, theirs = _pair()
    state = nnx.state(theirs, nnx.Param)
    before = np.asarray(state["layers"][0]["kernel"][...])
    new_state = to_flax(ours, state)
    np.testing.assert_array_equal(np.asarray(state["layers"][0]["kernel"][...]), before)  # caller's state untouched
    np.testing.assert_array_equal(np.asarray(new_state["layers"][0]["kernel"][...]), ours[0].weight.to_numpy().T)
    pure = to_flax(ours, nnx.to_pure_dict(state))
    np.testing.assert_array_equal(np.asarray(pure["layers"][1]["scale"]), ours[1].weight.to_numpy())
    # A pure dict also loads back into a maxfx module.
    fresh = from_flax(pure, Sequential(Linear(4, 8), LayerNorm(8), Linear(8, 2)))
    np.testing.assert_array_equal(fresh[2].bias.to_numpy(), ours[2].bias.to_numpy())


class Block(Module):
    def __init__(self):
        self.embed = Embedding(10, dim=4)
        self.layers = [Linear(4, 4), Linear(4, 4)]
        self.norm = LayerNorm(4)

    def forward(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class FlaxBlock(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Embed(10, 4, rngs=rngs)
        self.layers = nnx.List([nnx.Linear(4, 4, rngs=rngs), nnx.Linear(4, 4, rngs=rngs)])
        self.norm = nnx.LayerNorm(4, epsilon=1e-5, rngs=rngs)

    def __call__(self, ids):
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


def test_custom_module_with_list_attribute():
    ours, theirs = Block(), FlaxBlock(nnx.Rngs(3))
    ids = np.array([1, 9, 4], np.int64)
    from_flax(theirs, ours)
    np.testing.assert_allclose(
        ours(Tensor(ids, dtype=DType.int64)).to_numpy(), np.asarray(theirs(ids)), rtol=1e-4, atol=1e-5
    )
    assert flax_paths(ours, theirs)["layers.1.weight"] == "layers/1/kernel"


# ─── mismatches ────────────────────────────────────────────────────────────


def test_missing_key_names_the_path():
    with pytest.raises(StructureMismatchError, match=r"'bias'.*missing at '<root>'"):
        to_flax(Linear(4, 3), nnx.Linear(4, 3, use_bias=False, rngs=nnx.Rngs(0)))


def test_extra_key_names_the_path():
    with pytest.raises(StructureMismatchError, match=r"extra key\(s\) \['bias'\]"):
        from_flax(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), Linear(4, 3, bias=False))


def test_shape_mismatch_names_both_sides():
    ours = Sequential(Linear(4, 8), Linear(8, 2))
    theirs = nnx.Sequential(nnx.Linear(4, 8, rngs=nnx.Rngs(0)), nnx.Linear(8, 3, rngs=nnx.Rngs(0)))
    with pytest.raises(
        StructureMismatchError,
        match=r"'1.weight' expects float32\[2, 8\], got float32\[3, 8\].*flax 'layers/1/kernel' is float32\[8, 3\]",
    ):
        to_flax(ours, theirs)


def test_dtype_mismatch_leaves_module_unchanged():
    layer = Linear(4, 3)
    before = layer.weight.to_numpy().copy()
    theirs = nnx.Linear(4, 3, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    with pytest.raises(
        StructureMismatchError, match=r"'weight' expects float32.*dtype mismatch: expected float32, got bfloat16"
    ):
        from_flax(theirs, layer)
    np.testing.assert_array_equal(layer.weight.to_numpy(), before)


def test_sequential_length_mismatch():
    ours = Sequential(Linear(2, 2), Linear(2, 2))
    theirs = nnx.Sequential(*[nnx.Linear(2, 2, rngs=nnx.Rngs(0)) for _ in range(3)])
    with pytest.raises(StructureMismatchError, match=r"extra key\(s\) \['2'\] at 'layers'"):
        from_flax(theirs, ours)


def test_wrong_argument_types():
    with pytest.raises(TypeError, match="nnx.Module, nnx.State or nested dict"):
        to_flax(Linear(2, 2), [1, 2])
    with pytest.raises(TypeError, match="experimental.nn Module"):
        to_flax(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
