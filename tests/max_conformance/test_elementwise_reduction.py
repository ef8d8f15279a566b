"""MAX graph-API conformance of the elementwise, reduction, linalg, creation and random ops.

Behaviours MAX's own unit tests rely on (bool operands accepted at graph build,
error wording, overloads), checked here against numpy or MAX's documented
behaviour.
"""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from tests.graph_run import execute
from tests.ops.harness import run_op


def _graph(*types):
    return Graph("conformance", input_types=list(types))


def _t(dtype, shape, device=None):
    return TensorType(dtype, shape, device or DeviceRef.CPU())


# ─── elementwise ──────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_bool_arithmetic_builds_with_bool_result(name):
    with _graph(_t(DType.bool, [2, "n"]), _t(DType.bool, ["n"])) as g:
        a, b = (v.tensor for v in g.inputs)
        out = getattr(ops, name)(a, b)
        assert out.type == _t(DType.bool, [2, "n"])


def test_div_dtypes():
    with _graph(_t(DType.int8, [3]), _t(DType.uint16, [3]), _t(DType.bfloat16, [3])) as g:
        i, u, f = (v.tensor for v in g.inputs)
        assert (i / i).dtype == DType.float64  # ints: true division in float64
        assert (u / 2).dtype == DType.float64
        assert (f / f).dtype == DType.bfloat16


def test_ceil_values():
    x = np.array([-1.5, -0.5, 0.0, 0.2, 2.0, 2.7], np.float32)
    np.testing.assert_array_equal(run_op(ops.ceil, x), np.ceil(x))
    i = np.array([-3, 4], np.int32)
    np.testing.assert_array_equal(run_op(ops.ceil, i), i)


@pytest.mark.parametrize("op", [ops.sub, ops.div, ops.outer])
def test_mismatched_devices_say_same_device(op):
    with _graph(_t(DType.float32, [3]), _t(DType.float32, [3], DeviceRef.GPU(1))) as g:
        a, b = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"different devices \(cpu:0 and gpu:1\); they must be on the same device"):
            op(a, b)


def test_outer_requires_vectors():
    with _graph(_t(DType.float32, [2, 3]), _t(DType.float32, [4]), _t(DType.float32, [])) as g:
        m, v, s = (x.tensor for x in g.inputs)
        assert ops.outer(v, v).shape == [4, 4]
        with pytest.raises(ValueError, match=r"outer: lhs must be a rank-1 vector, got float32\[2, 3\]"):
            ops.outer(m, v)
        with pytest.raises(ValueError, match=r"outer: rhs must be a rank-1 vector, got float32\[\]"):
            ops.outer(v, s)


def test_where_error_messages():
    with _graph(
        _t(DType.float32, [3]),
        _t(DType.int32, [3]),
        _t(DType.bool, [2, 4]),
        _t(DType.int32, [2, 6]),
        _t(DType.int32, [3], DeviceRef.GPU()),
    ) as g:
        f, i, c, i26, gi = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=r"where: Expected condition to be a boolean tensor, but got a tensor with dtype DType.float32",
        ):
            ops.where(f, i, i)
        with pytest.raises(ValueError, match=r"where: .*\[2, 4\].*\[2, 6\].*are neither equivalent nor broadcastable"):
            ops.where(c, i26, i26)
        cond = f > 0
        want = (
            "where: Input values must be on the same device\n"
            f"    condition: {cond.type!r}\n    x: {i.type!r}\n    y: {gi.type!r}"
        )
        with pytest.raises(ValueError) as e:
            ops.where(cond, i, gi)
        assert str(e.value) == want


# ─── reductions ───────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "max", "min", "cumsum"])
def test_bool_reductions_build_and_keep_bool(name):
    with _graph(_t(DType.bool, [3, "n"])) as g:
        out = getattr(ops, name)(g.inputs[0].tensor, axis=0)
        assert out.dtype == DType.bool
        assert out.shape == ([3, "n"] if name == "cumsum" else [1, "n"])


@pytest.mark.parametrize("name", ["argmax", "argmin", "max", "min"])
def test_reducing_an_empty_axis_builds(name):
    with _graph(_t(DType.float32, [2, 0])) as g:
        out = getattr(ops, name)(g.inputs[0].tensor, axis=-1)
        assert out.shape == [2, 1]


def test_prod_and_reduction_errors():
    with _graph(_t(DType.int16, [2, 3]), _t(DType.float32, [])) as g:
        x, s = (v.tensor for v in g.inputs)
        assert ops.prod(x, axis=0).type == _t(DType.int16, [1, 3])
        with pytest.raises(ValueError, match="prod: axis 2 is out of range"):
            ops.prod(x, axis=2)
        with pytest.raises(ValueError, match="prod: input must have rank >= 1"):
            ops.prod(s)
    x = np.array([[1, -2, 3], [4, 5, 0]], np.int16)
    np.testing.assert_array_equal(run_op(lambda v: ops.prod(v, axis=0), x), np.prod(x, axis=0, keepdims=True))


def test_min_max_overloads():
    x = np.array([[1.0, 5.0, 2.0], [4.0, 0.0, 6.0]], np.float32)
    y = np.array([3.0, 3.0, 3.0], np.float32)
    mx, mn, rmx, rmn = run_op(lambda a, b: [ops.max(a, b), ops.min(a, b), ops.max(a, axis=0), ops.min(a)], x, y)
    np.testing.assert_array_equal(mx, np.maximum(x, y))
    np.testing.assert_array_equal(mn, np.minimum(x, y))
    np.testing.assert_array_equal(rmx, x.max(0, keepdims=True))
    np.testing.assert_array_equal(rmn, x.min(-1, keepdims=True))
    with _graph(_t(DType.int8, [1]), _t(DType.int8, [1])) as g:
        a, b = (v.tensor for v in g.inputs)
        for op in (ops.max, ops.min):
            with pytest.raises(ValueError, match="not both"):
                op(a, b, axis=-1)


# ─── ops.random (MAX's graph-level module) ────────────────────────────────


def test_random_needs_a_seed_and_checks_it():
    like = _t(DType.float32, [3])
    with Graph("no_seed"):
        with pytest.raises(RuntimeError, match="no seed set"):
            ops.random.uniform(like)
        for bad in (-1, 2**64):
            with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
                ops.random.set_seed(bad)
    with _graph(_t(DType.uint64, [2])) as g:
        with pytest.raises(ValueError, match=r"the seed must hold one element .*uint64\[2\]"):
            ops.random.set_seed(g.inputs[0].tensor)
    seed_type = ops.random.SeedType(DeviceRef.CPU())
    assert (seed_type.dtype, list(seed_type.shape), seed_type.device) == (DType.uint64, [1], DeviceRef.CPU())


def test_random_draws_are_reproducible_from_the_seed_and_differ_per_draw():
    like = _t(DType.float32, [2000])
    with _graph(ops.random.SeedType(DeviceRef.CPU())) as g:
        ops.random.set_seed(g.inputs[0].tensor)
        g.output(
            ops.random.uniform(like, range=(-2, 3)),
            ops.random.uniform(like),
            ops.random.gaussian(like, mean=1.0, std=2.0),
        )
    a1, b1, n1 = execute(g, np.array([7], np.uint64))
    a2, b2, n2 = execute(g, np.array([7], np.uint64))
    a3, _, _ = execute(g, np.array([8], np.uint64))
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(n1, n2)
    assert not np.array_equal(a1, a3)  # another seed
    assert not np.array_equal((a1 + 2) / 5, b1)  # the second draw used the advanced seed
    assert a1.min() >= -2 and a1.max() < 3 and abs(a1.mean() - 0.5) < 0.15
    assert abs(n1.mean() - 1.0) < 0.15 and abs(n1.std() - 2.0) < 0.15


def test_random_like_dtype_shape_and_device():
    with Graph("r"):
        ops.random.set_seed(3)
        ints = ops.random.uniform(_t(DType.int8, [500]), range=(-5, 5))
        sym = ops.random.gaussian(_t(DType.bool, ["batch", 2]))
        gpu = ops.random.uniform(_t(DType.float16, [4], DeviceRef.GPU()))
        assert ints.type == _t(DType.int8, [500])
        assert sym.type == _t(DType.bool, ["batch", 2])
        assert gpu.type == _t(DType.float16, [4], DeviceRef.GPU())
        with pytest.raises(ValueError, match="Unsafe cast"):
            ops.random.uniform(_t(DType.int8, [2]), range=(0, 1000))
    with Graph("ints") as g:
        ops.random.set_seed(3)
        g.output(ops.random.uniform(_t(DType.int8, [500]), range=(-5, 5)))
    (x,) = execute(g)
    assert x.dtype == np.int8 and x.min() == -5 and x.max() == 4  # ints in [low, high)
    with Graph("rank0", input_types=[_t(DType.uint64, [])]) as g:
        ops.random.set_seed(g.inputs[0].tensor)  # rank 0 is reshaped to [1]
        assert ops.random.normal(_t(DType.float32, [4])).shape == [4]


# ─── band_part, complex, irfft module ─────────────────────────────────────


def test_band_part_bounds_and_minus_one():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = run_op(lambda v: ops.band_part(v, num_lower=-1, num_upper=1), x)
    np.testing.assert_array_equal(out, np.where(np.subtract.outer(np.arange(4), np.arange(3)).T <= 1, x, 0))
    with _graph(_t(DType.float32, [3, 4]), _t(DType.float32, [4])) as g:
        m, v = (t.tensor for t in g.inputs)
        with pytest.raises(ValueError, match="must have at least 2 dimensions"):
            ops.band_part(v)
        with pytest.raises(ValueError, match="num_lower must be non-negative"):
            ops.band_part(m, num_lower=-2)
        with pytest.raises(ValueError, match="num_lower=3 is out of bounds"):
            ops.band_part(m, num_lower=3)
        with pytest.raises(ValueError, match="num_upper=4 is out of bounds"):
            ops.band_part(m, num_upper=4)


def test_as_interleaved_complex_errors():
    with _graph(_t(DType.float32, [2, 5]), _t(DType.float32, [2, "d"])) as g:
        odd, dyn = (t.tensor for t in g.inputs)
        with pytest.raises(ValueError, match="must be divisible by 2"):
            ops.as_interleaved_complex(odd)
        with pytest.raises(TypeError, match="must be static"):
            ops.as_interleaved_complex(dyn)


def test_complex_mul_type_and_errors():
    with _graph(_t(DType.float32, [3, 1, 2]), _t(DType.float32, [4, 2]), _t(DType.float32, [4, 3])) as g:
        a, b, c = (t.tensor for t in g.inputs)
        assert ops.complex.mul(a, b).type == (a * b).type == _t(DType.float32, [3, 4, 2])
        with pytest.raises(ValueError, match="last dim of 2"):
            ops.complex.mul(a, c)


def test_irfft_module_path():
    from maxfx.graph.ops.irfft import Normalization

    assert Normalization.BACKWARD.value == "backward"
    assert callable(ops.irfft)


# ─── weak-value promotion (max.graph.dtype_promotion) ─────────────────────


def test_promote_to_strong_follows_max_ranges():
    from maxfx.driver import CPU, Buffer
    from maxfx.graph import dtype_promotion

    table = dtype_promotion._DTYPE_MIN_AND_MAX_FULL_PRECISION
    assert table[DType.float32] == (-(2**24), 2**24) and table[DType.float16] == (-(2**11), 2**11)
    assert table[DType.int8] == (-128, 127) and table[DType.uint64] == (0, 2**64 - 1)
    cpu = DeviceRef.CPU()
    with Graph("promote"):
        for value, dtype in [
            (1e300, DType.float16),
            (2**24, DType.float32),
            (-128, DType.int8),
            (np.array(7), DType.uint8),
        ]:
            out = dtype_promotion._promote_to_strong(value, dtype, cpu)
            assert out.type == _t(dtype, [])
        buf = Buffer(DType.int64, [], CPU())
        buf[()] = 300
        for value, dtype in [
            (2**24 + 1, DType.float32),
            (128, DType.int8),
            (0.5, DType.int32),
            (np.array(1.0), DType.int64),
            (buf, DType.uint8),
        ]:
            with pytest.raises(ValueError, match="Unsafe cast"):
                dtype_promotion._promote_to_strong(value, dtype, cpu)


def test_binary_ops_apply_the_same_rule_to_python_scalars():
    with _graph(_t(DType.float32, [2]), _t(DType.float16, [2])) as g:
        f32, f16 = (v.tensor for v in g.inputs)
        assert (f32 + 2**24).dtype == DType.float32
        assert (f16 * 1e10).dtype == DType.float16  # floats always promote to float dtypes (rounding to inf)
        with pytest.raises(ValueError, match="Unsafe cast"):
            f32 + (2**24 + 2)
        assert ops.where(f32 > 0, f32, 3).dtype == DType.float32


def test_integer_sqrt_and_stdev_var_dtypes():
    x = np.array([0, 1, 8, 9, 26, -4], np.int32)
    np.testing.assert_array_equal(run_op(ops.sqrt, x), np.floor(np.sqrt(np.maximum(x, 0))).astype(np.int32))
    u = np.array([[1, 2, 3, 10]], np.uint8)
    sd, var = run_op(lambda v: [v.stdev(), v.var()], u)
    # MAX's formula on integers: mean floors (4), (u - 4)^2 wraps in uint8 like MAX's kernels, its mean floors, sqrt
    # floors.
    centered = (u - np.uint8(4)).astype(np.uint8)
    want_var = (centered * centered).astype(np.uint8).astype(np.int64).sum(-1, keepdims=True) // 4
    np.testing.assert_array_equal(var, want_var.astype(np.uint8))
    np.testing.assert_array_equal(sd, np.floor(np.sqrt(want_var)).astype(np.uint8))
    with _graph(_t(DType.bool, [3]), _t(DType.uint8, [2, "n"])) as g:
        b, i = (v.tensor for v in g.inputs)
        for method in ("stdev", "var"):
            with pytest.raises(TypeError, match="var: not defined for bool"):
                getattr(b, method)()
        assert i.stdev(axis=0).type == _t(DType.uint8, [1, "n"])


def test_irfft_error_wording():
    with _graph(_t(DType.float32, ["batch", 2, 3]), _t(DType.float32, [2, 3])) as g:
        sym, x = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match="Invalid normalization: invalid"):
            ops.irfft(x, n=1, axis=0, normalization="invalid")
        with pytest.raises(ValueError, match="Axis dimension must be static"):
            ops.irfft(sym, n=1, axis=0)
        assert ops.irfft(x, n=4, axis=0, normalization="ortho").shape == [4, 3]


def test_argsort_of_bool_matches_numpy_stable_order():
    x = np.array([True, False, True, False, False])
    np.testing.assert_array_equal(run_op(ops.argsort, x), np.argsort(x, kind="stable"))


def test_top_k_and_argsort_errors_use_maxs_words():
    with Graph("g", input_types=[TensorType(DType.float32, [2, 6], DeviceRef.CPU())]) as g:
        x = g.inputs[0].tensor
        with pytest.raises(IndexError, match=r"axis \(3\) out of bound"):
            ops.top_k(x, 2, axis=3)
        with pytest.raises(ValueError, match=r"k \(7\) cannot be larger than dimension size along axis 1"):
            ops.top_k(x, 7)
        with pytest.raises(ValueError, match="argsort only implemented for input tensors of rank 1"):
            ops.argsort(x)
