"""The op table: one record per registry op (JAX's ``lax_test_util.lax_ops()`` pattern).

A record (`OpRecord`) holds the op's examples and names the ``tests/ops``
modules that test it through the graph API. An `Example` is a call of the op's
front on Tensors made from numpy ``inputs``; it is a *value* example when it
has a numpy ``reference`` (checked with tolerance ``tol``) and a *gradient*
example when it names the inputs it differentiates (``wrt``).

The table is iterated, keyed by ``lowering.registry.all_ops()``, by:

- ``tests/ops/test_registry_coverage.py``: every registered op has a record,
  every record a registered op, every differentiable op a gradient example
  (or a ``no_grad`` reason);
- ``tests/eager/test_functional_three_ways.py``: every value example, eager,
  fused and under ``jax.jit``, against its reference;
- ``tests/ops/test_grad_check.py``: every gradient example, JAX's VJP through the
  op against finite differences.

A new op gets one entry in `OP_TABLE` below, e.g.::

    "softsign": record("test_elementwise",
                       value((X,), lambda x: x / (1 + np.abs(x))),
                       grad((u(5),))),

References are numpy/scipy (or gguf), never maxfx itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.special

from lowering.context import bind
from lowering.ops.advanced_indexing import setitem
from lowering.registry import get_op
from maxfx.dtype import DType
from maxfx.graph import DeviceRef
from maxfx.graph.quantization import QuantizationEncoding
from tests.custom_calls.test_qmatmul_reference import gguf_dequant, random_blocks
from tests.ops.test_attention_ops import np_attend
from tests.ops.test_creation import _hann_ref
from tests.ops.test_indexing import _gather_nd_ref
from tests.ops.test_nn_ops import (
    np_conv,
    np_conv_transpose,
    np_fold,
    np_pool,
    np_resize,
    np_roi_align,
)
from tests.ops.test_reduction import _np_cumsum, _np_layer_norm, _np_softmax
from tests.ops.test_shape import _np_band

__all__ = ["OP_TABLE", "Example", "OpRecord", "grad", "record", "value"]


# ─── records ──────────────────────────────────────────────────────────────


def _apply(f: Callable[..., Any], *tensors: Any) -> Any:
    return f(*tensors)


@dataclass(frozen=True)
class Example:
    """``call(f, *tensors)``: the op's front ``f`` applied to Tensors holding ``inputs``.

    Attributes:
        call: builds the op from its front and the input Tensors.
        inputs: numpy arrays, one Tensor each.
        reference: numpy ``reference(*inputs)`` → the expected output (or list of
            outputs); None for a gradient-only example.
        tol: ``rtol = atol`` of the value check (exact for int/bool outputs).
        wrt: indices of the inputs the gradient check differentiates (cast to
            ``grad_dtype``); the others are fixed. Empty: not a gradient example.
        grad_dtype: dtype of the differentiated inputs.
        grad_tol: ``check_grads`` ``atol = rtol``; None: JAX's per-dtype default.
        grad_jit: check under one ``jax.jit`` (False: op by op).
    """

    call: Callable[..., Any]
    inputs: tuple[np.ndarray, ...]
    reference: Callable[..., Any] | None = None
    tol: float = 1e-5
    wrt: tuple[int, ...] = ()
    grad_dtype: Any = np.float64
    grad_tol: float | None = None
    grad_jit: bool = True


@dataclass(frozen=True)
class OpRecord:
    """Everything the tests know about one op.

    Attributes:
        tested_in: the ``tests/ops`` modules (``"test_shape"``) with the op's
            graph-API tests (errors, dtypes, symbolic dims, edge cases).
        examples: value and gradient examples.
        no_grad: why a differentiable op has no gradient example.
    """

    tested_in: tuple[str, ...]
    examples: tuple[Example, ...] = ()
    no_grad: str = ""

    @property
    def values(self) -> list[Example]:
        return [e for e in self.examples if e.reference is not None]

    @property
    def grads(self) -> list[Example]:
        return [e for e in self.examples if e.wrt]


def record(tested_in: str | Sequence[str], *examples: Example, no_grad: str = "") -> OpRecord:
    """An `OpRecord` (``tested_in`` a module name or several)."""
    modules = (tested_in,) if isinstance(tested_in, str) else tuple(tested_in)
    return OpRecord(modules, examples, no_grad)


def value(
    inputs: Sequence[np.ndarray], reference: Callable[..., Any], call: Callable[..., Any] = _apply, *, tol: float = 1e-5
) -> Example:
    """A value example: ``call(f, *inputs)`` against ``reference(*inputs)``."""
    return Example(call, tuple(inputs), reference, tol)


def grad(
    inputs: Sequence[np.ndarray],
    call: Callable[..., Any] = _apply,
    *,
    wrt: Sequence[int] | None = None,
    dtype: Any = np.float64,
    tol: float | None = None,
    jit: bool = True,
) -> Example:
    """A gradient example differentiating the inputs ``wrt`` (default: all of them)."""
    return Example(
        call,
        tuple(inputs),
        wrt=tuple(range(len(inputs)) if wrt is None else wrt),
        grad_dtype=dtype,
        grad_tol=tol,
        grad_jit=jit,
    )


# ─── inputs ───────────────────────────────────────────────────────────────

# Two streams, so that adding an example of one kind leaves the other's data alone.
_VALUES = np.random.default_rng(1234)
_GRADS = np.random.default_rng(0)


def f32(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return _VALUES.uniform(low, high, size=shape).astype(np.float32)


def i64(*shape: int, low: int = 0, high: int = 5) -> np.ndarray:
    return _VALUES.integers(low, high, size=shape).astype(np.int64)


def boolean(*shape: int) -> np.ndarray:
    return _VALUES.random(shape) > 0.5


def u(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    """Gradient-check data (float64 by default)."""
    return _GRADS.uniform(lo, hi, size=shape)


def away(*shape: int, margin: float = 0.3) -> np.ndarray:
    """Values with |x| >= margin (kinks at 0 stay out of finite differences' reach)."""
    x = u(*shape)
    return np.where(np.abs(x) < margin, np.sign(x + 1e-9) * (margin + np.abs(x)), x)


def distinct(*shape: int) -> np.ndarray:
    """A shuffled grid: no ties (max, pools and top_k are differentiable away from ties)."""
    n = int(np.prod(shape))
    return _GRADS.permutation(np.linspace(-2, 2, n)).reshape(shape)


def _u32(a: Any) -> np.ndarray:
    return np.asarray(a, np.uint32)


def _idx(a: Any) -> np.ndarray:
    return np.asarray(a, np.int64)


def _q4_0_weight(n: int, k: int) -> np.ndarray:
    """A GGUF Q4_0 matrix [n, k/32 * 18]: a float16 scale then 16 bytes of nibbles per block."""
    blocks = _GRADS.integers(0, 256, size=(n, k // 32, 18), dtype=np.uint8)
    blocks[..., :2] = np.frombuffer(np.float16(0.05).tobytes(), np.uint8)
    return blocks.reshape(n, -1)


X = f32(3, 4)
Y = f32(3, 4)
POS = f32(3, 4, low=0.1, high=3.0)
UNIT = f32(3, 4, low=-0.9, high=0.9)
IMG = f32(1, 5, 5, 2)
VOL = f32(1, 4, 4, 4, 2)
SPECIALS = np.array([1.0, np.inf, -np.inf, np.nan], np.float32)
Q4_0_ROWS = random_blocks(np.random.default_rng(7), "Q4_0", 5, 2)  # 5 rows of 64 weights
CPU = DeviceRef.CPU()

_MOD_X = np.array([[2.3, -3.1, 5.2], [0.7, -1.3, 4.4]])
_MOD_Y = np.array([[1.5, 1.7, -1.9], [-1.6, 1.4, 1.8]])  # x / y stays away from integers
_Q4_0 = _q4_0_weight(3, 32)
_Q8_VALUES = np.random.default_rng(3).integers(-127, 128, (5, 64), dtype=np.int8)
_Q8_SCALES = np.full((5, 2), 0.01, np.float16)


# ─── numpy references not in the per-family test modules ─────────────────


def _gelu(x):
    return 0.5 * x * (1 + scipy.special.erf(x / math.sqrt(2)))


def _scatter_axis1(x, upd, idx):
    out = x.copy()
    for r in range(idx.shape[0]):
        for c in range(idx.shape[1]):
            out[r, idx[r, c]] = upd[r, c]
    return out


def _set_rows(x, upd, idx):
    out = x.copy()
    out[idx] = upd
    return out


def _scatter_rows(x, upd, idx):
    out = x.copy()
    out[idx[:, 0]] = upd
    return out


_UFUNCS = {"add": np.add, "max": np.maximum, "min": np.minimum, "mul": np.multiply}


def _scatter_reduce_axis0(kind):
    """numpy reference of scatter_<kind>(x, upd, idx, axis=0): duplicates combine with the ufunc."""

    def ref(x, upd, idx):
        out = x.copy()
        cols = np.broadcast_to(np.arange(idx.shape[1]), idx.shape)
        _UFUNCS[kind].at(out, (idx, cols), upd)
        return out

    return ref


def _scatter_nd_reduce_rows(kind):
    """numpy reference of scatter_nd_<kind>(x, upd, idx) with [n, 1] row indices."""

    def ref(x, upd, idx):
        out = x.copy()
        _UFUNCS[kind].at(out, idx[:, 0], upd)
        return out

    return ref


def _masked_scatter(x, mask, upd):
    out = x.copy()
    out[mask] = upd[: mask.sum()]
    return out


def _keepdims_reduction(
    method: str, axis: int, grad_input: np.ndarray, grad_axis: int, *, tol: float = 1e-5
) -> OpRecord:
    """The record of an axis reduction ``f(x, axis=...)``, which keeps the axis: its value against numpy's
    ``x.<method>(axis, keepdims=True)`` on ``X``, its gradient on ``grad_input`` along ``grad_axis``."""
    return record(
        "test_reduction",
        value((X,), lambda x: getattr(x, method)(axis=axis, keepdims=True), lambda f, x: f(x, axis=axis), tol=tol),
        grad((grad_input,), lambda f, x: f(x, axis=grad_axis)),
    )


def _attention(q, k, v, scale):
    """Causal attention of each batch row (queries at positions 0..Sq-1, all keys visible)."""
    return np.stack(
        [np_attend(q[b], k[b], v[b], np.arange(q.shape[1]), k.shape[1], "causal", scale) for b in range(q.shape[0])]
    )


# ─── the table: registry op name → record ─────────────────────────────────

_GRAPH_ONLY = "graph-only: runs nested Graph blocks (no eager/traced impl); inside JAX transforms use jax.lax.cond"

OP_TABLE: dict[str, OpRecord] = {
    # core and devices
    "constant": record(
        "test_core",
        value((), lambda: np.array([[1.5, 2.0]], np.float32), lambda f: f([[1.5, 2.0]], DType.float32, CPU)),
    ),
    "cast": record(
        "test_core",
        value((X * 3,), lambda x: (x * 1).astype(np.int32), lambda f, x: f(x, DType.int32)),
        grad((u(3),), lambda f, x: x.cast(DType.float64), dtype=np.float32, tol=1e-2),
    ),
    "weight": record("test_core"),
    "transfer_to": record(
        "test_debug_collective",
        value((X,), lambda x: x, lambda f, x: f(x, CPU)),
        # The front skips same-device copies; bind the op itself for a CPU→CPU transfer.
        grad((u(3),), lambda f, x: bind(get_op("transfer_to"), x, device=CPU)),
    ),
    "print": record("test_debug_collective"),
    "export_tensor": record("test_debug_export"),
    "allgather": record(
        "test_debug_collective",
        no_grad=(
            "a collective over several devices with signal buffers; needs a multi-device setup (see the "
            "multi-device tests)"
        ),
    ),
    "allreduce_sum": record(
        "test_allreduce",
        no_grad=(
            "a collective over several devices with signal buffers; needs a multi-device setup (see the "
            "multi-device tests)"
        ),
    ),
    "distributed_broadcast": record(
        "test_debug_collective",
        no_grad=(
            "a collective over several devices with signal buffers; needs a multi-device setup (see the "
            "multi-device tests)"
        ),
    ),
    "shard_and_stack": record(
        "test_debug_collective",
        value(
            (X, Y), lambda a, b: np.split(np.stack([a, b]), 2, axis=2), lambda f, a, b: f([a, b], [CPU, CPU], axis=1)
        ),
        grad((u(4, 3), u(4, 3)), lambda f, a, b: tuple(f([a, b], [CPU, CPU], axis=0))),
    ),
    # elementwise unary
    "abs": record("test_elementwise", value((X,), np.abs), grad((away(3, 4),))),
    "acos": record("test_elementwise", value((UNIT,), np.arccos), grad((u(5, lo=-0.8, hi=0.8),))),
    "atanh": record("test_elementwise", value((UNIT,), np.arctanh), grad((u(5, lo=-0.8, hi=0.8),))),
    "cos": record("test_elementwise", value((X,), np.cos), grad((u(5),))),
    "erf": record("test_elementwise", value((X,), scipy.special.erf), grad((u(5),))),
    "exp": record("test_elementwise", value((X,), np.exp), grad((u(5),))),
    "floor": record("test_elementwise", value((X,), np.floor)),
    "ceil": record("test_elementwise", value((X,), np.ceil)),
    "gelu": record(
        "test_elementwise",
        value((X,), _gelu),
        grad((u(5),), lambda f, x: (f(x), f(x, approximate="tanh"))),
    ),
    "is_inf": record("test_elementwise", value((SPECIALS,), np.isinf)),
    "is_nan": record("test_elementwise", value((SPECIALS,), np.isnan)),
    "log": record("test_elementwise", value((POS,), np.log), grad((u(5, lo=0.5, hi=3),))),
    "log1p": record("test_elementwise", value((POS,), np.log1p), grad((u(5, lo=-0.5, hi=3),))),
    "logical_not": record("test_elementwise", value((boolean(3, 4),), np.logical_not)),
    "negate": record("test_elementwise", value((X,), np.negative), grad((u(5),))),
    "relu": record("test_elementwise", value((X,), lambda x: np.maximum(x, 0)), grad((away(3, 4),))),
    # numpy rounds half to even, as MAX does
    "round": record("test_elementwise", value((np.array([0.5, 1.5, 2.5, -0.5, 1.2], np.float32),), np.round)),
    "rsqrt": record("test_elementwise", value((POS,), lambda x: 1 / np.sqrt(x)), grad((u(5, lo=0.5, hi=3),))),
    "sigmoid": record("test_elementwise", value((X,), lambda x: 1 / (1 + np.exp(-x))), grad((u(5),))),
    "silu": record("test_elementwise", value((X,), lambda x: x / (1 + np.exp(-x))), grad((u(5),))),
    "sin": record("test_elementwise", value((X,), np.sin), grad((u(5),))),
    "sqrt": record("test_elementwise", value((POS,), np.sqrt), grad((u(5, lo=0.5, hi=3),))),
    "tanh": record("test_elementwise", value((X,), np.tanh), grad((u(5),))),
    "trunc": record("test_elementwise", value((X,), np.trunc)),
    # elementwise binary, comparisons, logic, select
    "add": record("test_elementwise", value((X, Y), np.add), grad((u(2, 3), u(3)))),
    "sub": record("test_elementwise", value((X, Y), np.subtract), grad((u(2, 3), u(2, 1)))),
    "mul": record("test_elementwise", value((X, Y), np.multiply), grad((u(2, 3), u(2, 3)))),
    "div": record("test_elementwise", value((X, POS), np.divide, tol=1e-6), grad((u(2, 3), away(2, 3, margin=0.5)))),
    "mod": record("test_elementwise", value((X, POS), np.mod), grad((_MOD_X, _MOD_Y))),
    "floor_div": record(
        "test_elementwise", value((i64(3, 4, low=-9, high=9), i64(3, 4, low=1, high=4)), np.floor_divide)
    ),
    "pow": record("test_elementwise", value((POS, Y), np.power), grad((u(2, 3, lo=0.5, hi=2), u(2, 3)))),
    "maximum": record("test_reduction", value((X, Y), np.maximum), grad((distinct(2, 3), distinct(2, 3) + 0.05))),
    "minimum": record("test_reduction", value((X, Y), np.minimum), grad((distinct(2, 3), distinct(2, 3) + 0.05))),
    "equal": record("test_elementwise", value((i64(3, 4), i64(3, 4)), np.equal)),
    "not_equal": record("test_elementwise", value((i64(3, 4), i64(3, 4)), np.not_equal)),
    "greater": record("test_elementwise", value((X, Y), np.greater)),
    "greater_equal": record("test_elementwise", value((i64(3, 4), i64(3, 4)), np.greater_equal)),
    "logical_and": record("test_elementwise", value((boolean(3, 4), boolean(3, 4)), np.logical_and)),
    "logical_or": record("test_elementwise", value((boolean(3, 4), boolean(3, 4)), np.logical_or)),
    "logical_xor": record("test_elementwise", value((boolean(3, 4), boolean(3, 4)), np.logical_xor)),
    "where": record(
        "test_elementwise",
        value((boolean(3, 4), X, Y), np.where),
        grad((np.array([[True, False, True], [False, True, False]]), u(2, 3), u(2, 3)), wrt=(1, 2)),
    ),
    "complex_mul": record(
        "test_elementwise",
        no_grad=(
            "no front in the registry (MAX's ops.complex.mul lives in a submodule): its values are checked against "
            "numpy's complex product in test_elementwise"
        ),
    ),
    "outer": record("test_elementwise", value((f32(3), f32(4)), np.outer), grad((u(3), u(4)))),
    # reductions, scans, normalisation (reductions keep the axis)
    "argmax": record("test_reduction", value((X,), lambda x: np.argmax(x, axis=1)[:, None], lambda f, x: f(x, axis=1))),
    "argmin": record("test_reduction", value((X,), lambda x: np.argmin(x, axis=0)[None, :], lambda f, x: f(x, axis=0))),
    "reduce_max": _keepdims_reduction("max", -1, distinct(3, 4), -1),
    "reduce_min": _keepdims_reduction("min", 0, distinct(3, 4), 0),
    "mean": _keepdims_reduction("mean", 1, u(3, 2), -1, tol=1e-6),
    "sum": _keepdims_reduction("sum", 0, u(3, 2), 0),
    "prod": _keepdims_reduction("prod", 1, u(3, 2), -1),
    "cumsum": record(
        "test_reduction",
        value((X,), lambda x: _np_cumsum(x, 1, True, True), lambda f, x: f(x, axis=1, exclusive=True, reverse=True)),
        grad((u(3, 4),), lambda f, x: (f(x, axis=-1), f(x, axis=0, exclusive=True, reverse=True))),
    ),
    "softmax": record(
        "test_reduction",
        value((X,), lambda x: _np_softmax(x, -1), lambda f, x: f(x, axis=-1), tol=1e-6),
        grad((u(2, 4),)),
    ),
    "logsoftmax": record(
        "test_reduction",
        value((X,), lambda x: np.log(_np_softmax(x, -1)), lambda f, x: f(x, axis=-1)),
        grad((u(2, 4),), lambda f, x: f(x, axis=0)),
    ),
    "top_k": record(
        "test_reduction",
        value(
            (X,),
            lambda x: [np.sort(x, -1)[:, ::-1][:, :2], np.argsort(-x, -1, kind="stable")[:, :2]],
            lambda f, x: f(x, 2, axis=-1),
        ),
        grad((distinct(2, 5),), lambda f, x: f(x, 2)[0]),
    ),
    "argsort": record(
        "test_reduction", value((f32(7),), lambda x: np.argsort(-x, kind="stable"), lambda f, x: f(x, ascending=False))
    ),
    "layer_norm": record(
        "test_reduction",
        value((X, f32(4), f32(4)), lambda x, g, b: _np_layer_norm(x, g, b, 1e-5), lambda f, x, g, b: f(x, g, b, 1e-5)),
        grad((u(3, 4), u(4), u(4)), lambda f, x, g, b: f(x, g, b, 1e-5)),
    ),
    # shape and layout
    "reshape": record(
        "test_shape",
        value((X,), lambda x: x.reshape(2, -1), lambda f, x: f(x, [2, -1])),
        grad((u(2, 3),), lambda f, x: f(x, [3, 2])),
    ),
    "flatten": record("test_shape", value((X,), lambda x: x.reshape(-1)), grad((u(2, 3, 2),), lambda f, x: f(x, 1))),
    "squeeze": record(
        "test_shape",
        value((f32(3, 1, 2),), lambda x: x.squeeze(1), lambda f, x: f(x, 1)),
        grad((u(2, 1, 3),), lambda f, x: f(x, 1)),
    ),
    "unsqueeze": record(
        "test_shape",
        value((X,), lambda x: x[..., None], lambda f, x: f(x, -1)),
        grad((u(2, 3),), lambda f, x: f(x, 0)),
    ),
    "transpose": record(
        "test_shape",
        value((X,), lambda x: x.T, lambda f, x: f(x, 0, 1)),
        grad((u(2, 3, 2),), lambda f, x: f(x, 0, 2)),
    ),
    "permute": record(
        "test_shape",
        value((f32(2, 3, 4),), lambda x: x.transpose(2, 0, 1), lambda f, x: f(x, [2, 0, 1])),
        grad((u(2, 3, 2),), lambda f, x: f(x, [2, 0, 1])),
    ),
    "broadcast_to": record(
        "test_shape",
        value((f32(1, 4),), lambda x: np.broadcast_to(x, (3, 4)), lambda f, x: f(x, [3, 4])),
        grad((u(3, 1),), lambda f, x: f(x, [2, 3, 4])),
    ),
    "rebind": record(
        "test_shape", value((X,), lambda x: x, lambda f, x: f(x, [3, 4])), grad((u(2, 3),), lambda f, x: f(x, [2, 3]))
    ),
    "shape_to_tensor": record("test_shape"),
    "concat": record(
        "test_shape",
        value((X, Y), lambda a, b: np.concatenate([a, b], 1), lambda f, a, b: f([a, b], axis=1)),
        grad((u(2, 3), u(2, 1)), lambda f, a, b: f([a, b], axis=1)),
    ),
    "stack": record(
        "test_shape",
        value((X, Y), lambda a, b: np.stack([a, b], -1), lambda f, a, b: f([a, b], axis=-1)),
        grad((u(2, 3), u(2, 3)), lambda f, a, b: f([a, b], axis=0)),
    ),
    "split": record(
        "test_shape",
        value((X,), lambda x: np.split(x, [1], axis=1), lambda f, x: f(x, [1, 3], axis=1)),
        grad((u(2, 3),), lambda f, x: tuple(f(x, [1, 2], axis=1))),
    ),
    "chunk": record(
        "test_shape",
        value((X,), lambda x: np.split(x, 2, axis=1), lambda f, x: f(x, 2, axis=1)),
        grad((u(4, 3),), lambda f, x: tuple(f(x, 2, axis=0))),
    ),
    "tile": record(
        "test_shape",
        value((X,), lambda x: np.tile(x, (2, 1)), lambda f, x: f(x, [2, 1])),
        grad((u(2, 3),), lambda f, x: f(x, [2, 1])),
    ),
    "repeat_interleave": record(
        "test_shape",
        value((X,), lambda x: np.repeat(x, 2, axis=0), lambda f, x: f(x, 2, axis=0)),
        grad((u(2, 3),), lambda f, x: f(x, 2, axis=1)),
    ),
    "pad": record(
        "test_shape",
        value((X,), lambda x: np.pad(x, [(1, 0), (0, 2)]), lambda f, x: f(x, [1, 0, 0, 2], value=0)),
        grad((u(2, 3),), lambda f, x: f(x, [1, 0, 0, 2])),
    ),
    "band_part": record(
        "test_shape",
        value((f32(4, 4),), lambda x: _np_band(x, 1, 0, False), lambda f, x: f(x, 1, 0)),
        grad((u(3, 3),), lambda f, x: f(x, num_lower=0, num_upper=1)),
    ),
    "as_interleaved_complex": record("test_shape", value((f32(2, 6),), lambda x: x.reshape(2, 3, 2)), grad((u(2, 4),))),
    # indexing: slices, gather / scatter
    "slice_tensor": record(
        "test_indexing",
        value((X,), lambda x: x[::-1, 1:3], lambda f, x: f(x, [slice(None, None, -1), slice(1, 3)])),
        grad((u(4, 3),), lambda f, x: f(x, [slice(1, 3), 2])),
    ),
    "gather": record(
        "test_indexing",
        value((X, i64(2, 2, high=4)), lambda x, i: np.take(x, i, axis=1), lambda f, x, i: f(x, i, axis=1)),
        grad((u(3, 2), _idx([2, 0, 2])), lambda f, x, i: f(x, i, 0), wrt=(0,)),
    ),
    "gather_nd": record(
        "test_indexing",
        value((f32(4, 5, 3), i64(6, 2, high=4)), lambda x, i: _gather_nd_ref(x, i, 0)),
        grad((u(3, 2, 2), _idx([[0, 1], [2, 0]])), wrt=(0,)),
    ),
    "scatter": record(
        "test_indexing",
        value((X, f32(3, 1), _idx([[2], [0], [3]])), _scatter_axis1, lambda f, x, upd, i: f(x, upd, i, axis=1)),
        grad((u(2, 3), u(2, 2), _idx([[1, 0], [2, 1]])), lambda f, x, upd, i: f(x, upd, i, axis=1), wrt=(0, 1)),
    ),
    "scatter_nd": record(
        "test_indexing",
        value((X, f32(2, 4), _idx([[2], [0]])), _scatter_rows),
        grad((u(3, 2), u(2, 2), _idx([[2], [0]])), wrt=(0, 1)),
    ),
    "scatter_add": record(
        "test_indexing",
        value(
            (X, f32(3, 4), _idx([[2, 0, 1, 2], [0, 0, 2, 1], [2, 1, 1, 0]])),
            _scatter_reduce_axis0("add"),
            lambda f, x, upd, i: f(x, upd, i, axis=0),
        ),
        grad(
            (u(3, 4), u(2, 4), _idx([[2, 0, 1, 2], [0, 1, 2, 0]])),
            lambda f, x, upd, i: f(x, upd, i, axis=0),
            wrt=(0, 1),
        ),
    ),
    "scatter_nd_add": record(
        "test_indexing",
        value((X, f32(3, 4), _idx([[2], [0], [2]])), _scatter_nd_reduce_rows("add")),
        grad((u(3, 2), u(2, 2), _idx([[2], [0]])), wrt=(0, 1)),
    ),
    "scatter_max": record(
        "test_indexing",
        value(
            (X, f32(3, 4), _idx([[2, 0, 1, 2], [0, 0, 2, 1], [2, 1, 1, 0]])),
            _scatter_reduce_axis0("max"),
            lambda f, x, upd, i: f(x, upd, i, axis=0),
        ),
        grad(
            (u(3, 4), u(2, 4), _idx([[2, 0, 1, 2], [0, 1, 2, 0]])),
            lambda f, x, upd, i: f(x, upd, i, axis=0),
            wrt=(0, 1),
        ),
    ),
    "scatter_nd_max": record(
        "test_indexing",
        value((X, f32(3, 4), _idx([[2], [0], [2]])), _scatter_nd_reduce_rows("max")),
        grad((u(3, 2), u(2, 2), _idx([[2], [0]])), wrt=(0, 1)),
    ),
    "scatter_min": record(
        "test_indexing",
        value(
            (X, f32(3, 4), _idx([[2, 0, 1, 2], [0, 0, 2, 1], [2, 1, 1, 0]])),
            _scatter_reduce_axis0("min"),
            lambda f, x, upd, i: f(x, upd, i, axis=0),
        ),
        grad(
            (u(3, 4), u(2, 4), _idx([[2, 0, 1, 2], [0, 1, 2, 0]])),
            lambda f, x, upd, i: f(x, upd, i, axis=0),
            wrt=(0, 1),
        ),
    ),
    "scatter_nd_min": record(
        "test_indexing",
        value((X, f32(3, 4), _idx([[2], [0], [2]])), _scatter_nd_reduce_rows("min")),
        grad((u(3, 2), u(2, 2), _idx([[2], [0]])), wrt=(0, 1)),
    ),
    "scatter_mul": record(
        "test_indexing",
        value(
            (X, f32(3, 4), _idx([[2, 0, 1, 2], [0, 0, 2, 1], [2, 1, 1, 0]])),
            _scatter_reduce_axis0("mul"),
            lambda f, x, upd, i: f(x, upd, i, axis=0),
        ),
        no_grad=(
            "JAX differentiates a scatter-multiply only with unique indices (its gradient is not defined for "
            "duplicates)"
        ),
    ),
    "scatter_nd_mul": record(
        "test_indexing",
        value((X, f32(3, 4), _idx([[2], [0], [2]])), _scatter_nd_reduce_rows("mul")),
        no_grad=(
            "JAX differentiates a scatter-multiply only with unique indices (its gradient is not defined for "
            "duplicates)"
        ),
    ),
    "masked_scatter": record(
        "test_indexing",
        value(
            (f32(2, 3), np.array([[True, False, True], [False, True, False]]), f32(3)),
            _masked_scatter,
            lambda f, x, m, upd: f(x, m, upd, out_dim=3),
        ),
        grad(
            (u(2, 2), np.array([[True, False], [False, True]]), u(3)),
            lambda f, x, m, upd: f(x, m, upd, out_dim=2),
            wrt=(0, 2),
        ),
    ),
    "nonzero": record(
        "test_indexing", value((np.array([[0, 3, 0], [4, 0, 5]], np.int32),), np.argwhere, lambda f, x: f(x, out_dim=3))
    ),
    # advanced indexing (x[idx], x[idx] = v; no front: Tensor/TensorValue indexing and ops.custom reach them)
    "advanced_indexing_getitem": record(
        "test_advanced_indexing",
        value((X, _idx([[2, 0], [-1, 1]])), lambda x, i: x[i], lambda f, x, i: x[i]),
        value((f32(2, 3, 4), _idx([1, 0]), _idx([2, -1])), lambda x, i, j: x[i, :, j], lambda f, x, i, j: x[i, :, j]),
        grad((u(3, 2), _idx([2, 0, 2])), lambda f, x, i: x[i], wrt=(0,)),
    ),
    "advanced_indexing_setitem": record(
        "test_advanced_indexing",
        value((X, f32(2, 4), _idx([2, 0])), _set_rows, lambda f, x, upd, i: setitem(x, i, upd)),
        grad((u(3, 2), u(2, 2), _idx([2, 0])), lambda f, x, upd, i: setitem(x, i, upd), wrt=(0, 1)),
    ),
    "advanced_indexing_setitem_inplace": record("test_advanced_indexing"),
    # linear algebra, convolution, pooling, signal
    "matmul": record("test_linalg", value((f32(2, 3, 4), f32(4, 5)), np.matmul), grad((u(2, 3), u(3, 4)))),
    "conv2d": record(
        "test_nn_ops",
        value(
            (IMG, f32(3, 2, 2, 4)),
            lambda x, w: np_conv(x, w, (2, 1), (1, 1), (1, 1, 0, 1)),
            lambda f, x, w: f(x, w, stride=(2, 1), padding=(1, 1, 0, 1)),
            tol=1e-4,
        ),
        grad((u(1, 4, 4, 2), u(3, 2, 2, 3), u(3)), lambda f, x, w, b: f(x, w, bias=b, padding=(1, 0, 0, 1))),
    ),
    "conv2d_transpose": record(
        "test_nn_ops",
        value(
            (IMG, f32(2, 2, 3, 2)),
            lambda x, w: np_conv_transpose(x, w, (2, 2), (1, 1), (0, 0, 0, 0), (0, 0)),
            lambda f, x, w: f(x, w, stride=(2, 2)),
            tol=1e-4,
        ),
        grad((u(1, 2, 3, 2), u(2, 2, 3, 2)), lambda f, x, w: f(x, w, stride=(2, 2))),
    ),
    "conv3d": record(
        "test_nn_ops",
        value((VOL, f32(2, 2, 2, 2, 3)), lambda x, w: np_conv(x, w, (1, 1, 1), (1, 1, 1), (0,) * 6), tol=1e-4),
        grad((u(1, 3, 3, 3, 2), u(2, 2, 2, 2, 2))),
    ),
    # Pools are checked op by op: under jax.jit their reverse mode fails (`test_pools_differentiate_under_jit`).
    "max_pool2d": record(
        "test_nn_ops",
        value(
            (IMG,),
            lambda x: np_pool(x, (2, 2), (2, 2), (1, 1), (0, 0), False, "max"),
            lambda f, x: f(x, (2, 2), stride=2),
        ),
        grad((distinct(1, 3, 3, 2),), lambda f, x: f(x, (2, 2), stride=1), jit=False),
    ),
    "avg_pool2d": record(
        "test_nn_ops",
        value(
            (IMG,),
            lambda x: np_pool(x, (3, 3), (1, 1), (1, 1), (1, 1), False, "avg"),
            lambda f, x: f(x, (3, 3), stride=1, padding=1),
        ),
        grad((u(1, 3, 3, 2),), lambda f, x: f(x, (2, 2), stride=1), jit=False),
    ),
    "fold": record(
        "test_nn_ops",
        value(
            (f32(1, 8, 6),),
            lambda x: np_fold(x, (3, 4), (2, 2), (1, 1), (1, 1), (0, 0)),
            lambda f, x: f(x, (3, 4), (2, 2)),
        ),
        grad((u(1, 4, 4),), lambda f, x: f(x, (3, 3), (2, 2))),
    ),
    "resize": record(
        "test_nn_ops",
        value((f32(1, 2, 5, 4),), lambda x: np_resize(x, (9, 7), "bilinear"), lambda f, x: f(x, [1, 2, 9, 7])),
        grad((u(1, 1, 3, 3),), lambda f, x: f(x, [1, 1, 5, 4])),
    ),
    "roi_align": record(
        "test_nn_ops",
        value(
            (f32(2, 6, 5, 3), np.array([[0, 0.5, 1.0, 4.0, 5.5], [1, -2.0, 0.0, 7.0, 3.0]], np.float32)),
            lambda x, r: np_roi_align(x, r, 3, 2, 1.0, 0.0, False, "AVG"),
            lambda f, x, r: f(x, r, 3, 2),
        ),
    ),
    "irfft": record(
        "test_nn_ops",
        value(
            (f32(2, 4, 2),),
            lambda x: np.fft.irfft(x[..., 0] + 1j * x[..., 1], n=6),
            lambda f, x: f(x, n=6, input_is_complex=True),
        ),
        grad((u(2, 4),), lambda f, x: f(x, n=6)),
    ),
    # creation (no tensor inputs) and random
    "range": record(
        "test_creation",
        value((), lambda: np.arange(0, 10, 3, dtype=np.int32), lambda f: f(0, 10, 3, dtype=DType.int32, device=CPU)),
    ),
    "hann_window": record("test_creation", value((), lambda: _hann_ref(6, True), lambda f: f(6, CPU), tol=1e-6)),
    "random_normal": record("test_random"),
    "random_uniform": record("test_random"),
    # buffers, control flow, custom kernels: graph-API ops, tested there
    "buffer_create": record("test_buffer"),
    "buffer_load": record("test_buffer"),
    "buffer_store": record("test_buffer"),
    "buffer_store_slice": record("test_buffer"),
    "cond": record("test_control_flow", no_grad=_GRAPH_ONLY),
    "call": record(
        "test_control_flow",
        no_grad="graph-only: calls a subgraph (no eager/traced impl); inside JAX transforms call the Python function",
    ),
    "while_loop": record("test_control_flow"),
    "custom": record("test_custom"),
    "inplace_custom": record("test_custom"),
    # quantized
    "dequantize": record(
        "test_quantized",
        value((Q4_0_ROWS,), lambda w: gguf_dequant("Q4_0", w), lambda f, w: f(QuantizationEncoding.Q4_0, w), tol=0.0),
    ),
    "qmatmul": record(
        "test_quantized",
        value(
            (f32(2, 64, low=-1, high=1), Q4_0_ROWS),
            lambda x, w: x.astype(np.float64) @ gguf_dequant("Q4_0", w).astype(np.float64).T,
            lambda f, x, w: f(QuantizationEncoding.Q4_0, None, x, w),
            tol=1e-4,  # on a CPU the kernel rounds x to int16 per 32 values (~3e-5 here)
        ),
        # Q4_0 weights are fixed bytes; the gradient flows to the float lhs (accumulated in float32).
        grad((u(2, 32), _Q4_0), lambda f, x, w: f("Q4_0", None, x, w), wrt=(0,), dtype=np.float32, tol=5e-2),
    ),
    "q8_0_matmul": record(
        "test_quantized",
        value(
            (f32(2, 64, low=-1, high=1), _Q8_VALUES, _Q8_SCALES),
            lambda x, q, d: x.astype(np.float64) @ (q.astype(np.float64) * 0.01).T,
            lambda f, x, q, d: f(x, q, d),
            tol=1e-3,
        ),
        # int8 values and float16 scales are fixed; the gradient flows to the float lhs.
        grad((u(2, 64), _Q8_VALUES, _Q8_SCALES), lambda f, x, q, d: f(x, q, d), wrt=(0,), dtype=np.float32, tol=5e-2),
    ),
    # attention family (accumulates in float32 whatever the input dtype: gradients checked in float32, loose tolerances)
    "attention": record(
        "test_attention_ops",
        value(
            (f32(2, 5, 4, 8), f32(2, 5, 2, 8), f32(2, 5, 2, 6)),
            lambda q, k, v: _attention(q, k, v, 0.3),
            lambda f, q, k, v: f(q, k, v, scale=0.3),
        ),
        grad(
            (u(1, 3, 2, 4), u(1, 3, 1, 4), u(1, 3, 1, 2)),
            lambda f, q, k, v: f(q, k, v, scale=0.5),
            dtype=np.float32,
            tol=2e-2,
        ),
    ),
    "ragged_attention": record(
        "test_attention_ops",
        grad(
            (u(5, 2, 4), u(5, 1, 4), u(5, 1, 3), _u32([0, 2, 5])),
            lambda f, q, k, v, rows: f(q, k, v, rows, scale=0.7),
            wrt=(0, 1, 2),
            dtype=np.float32,
            tol=2e-2,
        ),
    ),
    "paged_attention": record(
        ("test_attention_ops", "test_paged_decode_route"),
        # blocks [pages, 2 (k, v), layers, page_size, kv_heads, head_dim]; sequence 0 has 2 cached + 1 new token.
        grad(
            (u(1, 2, 4), u(2, 2, 1, 2, 1, 4), _u32([[1, 0]]), _u32(0), _u32([0, 1]), _u32([2])),
            lambda f, q, blocks, lookup, layer, rows, lengths: f(q, blocks, lookup, layer, rows, lengths, scale=0.5),
            wrt=(0, 1),
            dtype=np.float32,
            tol=2e-2,
        ),
    ),
    "kv_cache_store": record("test_attention_ops"),
    "paged_cache_attention": record("test_attention_ops"),
    "kv_cache_gather": record("test_attention_ops"),
    "rope_ragged": record(
        "test_attention_ops",
        grad((u(3, 2, 4), u(4, 4), _u32([0, 2, 3]), _u32([1, 0])), wrt=(0, 1), dtype=np.float32, tol=2e-2),
    ),
    # fused serving kernels
    "quantize_static_float8": record("test_fused_ops"),
    "quantize_dynamic_float8": record("test_fused_ops"),
    "scaled_matmul": record("test_fused_ops"),
    "grouped_matmul_ragged": record("test_fused_ops"),
    "grouped_scaled_matmul_ragged": record("test_fused_ops"),
    "moe_create_indices": record("test_fused_ops"),
    "sgmv": record("test_fused_ops"),
    "topk_sampling": record("test_fused_ops"),
    "merge_ragged_tensors": record("test_fused_ops"),
    "apply_penalties": record("test_fused_ops"),
    "update_frequency_data": record("test_fused_ops"),
    "min_p_mask": record("test_fused_ops"),
    "apply_packed_bitmask": record("test_fused_ops"),
    "topk_topp_masked_probs": record("test_fused_ops"),
    "gumbel_argmax": record("test_fused_ops"),
}
