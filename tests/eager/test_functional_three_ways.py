"""Every ``maxfx.functional`` op against numpy, run three ways with identical results.

1. eager: inputs are realized tensors and the result is realized right away;
2. fused: inputs are themselves pending (one extra node each), the op and a
   trailing identity are recorded lazily, and the whole graph is realized twice
   — the second time through the cached fused XLA program;
3. jit: the same call inside ``jax.jit`` (Tensors are pytrees holding tracers).

References are numpy (or scipy); the three maxfx results must also agree
exactly with each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import ml_dtypes
import numpy as np
import pytest
import scipy.special

from lowering.eager import eager_stats
from maxfx import functional as F
from maxfx.dtype import DType
from maxfx.graph import DeviceRef, TensorType
from maxfx.tensor import Tensor
from tests.ops.test_creation import _hann_ref
from tests.ops.test_indexing import _gather_nd_ref
from tests.ops.test_nn_ops import np_conv, np_conv_transpose, np_fold, np_pool
from tests.ops.test_reduction import _np_cumsum, _np_layer_norm, _np_softmax
from tests.ops.test_shape import _np_band

R = np.random.default_rng(1234)


def f32(*shape, low=-2.0, high=2.0):
    return R.uniform(low, high, size=shape).astype(np.float32)


def i64(*shape, low=0, high=5):
    return R.integers(low, high, size=shape).astype(np.int64)


def boolean(*shape):
    return R.random(shape) > 0.5


@dataclass
class Case:
    fn: Callable[..., Any]  # (*tensors) -> Tensor | list[Tensor]
    inputs: list[np.ndarray]
    ref: Callable[..., Any]  # (*arrays) -> array | list[array]
    tol: float = 1e-5
    jit: bool = True
    exact: bool = field(default=False)


def _gelu(x):
    return 0.5 * x * (1 + scipy.special.erf(x / math.sqrt(2)))


def _np_round(x):
    return np.round(x)  # numpy rounds half to even, as MAX does


def _np_mod(a, b):
    return np.mod(a, b)


X = f32(3, 4)
Y = f32(3, 4)
POS = f32(3, 4, low=0.1, high=3.0)
UNIT = f32(3, 4, low=-0.9, high=0.9)
IMG = f32(1, 5, 5, 2)
VOL = f32(1, 4, 4, 4, 2)

CASES: dict[str, Case] = {
    # elementwise unary
    "abs": Case(F.abs, [X], np.abs),
    "atanh": Case(F.atanh, [UNIT], np.arctanh, tol=1e-5),
    "cos": Case(F.cos, [X], np.cos),
    "erf": Case(F.erf, [X], scipy.special.erf, tol=1e-5),
    "exp": Case(F.exp, [X], np.exp, tol=1e-5),
    "floor": Case(F.floor, [X], np.floor),
    "gelu": Case(F.gelu, [X], _gelu, tol=1e-5),
    "is_inf": Case(F.is_inf, [np.array([1.0, np.inf, -np.inf, np.nan], np.float32)], np.isinf),
    "is_nan": Case(F.is_nan, [np.array([1.0, np.inf, -np.inf, np.nan], np.float32)], np.isnan),
    "log": Case(F.log, [POS], np.log, tol=1e-5),
    "log1p": Case(F.log1p, [POS], np.log1p, tol=1e-5),
    "logical_not": Case(F.logical_not, [boolean(3, 4)], np.logical_not),
    "negate": Case(F.negate, [X], np.negative),
    "relu": Case(F.relu, [X], lambda x: np.maximum(x, 0)),
    "round": Case(F.round, [np.array([0.5, 1.5, 2.5, -0.5, 1.2], np.float32)], _np_round),
    "rsqrt": Case(F.rsqrt, [POS], lambda x: 1 / np.sqrt(x), tol=1e-5),
    "sigmoid": Case(F.sigmoid, [X], lambda x: 1 / (1 + np.exp(-x)), tol=1e-5),
    "silu": Case(F.silu, [X], lambda x: x / (1 + np.exp(-x)), tol=1e-5),
    "sin": Case(F.sin, [X], np.sin),
    "sqrt": Case(F.sqrt, [POS], np.sqrt),
    "tanh": Case(F.tanh, [X], np.tanh, tol=1e-5),
    "trunc": Case(F.trunc, [X], np.trunc),
    "cast": Case(lambda x: F.cast(x, DType.int32), [X * 3], lambda x: (x * 1).astype(np.int32)),
    # binary / compare / select
    "add": Case(F.add, [X, Y], np.add),
    "sub": Case(F.sub, [X, Y], np.subtract),
    "mul": Case(F.mul, [X, Y], np.multiply),
    "div": Case(F.div, [X, POS], np.divide, tol=1e-6),
    "mod": Case(F.mod, [X, POS], _np_mod, tol=1e-5),
    "pow": Case(F.pow, [POS, Y], np.power, tol=1e-5),
    "max": Case(F.max, [X, Y], np.maximum),
    "min": Case(F.min, [X, Y], np.minimum),
    "equal": Case(F.equal, [i64(3, 4), i64(3, 4)], np.equal),
    "not_equal": Case(F.not_equal, [i64(3, 4), i64(3, 4)], np.not_equal),
    "greater": Case(F.greater, [X, Y], np.greater),
    "greater_equal": Case(F.greater_equal, [i64(3, 4), i64(3, 4)], np.greater_equal),
    "logical_and": Case(F.logical_and, [boolean(3, 4), boolean(3, 4)], np.logical_and),
    "logical_or": Case(F.logical_or, [boolean(3, 4), boolean(3, 4)], np.logical_or),
    "logical_xor": Case(F.logical_xor, [boolean(3, 4), boolean(3, 4)], np.logical_xor),
    "where": Case(F.where, [boolean(3, 4), X, Y], np.where),
    "outer": Case(F.outer, [f32(3), f32(4)], np.outer),
    # reductions, scans, normalisation (reductions keep the axis)
    "argmax": Case(lambda x: F.argmax(x, axis=1), [X], lambda x: np.argmax(x, axis=1)[:, None]),
    "argmin": Case(lambda x: F.argmin(x, axis=0), [X], lambda x: np.argmin(x, axis=0)[None, :]),
    "mean": Case(lambda x: F.mean(x, axis=1), [X], lambda x: x.mean(axis=1, keepdims=True), tol=1e-6),
    "sum": Case(lambda x: F.sum(x, axis=0), [X], lambda x: x.sum(axis=0, keepdims=True), tol=1e-5),
    "cumsum": Case(lambda x: F.cumsum(x, axis=1, exclusive=True, reverse=True), [X], lambda x: _np_cumsum(x, 1, True, True), tol=1e-5),
    "softmax": Case(lambda x: F.softmax(x, axis=-1), [X], lambda x: _np_softmax(x, -1), tol=1e-6),
    "logsoftmax": Case(lambda x: F.logsoftmax(x, axis=-1), [X], lambda x: np.log(_np_softmax(x, -1)), tol=1e-5),
    "top_k": Case(lambda x: F.top_k(x, 2, axis=-1), [X], lambda x: [np.sort(x, -1)[:, ::-1][:, :2], np.argsort(-x, -1, kind="stable")[:, :2]]),
    "argsort": Case(lambda x: F.argsort(x, ascending=False), [f32(7)], lambda x: np.argsort(-x, kind="stable")),
    "layer_norm": Case(lambda x, g, b: F.layer_norm(x, g, b, 1e-5), [X, f32(4), f32(4)], lambda x, g, b: _np_layer_norm(x, g, b, 1e-5), tol=1e-5),
    # shape and layout
    "reshape": Case(lambda x: F.reshape(x, [2, -1]), [X], lambda x: x.reshape(2, -1)),
    "flatten": Case(lambda x: F.flatten(x), [X], lambda x: x.reshape(-1)),
    "squeeze": Case(lambda x: F.squeeze(x, 1), [f32(3, 1, 2)], lambda x: x.squeeze(1)),
    "unsqueeze": Case(lambda x: F.unsqueeze(x, -1), [X], lambda x: x[..., None]),
    "transpose": Case(lambda x: F.transpose(x, 0, 1), [X], lambda x: x.T),
    "permute": Case(lambda x: F.permute(x, [2, 0, 1]), [f32(2, 3, 4)], lambda x: x.transpose(2, 0, 1)),
    "broadcast_to": Case(lambda x: F.broadcast_to(x, [3, 4]), [f32(1, 4)], lambda x: np.broadcast_to(x, (3, 4))),
    "concat": Case(lambda a, b: F.concat([a, b], axis=1), [X, Y], lambda a, b: np.concatenate([a, b], 1)),
    "stack": Case(lambda a, b: F.stack([a, b], axis=-1), [X, Y], lambda a, b: np.stack([a, b], -1)),
    "split": Case(lambda x: F.split(x, [1, 3], axis=1), [X], lambda x: np.split(x, [1], axis=1)),
    "chunk": Case(lambda x: F.chunk(x, 2, axis=1), [X], lambda x: np.split(x, 2, axis=1)),
    "tile": Case(lambda x: F.tile(x, [2, 1]), [X], lambda x: np.tile(x, (2, 1))),
    "repeat_interleave": Case(lambda x: F.repeat_interleave(x, 2, axis=0), [X], lambda x: np.repeat(x, 2, axis=0)),
    "pad": Case(lambda x: F.pad(x, [1, 0, 0, 2], value=0), [X], lambda x: np.pad(x, [(1, 0), (0, 2)])),
    "slice_tensor": Case(lambda x: F.slice_tensor(x, [slice(None, None, -1), slice(1, 3)]), [X], lambda x: x[::-1, 1:3]),
    "band_part": Case(lambda x: F.band_part(x, 1, 0), [f32(4, 4)], lambda x: _np_band(x, 1, 0, False)),
    "as_interleaved_complex": Case(F.as_interleaved_complex, [f32(2, 6)], lambda x: x.reshape(2, 3, 2)),
    # gather / scatter
    "gather": Case(lambda x, i: F.gather(x, i, axis=1), [X, i64(2, 2, high=4)], lambda x, i: np.take(x, i, axis=1)),
    "gather_nd": Case(lambda x, i: F.gather_nd(x, i), [f32(4, 5, 3), i64(6, 2, high=4)], lambda x, i: _gather_nd_ref(x, i, 0)),
    "scatter": Case(
        lambda x, u, i: F.scatter(x, u, i, axis=1),
        [X, f32(3, 1), np.array([[2], [0], [3]], np.int64)],
        lambda x, u, i: _np_scatter_axis1(x, u, i),
    ),
    "scatter_nd": Case(
        lambda x, u, i: F.scatter_nd(x, u, i),
        [X, f32(2, 4), np.array([[2], [0]], np.int64)],
        lambda x, u, i: _np_scatter_rows(x, u, i),
    ),
    "masked_scatter": Case(
        lambda x, m, u: F.masked_scatter(x, m, u, out_dim=3),
        [f32(2, 3), np.array([[True, False, True], [False, True, False]]), f32(3)],
        lambda x, m, u: _np_masked_scatter(x, m, u),
    ),
    "nonzero": Case(lambda x: F.nonzero(x, out_dim=3), [np.array([[0, 3, 0], [4, 0, 5]], np.int32)], lambda x: np.argwhere(x)),
    # linear algebra, conv, pooling, signal
    "matmul": Case(F.matmul, [f32(2, 3, 4), f32(4, 5)], np.matmul, tol=1e-5),
    "conv2d": Case(lambda x, f: F.conv2d(x, f, stride=(2, 1), padding=(1, 1, 0, 1)), [IMG, f32(3, 2, 2, 4)], lambda x, f: np_conv(x, f, (2, 1), (1, 1), (1, 1, 0, 1)), tol=1e-4),
    "conv2d_transpose": Case(lambda x, f: F.conv2d_transpose(x, f, stride=(2, 2)), [IMG, f32(2, 2, 3, 2)], lambda x, f: np_conv_transpose(x, f, (2, 2), (1, 1), (0, 0, 0, 0), (0, 0)), tol=1e-4),
    "conv3d": Case(lambda x, f: F.conv3d(x, f), [VOL, f32(2, 2, 2, 2, 3)], lambda x, f: np_conv(x, f, (1, 1, 1), (1, 1, 1), (0,) * 6), tol=1e-4),
    "max_pool2d": Case(lambda x: F.max_pool2d(x, (2, 2), stride=2), [IMG], lambda x: np_pool(x, (2, 2), (2, 2), (1, 1), (0, 0), False, "max")),
    "avg_pool2d": Case(lambda x: F.avg_pool2d(x, (3, 3), stride=1, padding=1), [IMG], lambda x: np_pool(x, (3, 3), (1, 1), (1, 1), (1, 1), False, "avg"), tol=1e-5),
    "fold": Case(lambda x: F.fold(x, (3, 4), (2, 2)), [f32(1, 8, 6)], lambda x: np_fold(x, (3, 4), (2, 2), (1, 1), (1, 1), (0, 0)), tol=1e-5),
    "irfft": Case(lambda x: F.irfft(x, n=6, input_is_complex=True), [f32(2, 4, 2)], lambda x: np.fft.irfft(x[..., 0] + 1j * x[..., 1], n=6), tol=1e-5),
    # creation (no tensor inputs)
    "range": Case(lambda: F.range(0, 10, 3, dtype=DType.int32, device=DeviceRef.CPU()), [], lambda: np.arange(0, 10, 3, dtype=np.int32)),
    "hann_window": Case(lambda: F.hann_window(6, DeviceRef.CPU()), [], lambda: _hann_ref(6, True), tol=1e-6),
    "constant": Case(lambda: F.constant([[1.5, 2.0]], DType.float32, DeviceRef.CPU()), [], lambda: np.array([[1.5, 2.0]], np.float32)),
    # devices
    "transfer_to": Case(lambda x: F.transfer_to(x, DeviceRef.CPU()), [X], lambda x: x),
}


def _np_scatter_axis1(x, u, i):
    out = x.copy()
    for r in range(i.shape[0]):
        for c in range(i.shape[1]):
            out[r, i[r, c]] = u[r, c]
    return out


def _np_scatter_rows(x, u, i):
    out = x.copy()
    out[i[:, 0]] = u
    return out


def _np_masked_scatter(x, m, u):
    out = x.copy()
    out[m] = u[: m.sum()]
    return out


# Ops checked in other files (graph-only in practice, or registry plumbing).
ELSEWHERE = {
    "buffer_store": "test_functional_graph_only",
    "buffer_store_slice": "test_functional_graph_only",
    "constant_external": "test_functional_graph_only",
    "custom": "test_functional_custom",
    "functional": "test_functional_decorator",
}


def test_every_functional_name_is_tested():
    documented = set(F.__all__)
    assert documented == set(CASES) | set(ELSEWHERE), sorted(documented ^ (set(CASES) | set(ELSEWHERE)))


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _numpy(out: Any) -> list[np.ndarray]:
    return [np.asarray(t.to_numpy()) for t in _as_list(out)]


def _compare(name: str, got: list[np.ndarray], case: Case, way: str) -> None:
    want = [np.asarray(w) for w in _as_list(case.ref(*case.inputs))]
    assert len(got) == len(want), f"{name} ({way}): {len(got)} outputs, expected {len(want)}"
    for g, w in zip(got, want):
        assert g.shape == w.shape, f"{name} ({way}): shape {g.shape} != {w.shape}"
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=case.tol, atol=case.tol, err_msg=f"{name} ({way})")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{name} ({way})")


def _identity(t: Tensor) -> Tensor:
    """A pending no-op node, so that inputs and outputs of the op are part of one lazy graph."""
    return F.reshape(t, t.shape)


@pytest.mark.parametrize("name", sorted(CASES))
def test_three_ways(name):
    case = CASES[name]
    # 1. eager, realized per op
    eager = _numpy(case.fn(*[Tensor.constant(a) for a in case.inputs]))
    _compare(name, eager, case, "eager")

    # 2. fused: pending inputs, op, pending outputs; the second run goes through the compiled program
    def fused_once():
        pending_inputs = [_identity(Tensor.constant(a)) for a in case.inputs]
        outs = [_identity(o) for o in _as_list(case.fn(*pending_inputs))]
        assert all(not o.real for o in outs) or name in {"nonzero", "masked_scatter", "transfer_to"}
        return _numpy(outs)

    fused_once()
    before = eager_stats()
    fused = fused_once()
    after = eager_stats()
    if name not in {"nonzero", "masked_scatter", "transfer_to"}:  # these run immediately by design
        assert after["fused_runs"] > before["fused_runs"], f"{name}: second run did not use the fused program"
    _compare(name, fused, case, "fused")

    # 3. under jax.jit
    jitted = jax.jit(lambda *ts: case.fn(*ts))(*[Tensor.constant(a) for a in case.inputs])
    traced = _numpy(jitted)
    _compare(name, traced, case, "jit")

    # Fusion may reorder float rounding (XLA); beyond that the three must agree.
    for a, b, c in zip(eager, fused, traced):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6, err_msg=f"{name}: eager vs fused")
        np.testing.assert_allclose(a, c, rtol=2e-6, atol=1e-6, err_msg=f"{name}: eager vs jit")
