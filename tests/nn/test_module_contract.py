"""The eager Module's pytree contract: fields per class, static_field, pytrees of Tensors as data, warnings."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.experimental.nn import LayerNorm, Linear, Module, StaticFieldWarning, module_dataclass, static_field
from maxfx.experimental.tensor import Tensor


def _t(values) -> Tensor:
    return Tensor(np.asarray(values, np.float32))


def _keys(module) -> list[str]:
    """Parameter names as JAX spells the leaf paths (``.ws[0]`` → ``ws.0``)."""
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(module, is_leaf=lambda x: isinstance(x, Tensor))[0]:
        out.append(".".join(str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k)))) for k in path))
    return out


# ─── one executable for every instance of a class ───────────────────────────


@dataclasses.dataclass(frozen=True)
class _Config:
    width: int
    act: str = "relu"


class _Plain(Module):
    """A plain subclass: its fields are the attributes __init__ sets."""

    def __init__(self, config: _Config, seed: float):
        self.config = config
        self.scale = 2.0
        self.weight = _t(np.full([config.width], seed))
        self.biases = [_t(np.full([config.width], seed + 1)), _t(np.full([config.width], seed + 2))]

    def forward(self, x):
        return x * self.weight * self.scale + self.biases[0] + self.biases[1]


def test_two_instances_share_one_jit_executable():
    jitted = jax.jit(lambda m, x: m(x))
    x = _t([1.0, 2.0, 3.0])
    a, b = _Plain(_Config(3), 1.0), _Plain(_Config(3), 5.0)  # equal configs, different objects and weights
    np.testing.assert_allclose(jitted(a, x).to_numpy(), np.array([1.0, 2.0, 3.0]) * 1.0 * 2.0 + 2.0 + 3.0)
    np.testing.assert_allclose(jitted(b, x).to_numpy(), np.array([1.0, 2.0, 3.0]) * 5.0 * 2.0 + 6.0 + 7.0)
    assert jitted._cache_size() == 1
    # The built-in layers too (LayerNorm's eps, Linear's literal bias=0 are static values).
    for make in (lambda: LayerNorm(3), lambda: Linear(3, 2, bias=False)):
        f = jax.jit(lambda m, x: m(x))
        f(make(), x)
        f(make(), x)
        assert f._cache_size() == 1
    # A different static value is a different program.
    c = _Plain(_Config(3, act="gelu"), 1.0)
    jitted(c, x)
    assert jitted._cache_size() == 2


def test_static_fields_compare_by_value():
    structure = jax.tree_util.tree_structure
    assert structure(_Plain(_Config(3), 0.0)) == structure(_Plain(_Config(3), 1.0))
    assert structure(_Plain(_Config(3), 0.0)) != structure(_Plain(_Config(4), 0.0))

    @module_dataclass
    class Pool(Module):
        weight: Tensor
        sizes: list = static_field(default_factory=lambda: [2, 2])
        mode: str = static_field(default="max")

        def forward(self, x):
            return x

    # A list in a static field is compared by value (two equal lists are different objects).
    assert structure(Pool(_t([1.0]))) == structure(Pool(_t([2.0])))
    assert structure(Pool(_t([1.0]), [2, 2])) != structure(Pool(_t([1.0]), [3, 3]))
    assert structure(Pool(_t([1.0]), mode="avg")) != structure(Pool(_t([1.0])))
    # Static values are not leaves, and come back unchanged from a round trip through JAX.
    p = Pool(_t([1.0]), [4, 5], "avg")
    assert len(jax.tree_util.tree_leaves(p)) == 1
    q = jax.tree.map(lambda a: a + 1, p)
    assert (q.sizes, q.mode) == ([4, 5], "avg") and q.weight.to_numpy().tolist() == [2.0]


# ─── the static marker ──────────────────────────────────────────────────────


def test_static_field_marks_a_plain_subclass_attribute():
    class Frozen(Module):
        table = static_field()  # a constant lookup table: not trained, part of the structure

        def __init__(self):
            self.table = ((0, 1), (1, 0))
            self.weight = _t([1.0, 2.0])

    m = Frozen()
    assert [n for n, _ in m.parameters] == ["weight"] and len(jax.tree_util.tree_leaves(m)) == 1
    assert jax.jit(lambda m: m.weight * len(m.table))(m).to_numpy().tolist() == [2.0, 4.0]


def test_dataclass_metadata_static_is_the_same_marker():
    @module_dataclass
    class Tagged(Module):
        weight: Tensor
        frozen_weight: Tensor = dataclasses.field(default=None, metadata={"static": True})

    with pytest.warns(StaticFieldWarning, match=r"Tagged.frozen_weight holds a Tensor in a static field"):
        m = Tagged(_t([1.0]), _t([2.0]))
        assert [n for n, _ in m.parameters] == ["weight"]
    assert len(jax.tree_util.tree_leaves(m)) == 1


# ─── pytrees of Tensors are data ────────────────────────────────────────────


def test_a_list_of_tensors_is_a_parameter_list():
    class Mixture(Module):
        def __init__(self):
            self.experts = [_t([1.0, 2.0]), _t([3.0, 4.0])]
            self.gates = {"a": _t([0.5]), "b": _t([0.25])}
            self.pair = (_t([1.0]), 7)  # a tuple may hold static leaves too
            self.heads = [Linear(2, 1), None]

        def forward(self, x):
            return x

    m = Mixture()
    names = [n for n, _ in m.parameters]
    assert names == ["experts.0", "experts.1", "gates.a", "gates.b", "pair.0", "heads.0.weight", "heads.0.bias"]
    assert _keys(m) == names  # the pytree's leaves are exactly the parameters, in the same order
    assert [n for n, _ in m.children] == ["heads.0"]
    assert set(m.state_dict()) == set(names)

    state = {n: np.full([int(d) for d in t.shape], 9.0, np.float32) for n, t in m.parameters}
    m.load_state_dict(state)
    assert m.experts[1].to_numpy().tolist() == [9.0, 9.0] and m.gates["b"].to_numpy().tolist() == [9.0]
    assert isinstance(m.pair, tuple) and m.pair[1] == 7 and m.pair[0].to_numpy().tolist() == [9.0]
    assert m.heads[1] is None

    # Gradients flow to every Tensor of the list, and come back in the same structure.
    def loss(m):
        return jnp.sum(m.experts[0] * m.experts[1]._array()) + jnp.sum(m.gates["a"]._array())

    m.experts = [_t([1.0, 2.0]), _t([3.0, 4.0])]
    g = jax.grad(loss)(m)
    assert isinstance(g, Mixture) and isinstance(g.experts, list)
    np.testing.assert_allclose(g.experts[0].to_numpy(), [3.0, 4.0])
    np.testing.assert_allclose(g.experts[1].to_numpy(), [1.0, 2.0])
    np.testing.assert_allclose(g.gates["a"].to_numpy(), [1.0])


def test_private_attributes_are_static_everywhere():
    class Cached(Module):
        def __init__(self):
            self.weight = _t([1.0])
            self._calls = 0

    m = Cached()
    assert [n for n, _ in m.parameters] == ["weight"] and _keys(m) == ["weight"]
    assert jax.tree.map(lambda a: a, m)._calls == 0


# ─── warnings for arrays and unhashable values in static places ─────────────


def test_numpy_array_in_a_data_field_warns_once():
    class Masked(Module):
        def __init__(self):
            self.weight = _t([1.0, 2.0])
            self.mask = np.array([1.0, 0.0], np.float32)

    with pytest.warns(
        StaticFieldWarning, match=r"Masked.mask holds a numpy array in a data field.*Tensor\(\.\.\.\)"
    ) as record:
        jax.tree_util.tree_leaves(Masked())
    assert record[0].filename == __file__  # points at the user's line, not at maxfx or JAX
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax.tree_util.tree_leaves(Masked())  # once per class and field
    # Compared by content: equal masks share one executable.
    f = jax.jit(lambda m: m.weight * m.mask)
    f(Masked())
    f(Masked())
    assert f._cache_size() == 1


def test_jax_array_and_unhashable_values_in_static_places_warn():
    @module_dataclass
    class Holder(Module):
        weight: Tensor
        table: object = static_field(default=None)

    with pytest.warns(StaticFieldWarning, match=r"Holder.table holds a JAX array in a static field"):
        jax.tree_util.tree_structure(Holder(_t([1.0]), jnp.ones(2)))

    @dataclasses.dataclass  # eq=True without frozen=True: no __hash__
    class Settings:
        depth: int

    @module_dataclass
    class Configured(Module):
        weight: Tensor
        settings: Settings = static_field(default=None)

    with pytest.warns(StaticFieldWarning, match=r"Configured.settings holds an unhashable Settings"):
        a = jax.tree_util.tree_structure(Configured(_t([1.0]), Settings(2)))
    # Still compared by value (hashed by type), so equal settings share a structure.
    assert a == jax.tree_util.tree_structure(Configured(_t([5.0]), Settings(2)))
    assert a != jax.tree_util.tree_structure(Configured(_t([5.0]), Settings(3)))


def test_hashable_static_values_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = _Plain(_Config(2), 0.0)
        jax.tree_util.tree_structure(m)
        jax.tree_util.tree_structure(LayerNorm(2))
        jax.tree_util.tree_structure(Linear(2, 2, bias=False))
