"""Elementwise ops (unary math, binary arithmetic, comparisons, logic, where, outer) against numpy.

Each op row builds one graph that applies the op to every allowed dtype at
once (one compile per op), compares with numpy, and runs the same front on
JAX arrays under ``jax.jit`` (the traced path).
"""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import Graph, TensorType, TensorValue, ops
from tests.ops.harness import rand, run_op

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.float32, np.float16, BF16]
NUMERIC = [np.float32, BF16, np.int32, np.int64]
ALL = [np.float32, np.float16, np.int32, np.int64, np.bool_]
SHAPE = [3, 4]

# float16/bfloat16 results are rounded to 11/8 significant bits.
_TOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5, np.dtype(np.float16): 4e-3, BF16: 3e-2}

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _check(out, expected, dtype, what=""):
    """``out`` has ``dtype`` and matches ``expected`` (computed in float64 for floats)."""
    dtype = np.dtype(dtype)
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}, expected {dtype}"
    if dtype.kind == "f" or dtype == BF16:
        tol = _TOL[dtype]
        np.testing.assert_allclose(
            out.astype(np.float64), np.asarray(expected, np.float64), rtol=tol, atol=tol, equal_nan=True, err_msg=what
        )
    else:
        np.testing.assert_array_equal(out, np.asarray(expected).astype(dtype), err_msg=what)


def _wide(x):
    """Reference computations run in float64 (ints stay ints)."""
    return x.astype(np.float64) if x.dtype.kind == "f" or x.dtype == BF16 else x


def _run_each(fn, arrays):
    """``fn`` applied to each input of one graph; returns one output per input (group)."""
    outs = run_op(lambda *vs: tuple(fn(*g) for g in _groups(vs, len(arrays[0]))), *[a for grp in arrays for a in grp])
    return outs if isinstance(outs, list) else [outs]


def _groups(vs, n):
    return [vs[i : i + n] for i in range(0, len(vs), n)]


# ─── unary ────────────────────────────────────────────────────────────────

# id: (front call, numpy reference, allowed dtypes, (low, high) of the test data)
UNARY = {
    "abs": (ops.abs, np.abs, NUMERIC, (-3, 3)),
    "acos": (ops.acos, lambda x: np.arccos(np.clip(x, -1, 1)), FLOATS, (-1.5, 1.5)),
    "atanh": (ops.atanh, np.arctanh, FLOATS, (-0.9, 0.9)),
    "cos": (ops.cos, np.cos, FLOATS, (-3, 3)),
    "erf": (ops.erf, _erf, FLOATS, (-2.5, 2.5)),
    "exp": (ops.exp, np.exp, FLOATS, (-3, 3)),
    "floor": (ops.floor, np.floor, NUMERIC, (-3, 3)),
    "ceil": (ops.ceil, np.ceil, NUMERIC, (-3, 3)),
    "gelu": (ops.gelu, lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), FLOATS, (-3, 3)),
    "gelu_tanh": (
        lambda x: ops.gelu(x, approximate="tanh"),
        lambda x: 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3))),
        FLOATS,
        (-3, 3),
    ),
    "gelu_quick": (lambda x: ops.gelu(x, approximate="quick"), lambda x: _sigmoid(1.702 * x) * x, FLOATS, (-3, 3)),
    "is_inf": (ops.is_inf, np.isinf, [np.float32, np.float16, np.int32], (-3, 3)),
    "is_nan": (ops.is_nan, np.isnan, [np.float32, BF16, np.int64], (-3, 3)),
    "log": (ops.log, np.log, FLOATS, (0.05, 5)),
    "log1p": (ops.log1p, np.log1p, FLOATS, (-0.9, 3)),
    "logical_not": (ops.logical_not, np.logical_not, [np.bool_], (0, 1)),
    "negate": (ops.negate, np.negative, NUMERIC, (-3, 3)),
    "relu": (ops.relu, lambda x: np.maximum(x, 0), NUMERIC, (-3, 3)),
    "round": (ops.round, np.round, NUMERIC, (-3, 3)),
    "rsqrt": (ops.rsqrt, lambda x: 1 / np.sqrt(x), FLOATS, (0.05, 5)),
    "sigmoid": (ops.sigmoid, _sigmoid, FLOATS, (-6, 6)),
    "silu": (ops.silu, lambda x: x * _sigmoid(x), FLOATS, (-6, 6)),
    "sin": (ops.sin, np.sin, FLOATS, (-3, 3)),
    "sqrt": (ops.sqrt, np.sqrt, NUMERIC, (0, 5)),  # ints: floor(sqrt(x))
    "tanh": (ops.tanh, np.tanh, FLOATS, (-3, 3)),
    "trunc": (ops.trunc, np.trunc, NUMERIC, (-3, 3)),
}

_BOOL_OUT = {"is_inf", "is_nan"}


def _unary_data(rng, name, dtype, low, high):
    x = rand(rng, SHAPE, dtype, low, high)
    if name in ("round", "floor", "trunc") and x.dtype.kind != "i":
        x = (np.round(x.astype(np.float32) * 2) / 2).astype(dtype)  # exact halves: tie-breaking and exactness
    if name in _BOOL_OUT and x.dtype.kind != "i":
        x.flat[:4] = np.array([np.inf, -np.inf, np.nan, 0.0]).astype(dtype)
    return x


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(rng, name):
    fn, ref, dtypes, (low, high) = UNARY[name]
    xs = [_unary_data(rng, name, dt, low, high) for dt in dtypes]
    outs = _run_each(fn, [[x] for x in xs])
    for x, out in zip(xs, outs):
        want_dtype = np.bool_ if name in _BOOL_OUT else x.dtype
        with np.errstate(all="ignore"):
            _check(out, ref(_wide(x)), want_dtype, f"{name} {x.dtype}")
    # The traced path: the same front on JAX arrays under jax.jit.
    traced = np.asarray(jax.jit(fn)(jnp.asarray(xs[0])))
    _check(traced, outs[0], outs[0].dtype, f"{name} traced")


@pytest.mark.parametrize("name", [n for n, row in UNARY.items() if row[2] is FLOATS])
def test_float_only_unary_rejects_ints(name):
    fn = UNARY[name][0]
    op = name.split("_")[0] if name.startswith("gelu") else name
    with Graph("g", input_types=[TensorType(DType.int32, [2]), TensorType(DType.bool, [2])]) as g:
        for v in g.inputs:
            with pytest.raises(ValueError, match=rf"{op}: .*floating-point.*(int32|bool)\[2\]"):
                fn(v.tensor)


def test_unary_dtype_class_errors():
    with Graph("g", input_types=[TensorType(DType.bool, [2]), TensorType(DType.float32, [2])]) as g:
        b, f = g.inputs[0].tensor, g.inputs[1].tensor
        for fn, name in [(ops.abs, "abs"), (ops.negate, "negate"), (ops.relu, "relu"), (ops.floor, "floor")]:
            with pytest.raises(ValueError, match=rf"{name}: .*numeric.*bool\[2\]"):
                fn(b)
        with pytest.raises(ValueError, match=r"logical_not: .*bool.*float32\[2\]"):
            ops.logical_not(f)
        with pytest.raises(ValueError, match="logical_not"):
            ~f
        with pytest.raises(TypeError, match="exp"):
            ops.exp(1.0)
        with pytest.raises(TypeError, match="relu"):
            ops.relu(np.ones(2, np.float32))


@pytest.mark.parametrize("approximate", ["exact", "", "TANH", None])
def test_gelu_rejects_unknown_approximation(approximate):
    with Graph("g", input_types=[TensorType(DType.float32, [2])]) as g:
        with pytest.raises(ValueError, match="gelu: approximate"):
            ops.gelu(g.inputs[0], approximate=approximate)


def test_documented_unary_edge_cases():
    x = np.array([-2.0, -1.0, 1.0, 2.0, 0.5, -0.5], np.float32)
    r = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5], np.float32)
    acos, rounded, relu = run_op(lambda a, b: (ops.acos(a), ops.round(b), ops.relu(a - 3.0)), x, r)
    np.testing.assert_allclose(acos, [math.pi, math.pi, 0.0, 0.0, math.acos(0.5), math.acos(-0.5)], rtol=1e-6)
    np.testing.assert_array_equal(rounded, [0.0, 2.0, 2.0, -0.0, -2.0, -2.0])  # ties to even
    assert not np.signbit(relu).any()  # relu(-2.0) prints 0.0, not -0.0


# ─── binary ───────────────────────────────────────────────────────────────


def _nonzero(rng, dtype, low=1, high=4):
    mag = rand(rng, SHAPE, dtype, low, high)
    sign = np.where(rng.random(SHAPE) < 0.5, -1, 1).astype(dtype)
    return (mag * sign).astype(dtype)


def _ties(rng, dtype):
    """Small whole numbers so that comparisons see equal elements."""
    if np.dtype(dtype) == np.bool_:
        return rand(rng, SHAPE, dtype)
    return rng.integers(-2, 3, size=SHAPE).astype(dtype)


def _default_data(rng, dtype):
    return rand(rng, SHAPE, dtype), rand(rng, SHAPE, dtype)


def _div_expected(a, b):
    return a.astype(np.float64) / b.astype(np.float64)


def _div_dtype(dtype):
    return np.dtype(np.float64) if np.dtype(dtype).kind in "iu" else np.dtype(dtype)


def _pow_data(rng, dtype):
    if np.dtype(dtype).kind == "i":
        return rand(rng, SHAPE, dtype, -3, 4), rand(rng, SHAPE, dtype, 0, 4)
    return rand(rng, SHAPE, dtype, 0.5, 2), rand(rng, SHAPE, dtype, -2, 2)


# id: (front call, numpy reference, allowed dtypes, data(rng, dtype) -> (lhs, rhs), output dtype of input dtype)
BINARY = {
    "add": (ops.add, np.add, NUMERIC + [np.float16], _default_data, None),
    "sub": (ops.sub, np.subtract, NUMERIC + [np.float16], _default_data, None),
    "mul": (ops.mul, np.multiply, NUMERIC + [np.float16], _default_data, None),
    "div": (
        ops.div,
        _div_expected,
        NUMERIC + [np.float16],
        lambda r, d: (rand(r, SHAPE, d, -9, 9), _nonzero(r, d)),
        _div_dtype,
    ),
    "mod": (
        ops.mod,
        np.mod,
        [np.float32, np.float64, np.int32, np.int64],
        lambda r, d: (rand(r, SHAPE, d, -9, 9), _nonzero(r, d)),
        None,
    ),
    "floor_div": (
        ops.floor_div,
        np.floor_divide,
        [np.float32, np.float64, np.int32, np.int64],
        lambda r, d: (rand(r, SHAPE, d, -9, 9), _nonzero(r, d)),
        None,
    ),
    "pow": (ops.pow, np.power, [np.float32, BF16, np.int32, np.int64], _pow_data, None),
    "equal": (ops.equal, np.equal, ALL, lambda r, d: (_ties(r, d), _ties(r, d)), np.bool_),
    "not_equal": (ops.not_equal, np.not_equal, ALL, lambda r, d: (_ties(r, d), _ties(r, d)), np.bool_),
    "greater": (ops.greater, np.greater, ALL + [BF16], lambda r, d: (_ties(r, d), _ties(r, d)), np.bool_),
    "greater_equal": (
        ops.greater_equal,
        np.greater_equal,
        ALL + [BF16],
        lambda r, d: (_ties(r, d), _ties(r, d)),
        np.bool_,
    ),
    "logical_and": (ops.logical_and, np.logical_and, [np.bool_], _default_data, None),
    "logical_or": (ops.logical_or, np.logical_or, [np.bool_], _default_data, None),
    "logical_xor": (ops.logical_xor, np.logical_xor, [np.bool_], _default_data, None),
}


def _out_dtype(rule, dtype):
    if rule is None:
        return np.dtype(dtype)
    return rule(dtype) if callable(rule) and not isinstance(rule, type) else np.dtype(rule)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary(rng, name):
    fn, ref, dtypes, data, out_rule = BINARY[name]
    pairs = [data(rng, dt) for dt in dtypes]
    outs = _run_each(fn, pairs)
    for (a, b), out in zip(pairs, outs):
        with np.errstate(all="ignore"):
            expected = ref(_wide(a), _wide(b))
        _check(out, expected, _out_dtype(out_rule, a.dtype), f"{name} {a.dtype}")
    traced = np.asarray(jax.jit(fn)(jnp.asarray(pairs[0][0]), jnp.asarray(pairs[0][1])))
    _check(traced, outs[0], outs[0].dtype, f"{name} traced")


def test_mod_and_floor_div_follow_python_signs():
    ints = [np.array(v, np.int32) for v in ([-3, 3, -7, 7, 7, -7], [2, -2, 2, -2, 2, -2])]
    floats = [v.astype(np.float32) for v in ints]
    im, idv, fm, fdv = run_op(lambda a, b, c, d: (a % b, a // b, c % d, c // d), *ints, *floats)
    py_mod = [a % b for a, b in zip(ints[0].tolist(), ints[1].tolist())]
    py_div = [a // b for a, b in zip(ints[0].tolist(), ints[1].tolist())]
    np.testing.assert_array_equal(im, py_mod)  # -3 % 2 == 1, 3 % -2 == -1
    np.testing.assert_array_equal(idv, py_div)  # -7 // 2 == -4
    np.testing.assert_array_equal(fm, np.array(py_mod, np.float32))
    np.testing.assert_array_equal(fdv, np.array(py_div, np.float32))
    assert im.dtype == np.int32 and fdv.dtype == np.float32


def test_div_int_by_int_is_float64():
    a, b = np.array([7, -7, 1], np.int32), np.array([2, 2, 3], np.int32)
    out = run_op(ops.div, a, b)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [3.5, -3.5, 1 / 3])
    # The traced path agrees when the trace has 64-bit types (maxfx traces with x64 on);
    # under plain 32-bit jax.jit the result follows JAX's defaults.
    with jax.enable_x64(True):
        assert jax.jit(ops.div)(jnp.asarray(a), jnp.asarray(b)).dtype == jnp.float64
    assert jax.jit(ops.div)(jnp.asarray(a), jnp.asarray(b)).dtype == jnp.float32
    # Concrete arrays outside any trace compute with 64-bit types.
    assert ops.div(jnp.asarray(a), jnp.asarray(b)).dtype == jnp.float64


# ─── broadcasting and Python scalars ──────────────────────────────────────


def test_broadcasting_static_and_symbolic(rng):
    a = rand(rng, [2, 1, 3], np.float32)
    b = rand(rng, [4, 1], np.float32)
    out = run_op(lambda x, y: (x + y, ops.greater(x, y), ops.pow(ops.abs(x) + 0.5, y)), a, b)
    np.testing.assert_allclose(out[0], a + b, rtol=1e-6)
    np.testing.assert_array_equal(out[1], a > b)
    np.testing.assert_allclose(out[2], (np.abs(a) + 0.5) ** b, rtol=1e-5)
    assert out[0].shape == (2, 4, 3)

    x = rand(rng, [5, 3], np.float32)
    y = rand(rng, [3], np.float32)
    z = rand(rng, [5, 1], np.float32)
    sym = [["batch", None], [None], ["batch", None]]
    got = run_op(lambda p, q, r: (p * q - r, ops.where(p > r, q, r)), x, y, z, symbolic=sym)
    np.testing.assert_allclose(got[0], x * y - z, rtol=1e-6)
    np.testing.assert_array_equal(got[1], np.where(x > z, y, z))
    with Graph("g", input_types=[TensorType(DType.float32, ["batch", 3]), TensorType(DType.float32, [3])]) as g:
        s = g.inputs[0] + g.inputs[1]
        assert s.shape == ["batch", 3]
        assert ops.equal(g.inputs[1], g.inputs[0]).type == TensorType(DType.bool, ["batch", 3])


def test_python_scalars_on_either_side(rng):
    x = rand(rng, [6], np.float32, 0.5, 3)
    i = rand(rng, [6], np.int32, -9, 9)
    outs = run_op(
        lambda v, w: (
            2 - v,
            v / 2,
            2 / v,
            v**2,
            2**v,
            v % 1.5,
            1 + v,
            v * 0.5,
            0 < v - 1,
            w // 2,
            -7 // (w * 0 + 2),
            w / 2,
            w * 3,
        ),
        x,
        i,
    )
    expected = [
        2 - x,
        x / 2,
        2 / x,
        x**2,
        2**x,
        np.mod(x, 1.5),
        1 + x,
        x * 0.5,
        0 < x - 1,
        i // 2,
        np.full(6, -4, np.int32),
        i / 2,
        i * 3,
    ]
    dtypes = [np.float32] * 8 + [np.bool_, np.int32, np.int32, np.float64, np.int32]
    for k, (out, want, dt) in enumerate(zip(outs, expected, dtypes)):
        _check(out, want, dt, f"expression {k}")


def test_tensor_value_operators(rng):
    a = rand(rng, [3, 4], np.float32, 0.5, 3)
    b = np.round(rand(rng, [3, 4], np.float32, 0.5, 3))
    b[0, 0] = a[0, 0]  # a tie for the comparisons
    p, q = rand(rng, [3, 4], np.bool_), rand(rng, [3, 4], np.bool_)

    def fn(x, y, m, n):
        assert isinstance(x, TensorValue)
        return (x + y, x - y, x * y, x / y, x // y, x % y, x**y, -x, abs(x - y),
                x == y, x != y, x < y, x <= y, x > y, x >= y, ~m, m & n, m | n, m ^ n, +x)  # fmt: skip

    outs = run_op(fn, a, b, p, q)
    expected = [a + b, a - b, a * b, a / b, a // b, a % b, a**b, -a, abs(a - b),
                a == b, a != b, a < b, a <= b, a > b, a >= b, ~p, p & q, p | q, p ^ q, a]  # fmt: skip
    for k, (out, want) in enumerate(zip(outs, expected)):
        _check(out, want, want.dtype, f"operator {k}")


def test_operators_record_the_registry_ops():
    with Graph("g", input_types=[TensorType(DType.float32, [2]), TensorType(DType.bool, [2])]) as g:
        x, m = g.inputs[0].tensor, g.inputs[1].tensor
        g.output(x // 2, x % 2, -x, ~m, x < 1)
    text = str(g)
    for op in ("floor_div", "mod", "negate", "logical_not", "greater"):
        assert op in text, f"{op} not in graph:\n{text}"


# ─── where / outer ────────────────────────────────────────────────────────


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int64, np.bool_])
def test_where(rng, dtype):
    c = rand(rng, [2, 1, 3], np.bool_)
    x = rand(rng, [4, 1], dtype)
    y = rand(rng, [3], dtype)
    out = run_op(ops.where, c, x, y)
    _check(out, np.where(c, x, y), dtype, "where")
    assert out.shape == (2, 4, 3)


def test_where_scalars_and_symbolic(rng):
    c = rand(rng, [5, 3], np.bool_)
    x = rand(rng, [5, 3], np.float32)
    out = run_op(
        lambda cc, xx: (ops.where(cc, xx, 0.0), ops.where(cc, -1.0, xx)), c, x, symbolic=[["n", None], ["n", None]]
    )
    np.testing.assert_array_equal(out[0], np.where(c, x, 0.0))
    np.testing.assert_array_equal(out[1], np.where(c, -1.0, x).astype(np.float32))
    traced = jax.jit(lambda cc, xx: ops.where(cc, xx, 0.0))(jnp.asarray(c), jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(traced), out[0])


def test_where_errors():
    with Graph(
        "g",
        input_types=[TensorType(DType.float32, [2, 3]), TensorType(DType.int32, [2, 3]), TensorType(DType.bool, [4])],
    ) as g:
        f, i, b = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=(
                r"where: Expected condition to be a boolean tensor, but got a tensor with dtype DType.float32 "
                r"\(condition: float32\[2, 3\]\)"
            ),
        ):
            ops.where(f, f, f)
        with pytest.raises(ValueError, match="where"):
            ops.where(f > 0, f, i)  # float32 with int32 does not promote
        with pytest.raises(ValueError, match=r"where: .*\[4\].*\[2, 3\]"):
            ops.where(b, f, f)
        with pytest.raises(TypeError, match="where"):
            ops.where(f > 0, 1.0, 0.0)  # x and y both Python scalars


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.bool_])
def test_outer(rng, dtype):
    a = rand(rng, [6], dtype)
    b = rand(rng, [4], dtype)
    out = run_op(ops.outer, a, b)
    want = np.outer(a, b) if dtype == np.bool_ else np.outer(_wide(a), _wide(b))
    _check(out, want, dtype, "outer")
    assert out.shape == (6, 4)


def test_outer_symbolic_and_errors(rng):
    a = rand(rng, [5], np.float32)
    b = rand(rng, [2], np.float32)
    out = run_op(ops.outer, a, b, symbolic=[["batch"], None])
    np.testing.assert_allclose(out, np.outer(a, b), rtol=1e-6)
    with Graph(
        "g",
        input_types=[
            TensorType(DType.float32, ["batch"]),
            TensorType(DType.float32, [2]),
            TensorType(DType.float32, [2, 3]),
        ],
    ) as g:
        t = ops.outer(g.inputs[0], g.inputs[1]).type
        assert t.shape == [g.inputs[0].shape[0], 2]
        with pytest.raises(ValueError, match="outer"):
            ops.outer(g.inputs[0], g.inputs[1].cast(DType.int32))
        # MAX's graph takes vectors only: flatten first.
        with pytest.raises(ValueError, match=r"outer: lhs must be a rank-1 vector, got float32\[2, 3\]"):
            ops.outer(g.inputs[2], g.inputs[1])


# ─── promotion and error cases ────────────────────────────────────────────


def test_promotion_follows_max_rules(rng):
    a16 = rand(rng, [4], np.float16)
    a32 = rand(rng, [4], np.float32)
    b = rand(rng, [4], np.bool_)
    i = rand(rng, [4], np.int32)
    s, t = run_op(lambda x, y, p, q: (x + y, p + q), a16, a32, b, i)
    _check(s, a16.astype(np.float32) + a32, np.float32, "f16 + f32")
    _check(t, b.astype(np.int32) + i, np.int32, "bool + i32")


def test_binary_errors():
    types = [
        TensorType(DType.int32, [2, 3]),
        TensorType(DType.float32, [2, 3]),
        TensorType(DType.float32, [4]),
        TensorType(DType.float32, [2, 3]),
    ]
    with Graph("g", input_types=types) as g:
        i, f, v, f2 = (x.tensor for x in g.inputs)
        with pytest.raises(ValueError, match=r"add: .*int32.*float32"):
            ops.add(i, f)
        with pytest.raises(ValueError, match=r"add: .*[Uu]nsafe cast"):
            i + 1.5
        with pytest.raises(ValueError, match=r"div"):
            i / 1.5
        with pytest.raises(TypeError, match="add"):
            ops.add(1, 2)
        with pytest.raises(TypeError, match="mul"):
            ops.mul(1.0, np.float32(2.0))
        with pytest.raises(ValueError, match=r"add: shapes \[2, 3\] and \[4\]"):
            f + v
        for fn, name in [
            (ops.sub, "sub"),
            (ops.floor_div, "floor_div"),
            (ops.greater, "greater"),
            (ops.logical_and, "logical_and"),
        ]:
            with pytest.raises(ValueError, match=rf"{name}: .*\[2, 3\].*\[4\]"):
                fn(f > 0 if name == "logical_and" else f, v > 0 if name == "logical_and" else v)
        with pytest.raises(ValueError, match=r"logical_and: .*bool.*float32"):
            ops.logical_and(f, f2)
        with pytest.raises(ValueError, match=r"logical_or: .*bool.*int32"):
            i | i
        assert ((f > 0) + (f2 > 0)).dtype == DType.bool  # bool arithmetic builds, as in MAX
        with pytest.raises(ValueError, match="int32"):
            ops.add(i, 2**40)  # out of int32 range


def test_grad_and_vmap_through_fronts():
    x = jnp.array([-1.0, 0.5, 2.0])
    g = jax.grad(lambda v: jnp.sum(ops.silu(v) + ops.mul(v, 3.0)))(x)
    s = 1 / (1 + np.exp(-np.asarray(x)))
    np.testing.assert_allclose(np.asarray(g), s * (1 + np.asarray(x) * (1 - s)) + 3.0, rtol=1e-5)
    v = jax.vmap(lambda a, b: ops.where(ops.greater(a, b), a, b))(jnp.ones((3, 2)), jnp.arange(6.0).reshape(3, 2))
    np.testing.assert_array_equal(np.asarray(v), np.maximum(1.0, np.arange(6.0).reshape(3, 2)))


def test_bool_arithmetic_computes_as_ints():
    # MAX's graph accepts bool arithmetic: 0/1 ints, cast back to bool (nonzero is True).
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    add, sub, mul, div = run_op(lambda x, y: [x + y, x - y, x * y, x / y], a, b)
    ia, ib = a.astype(np.int64), b.astype(np.int64)
    np.testing.assert_array_equal(add, (ia + ib) != 0)
    np.testing.assert_array_equal(sub, (ia - ib) != 0)
    np.testing.assert_array_equal(mul, (ia * ib) != 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(div, (ia / ib) != 0)
    assert add.dtype == sub.dtype == mul.dtype == div.dtype == np.bool_


def test_complex_mul_matches_numpy_complex(rng):
    # ops.complex.mul (the complex_mul op) on interleaved (real, imag) pairs, against numpy's complex product.
    a = rand(rng, [4, 3, 2], np.float32)
    b = rand(rng, [3, 2], np.float32)
    out = run_op(ops.complex.mul, a, b)
    want = (a[..., 0] + 1j * a[..., 1]) * (b[..., 0] + 1j * b[..., 1])
    np.testing.assert_allclose(out, np.stack([want.real, want.imag], -1), rtol=1e-5, atol=1e-5)
    with Graph("g", input_types=[TensorType(DType.float32, [3, 2]), TensorType(DType.float32, [3])]) as g:
        with pytest.raises(ValueError, match=r"complex.mul: rhs must be complex: a last dim of 2 .*float32\[3\]"):
            ops.complex.mul(g.inputs[0], g.inputs[1])
