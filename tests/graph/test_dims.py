"""Dim algebra, Shape equality and printing (MAX formats)."""

import pytest

from maxfx.graph import AlgebraicDim, Dim, Shape, StaticDim, SymbolicDim


def test_factory_returns_the_right_kind():
    assert isinstance(Dim(5), StaticDim)
    assert isinstance(Dim("batch"), SymbolicDim)
    assert isinstance(Dim("batch") * 5, AlgebraicDim)
    assert Dim(Dim(3)) == 3


def test_reprs_and_strs():
    assert repr(Dim(5)) == "Dim(5)"
    assert repr(Dim("batch")) == "Dim('batch')"
    assert str(Dim("batch") * 5) == "batch * 5"
    assert str(Dim("x") + 4) == "x + 4"
    assert str(-(Dim("x") + 4)) == "-x - 4"


def test_canonical_forms_compare_equal():
    x = Dim("x")
    assert -x - 4 == -(x + 4)
    assert x + x == x * 2
    assert (x * 3 + 1) - 1 == 3 * x
    assert x - x == 0 and isinstance(x - x, StaticDim)
    assert (x * 4 + 8) // 4 == x + 2
    assert Dim(7) // 2 == 3 and Dim(7) % 2 == 1


def test_static_dim_behaves_like_int():
    d = StaticDim(3)
    assert int(d) == 3 and d.dim == 3 and d == 3 and hash(d) == hash(3)
    assert [10, 20, 30, 40][d] == 40


def test_evaluate_and_parameters():
    e = Dim("a") * Dim("b") + 1
    assert e.evaluate({"a": 2, "b": 5}) == 11
    assert sorted(p.name for p in e.parameters) == ["a", "b"]
    with pytest.raises(ValueError, match="'a'"):
        e.evaluate({"b": 1})


def test_invalid_dims():
    with pytest.raises(TypeError):
        Dim(1.5)
    with pytest.raises(ValueError):
        SymbolicDim("not an identifier")


def test_algebraic_apply():
    assert AlgebraicDim.apply("mul", "batch", 5) == Dim("batch") * 5
    assert AlgebraicDim.apply("add", 1, 2, 3) == 6


def test_shape_equality_with_lists_and_tuples():
    s = Shape([2, "batch"])
    assert s == [2, "batch"] and s == (2, "batch") and s != [2, 3]
    assert repr(s) == "[Dim(2), Dim('batch')]"
    assert s.rank == 2 and s.static_dims == [2]
    assert not Shape.is_static(s) and Shape.is_static([1, 2])
    assert [p.name for p in s.parameters] == ["batch"]


def test_dims_map_onto_jax_symbolic_shapes():
    import jax
    import jax.numpy as jnp

    a, b = jax.export.symbolic_shape("a, b")
    e = Dim("a") * 2 + Dim("b") - 1
    expr = e.to_jax({"a": a, "b": b})
    # jax evaluates the same polynomial: check through a shape-polymorphic eval_shape.
    out = jax.eval_shape(lambda x: jnp.zeros(expr), jax.ShapeDtypeStruct((a, b), jnp.float32))
    assert out.shape[0] == 2 * a + b - 1


def test_floordiv_text_keeps_precedence():
    assert str((Dim("batch") + 1) // 2) == "((batch + 1) // 2)"
    assert ((Dim("batch") + 1) // 2).evaluate({"batch": 5}) == 3
