"""Numerical gradient check of every differentiable registry op.

Each row applies the op's front to Tensors wrapping the (float64 where the op
allows) inputs and runs ``jax.test_util.check_grads`` (order 1, reverse mode):
JAX's VJP through the maxfx op is compared with finite differences. Integer,
bool and structural arguments are fixed inside the row. Every op registered
with ``differentiable=True`` needs a row here or an entry in ``EXCLUDED`` with
the reason (`test_every_differentiable_op_is_checked`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import pytest
from jax.test_util import check_grads

import lowering.ops  # noqa: F401  (registers every op)
import maxfx
from lowering.context import bind
from lowering.registry import all_ops, get_op
from maxfx import functional as F
from maxfx.dtype import DType
from maxfx.experimental.tensor import Tensor
from maxfx.graph import DeviceRef

RNG = np.random.default_rng(0)


@dataclass
class Row:
    """``fn(front, *tensors)`` applied to ``args`` (float arrays, the differentiated inputs)."""

    fn: Callable[..., Any]
    args: Sequence[np.ndarray]
    dtype: Any = np.float64
    tol: float | None = None  # check_grads atol = rtol (default: JAX's per-dtype tolerance)
    eps: float | None = None
    kwargs: dict = field(default_factory=dict)
    jit: bool = True  # check under jax.jit (one compiled program per row); False: op by op


def u(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, size=shape)


def away(*shape: int, margin: float = 0.3) -> np.ndarray:
    """Values with |x| >= margin (kinks at 0 stay out of finite differences' reach)."""
    x = u(*shape)
    return np.where(np.abs(x) < margin, np.sign(x + 1e-9) * (margin + np.abs(x)), x)


def distinct(*shape: int) -> np.ndarray:
    """A shuffled grid: no ties (max, pools and top_k are differentiable away from ties)."""
    n = int(np.prod(shape))
    return RNG.permutation(np.linspace(-2, 2, n)).reshape(shape)


def const(a: Any, dtype: DType) -> Tensor:
    return Tensor.constant(np.asarray(a), dtype=dtype)


def i64(a: Any) -> Tensor:
    return const(a, DType.int64)


def u32(a: Any) -> Tensor:
    return const(a, DType.uint32)


def _q4_0_weight(n: int, k: int) -> np.ndarray:
    """A GGUF Q4_0 matrix [n, k/32 * 18]: a float16 scale then 16 bytes of nibbles per block."""
    blocks = RNG.integers(0, 256, size=(n, k // 32, 18), dtype=np.uint8)
    blocks[..., :2] = np.frombuffer(np.float16(0.05).tobytes(), np.uint8)
    return blocks.reshape(n, -1)


_MOD_X = np.array([[2.3, -3.1, 5.2], [0.7, -1.3, 4.4]])
_MOD_Y = np.array([[1.5, 1.7, -1.9], [-1.6, 1.4, 1.8]])  # x / y stays away from integers

# ─── the table: op name → row ─────────────────────────────────────────────

ROWS: dict[str, Row] = {
    # The front skips same-device copies; bind the op itself for a CPU→CPU transfer.
    "transfer_to": Row(lambda f, x: bind(get_op("transfer_to"), x, device=DeviceRef.CPU()), [u(3)]),
    "cast": Row(lambda f, x: x.cast(DType.float64), [u(3)], dtype=np.float32, tol=1e-2),
    # unary
    "abs": Row(lambda f, x: f(x), [away(3, 4)]),
    "acos": Row(lambda f, x: f(x), [u(5, lo=-0.8, hi=0.8)]),
    "atanh": Row(lambda f, x: f(x), [u(5, lo=-0.8, hi=0.8)]),
    "cos": Row(lambda f, x: f(x), [u(5)]),
    "erf": Row(lambda f, x: f(x), [u(5)]),
    "exp": Row(lambda f, x: f(x), [u(5)]),
    "log": Row(lambda f, x: f(x), [u(5, lo=0.5, hi=3)]),
    "log1p": Row(lambda f, x: f(x), [u(5, lo=-0.5, hi=3)]),
    "negate": Row(lambda f, x: f(x), [u(5)]),
    "relu": Row(lambda f, x: f(x), [away(3, 4)]),
    "rsqrt": Row(lambda f, x: f(x), [u(5, lo=0.5, hi=3)]),
    "sigmoid": Row(lambda f, x: f(x), [u(5)]),
    "silu": Row(lambda f, x: f(x), [u(5)]),
    "sin": Row(lambda f, x: f(x), [u(5)]),
    "sqrt": Row(lambda f, x: f(x), [u(5, lo=0.5, hi=3)]),
    "tanh": Row(lambda f, x: f(x), [u(5)]),
    "gelu": Row(lambda f, x: (f(x), f(x, approximate="tanh")), [u(5)]),
    # binary
    "add": Row(lambda f, a, b: f(a, b), [u(2, 3), u(3)]),
    "sub": Row(lambda f, a, b: f(a, b), [u(2, 3), u(2, 1)]),
    "mul": Row(lambda f, a, b: f(a, b), [u(2, 3), u(2, 3)]),
    "div": Row(lambda f, a, b: f(a, b), [u(2, 3), away(2, 3, margin=0.5)]),
    "mod": Row(lambda f, a, b: f(a, b), [_MOD_X, _MOD_Y]),
    "pow": Row(lambda f, a, b: f(a, b), [u(2, 3, lo=0.5, hi=2), u(2, 3)]),
    "where": Row(lambda f, a, b: f(const([[True, False, True], [False, True, False]], DType.bool), a, b), [u(2, 3), u(2, 3)]),
    "outer": Row(lambda f, a, b: f(a, b), [u(3), u(4)]),
    "maximum": Row(lambda f, a, b: f(a, b), [distinct(2, 3), distinct(2, 3) + 0.05]),
    "minimum": Row(lambda f, a, b: f(a, b), [distinct(2, 3), distinct(2, 3) + 0.05]),
    # indexing
    "slice_tensor": Row(lambda f, x: f(x, [slice(1, 3), 2]), [u(4, 3)]),
    "gather": Row(lambda f, x: f(x, i64([2, 0, 2]), 0), [u(3, 2)]),
    "gather_nd": Row(lambda f, x: f(x, i64([[0, 1], [2, 0]])), [u(3, 2, 2)]),
    "scatter": Row(lambda f, x, up: f(x, up, i64([[1, 0], [2, 1]]), axis=1), [u(2, 3), u(2, 2)]),
    "scatter_nd": Row(lambda f, x, up: f(x, up, i64([[2], [0]])), [u(3, 2), u(2, 2)]),
    "masked_scatter": Row(lambda f, x, up: f(x, const([[True, False], [False, True]], DType.bool), up, out_dim=2), [u(2, 2), u(3)]),
    # linalg / nn
    "matmul": Row(lambda f, a, b: f(a, b), [u(2, 3), u(3, 4)]),
    "conv2d": Row(lambda f, x, w, b: f(x, w, bias=b, padding=(1, 0, 0, 1)), [u(1, 4, 4, 2), u(3, 2, 2, 3), u(3)]),
    "conv3d": Row(lambda f, x, w: f(x, w), [u(1, 3, 3, 3, 2), u(2, 2, 2, 2, 2)]),
    "conv2d_transpose": Row(lambda f, x, w: f(x, w, stride=(2, 2)), [u(1, 2, 3, 2), u(2, 2, 3, 2)]),
    # Pools are checked op by op: under jax.jit their reverse mode fails (`test_pools_differentiate_under_jit`).
    "max_pool2d": Row(lambda f, x: f(x, (2, 2), stride=1), [distinct(1, 3, 3, 2)], jit=False),
    "avg_pool2d": Row(lambda f, x: f(x, (2, 2), stride=1), [u(1, 3, 3, 2)], jit=False),
    "fold": Row(lambda f, x: f(x, (3, 3), (2, 2)), [u(1, 4, 4)]),
    "resize": Row(lambda f, x: f(x, [1, 1, 5, 4]), [u(1, 1, 3, 3)]),
    "irfft": Row(lambda f, x: f(x, n=6), [u(2, 4)]),
    # Q4_0 weights are fixed bytes; the gradient flows to the float lhs (accumulated in float32).
    "qmatmul": Row(lambda f, x: f("Q4_0", None, x, Tensor.constant(_Q4_0)), [u(2, 32)], dtype=np.float32, tol=5e-2),
    # reductions
    "sum": Row(lambda f, x: f(x, axis=0), [u(3, 2)]),
    "mean": Row(lambda f, x: f(x, axis=-1), [u(3, 2)]),
    "reduce_max": Row(lambda f, x: f(x, axis=-1), [distinct(3, 4)]),
    "reduce_min": Row(lambda f, x: f(x, axis=0), [distinct(3, 4)]),
    "cumsum": Row(lambda f, x: (f(x, axis=-1), f(x, axis=0, exclusive=True, reverse=True)), [u(3, 4)]),
    "softmax": Row(lambda f, x: f(x), [u(2, 4)]),
    "logsoftmax": Row(lambda f, x: f(x, axis=0), [u(2, 4)]),
    "top_k": Row(lambda f, x: f(x, 2)[0], [distinct(2, 5)]),
    "layer_norm": Row(lambda f, x, g, b: f(x, g, b, 1e-5), [u(3, 4), u(4), u(4)]),
    # shape
    "reshape": Row(lambda f, x: f(x, [3, 2]), [u(2, 3)]),
    "flatten": Row(lambda f, x: f(x, 1), [u(2, 3, 2)]),
    "squeeze": Row(lambda f, x: f(x, 1), [u(2, 1, 3)]),
    "unsqueeze": Row(lambda f, x: f(x, 0), [u(2, 3)]),
    "transpose": Row(lambda f, x: f(x, 0, 2), [u(2, 3, 2)]),
    "permute": Row(lambda f, x: f(x, [2, 0, 1]), [u(2, 3, 2)]),
    "broadcast_to": Row(lambda f, x: f(x, [2, 3, 4]), [u(3, 1)]),
    "rebind": Row(lambda f, x: f(x, [2, 3]), [u(2, 3)]),
    "concat": Row(lambda f, a, b: f([a, b], axis=1), [u(2, 3), u(2, 1)]),
    "stack": Row(lambda f, a, b: f([a, b], axis=0), [u(2, 3), u(2, 3)]),
    "split": Row(lambda f, x: tuple(f(x, [1, 2], axis=1)), [u(2, 3)]),
    "chunk": Row(lambda f, x: tuple(f(x, 2, axis=0)), [u(4, 3)]),
    "tile": Row(lambda f, x: f(x, [2, 1]), [u(2, 3)]),
    "repeat_interleave": Row(lambda f, x: f(x, 2, axis=1), [u(2, 3)]),
    "pad": Row(lambda f, x: f(x, [1, 0, 0, 2]), [u(2, 3)]),
    "band_part": Row(lambda f, x: f(x, num_lower=0, num_upper=1), [u(3, 3)]),
    "as_interleaved_complex": Row(lambda f, x: f(x), [u(2, 4)]),
    # attention family
    # (these accumulate in float32 whatever the input dtype: checked in float32, loose tolerances)
    "attention": Row(lambda f, q, k, v: f(q, k, v, scale=0.5), [u(1, 3, 2, 4), u(1, 3, 1, 4), u(1, 3, 1, 2)], dtype=np.float32, tol=2e-2),
    "ragged_attention": Row(lambda f, q, k, v: f(q, k, v, u32([0, 2, 5]), scale=0.7), [u(5, 2, 4), u(5, 1, 4), u(5, 1, 3)], dtype=np.float32, tol=2e-2),
    "paged_attention": Row(
        # blocks [pages, 2 (k, v), layers, page_size, kv_heads, head_dim]; sequence 0 has 2 cached + 1 new token.
        lambda f, q, blocks: f(q, blocks, u32([[1, 0]]), u32(0), u32([0, 1]), u32([2]), scale=0.5),
        [u(1, 2, 4), u(2, 2, 1, 2, 1, 4)],
        dtype=np.float32,
        tol=2e-2,
    ),
    "rope_ragged": Row(lambda f, x, freqs: f(x, freqs, u32([0, 2, 3]), u32([1, 0])), [u(3, 2, 4), u(4, 4)], dtype=np.float32, tol=2e-2),
}

_Q4_0 = _q4_0_weight(3, 32)

# Differentiable ops not checked here, and why.
EXCLUDED: dict[str, str] = {
    "cond": "graph-only: runs nested Graph blocks (no eager/traced impl); inside JAX transforms use jax.lax.cond",
    "call": "graph-only: calls a subgraph (no eager/traced impl); inside JAX transforms call the Python function",
    "allgather": "a collective over several devices with signal buffers; needs a multi-device setup (see the multi-device tests)",
}


def differentiable_ops() -> list[str]:
    return sorted(name for name, op in all_ops().items() if op.differentiable)


def test_every_differentiable_op_is_checked():
    ops = set(differentiable_ops())
    missing = sorted(ops - set(ROWS) - set(EXCLUDED))
    assert not missing, f"differentiable registry ops without a grad-check row (add one to ROWS or a reason to EXCLUDED): {missing}"
    stale = sorted((set(ROWS) | set(EXCLUDED)) - ops)
    assert not stale, f"rows for ops that are not (or no longer) differentiable registry ops: {stale}"
    assert not set(ROWS) & set(EXCLUDED)


def _raw_outputs(out: Any) -> Any:
    """Float outputs as JAX arrays (integer outputs such as indices carry no gradient)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    arrays = tuple(o._array() if isinstance(o, Tensor) else o for o in outs)
    return tuple(a for a in arrays if np.issubdtype(a.dtype, np.inexact))


@pytest.mark.parametrize("name", sorted(ROWS))
def test_grad_check(name):
    row = ROWS[name]
    front = get_op(name).front
    with jax.enable_x64(True):
        args = [jax.numpy.asarray(np.asarray(a, row.dtype)) for a in row.args]

        def f(*arrays):
            return _raw_outputs(row.fn(front, *[Tensor.from_dlpack(a) for a in arrays], **row.kwargs))

        assert f(*args), f"{name}: the row produced no float output"
        kw = {} if row.tol is None else {"atol": row.tol, "rtol": row.tol}
        if row.eps is not None:
            kw["eps"] = row.eps
        # One jitted program per row instead of op-by-op dispatch of many small float64 primitives.
        check_grads(jax.jit(f) if row.jit else f, args, order=1, modes=["rev"], **kw)


@pytest.mark.parametrize("name", ["max_pool2d", "avg_pool2d"])
def test_pools_differentiate_under_jit(name):
    front = get_op(name).front
    x = Tensor.constant(distinct(1, 3, 3, 2).astype(np.float32))
    g = maxfx.jit(maxfx.grad(lambda t: F.sum(F.reshape(front(t, (2, 2), stride=1), [-1]), axis=0).squeeze(0)))(x)
    assert list(g.shape) == [1, 3, 3, 2]


def test_maxfx_grad_agrees_with_finite_differences_through_tensors():
    """The same check through maxfx.grad itself (not jax.vjp): d/dx sum(softmax(x) * w)."""
    x, w = u(2, 4), u(2, 4)
    front = get_op("softmax").front

    def loss(t: Tensor) -> Tensor:
        s = front(t) * Tensor.constant(w)
        return s.sum(axis=1).sum(axis=0).squeeze(0).squeeze(0)

    g = maxfx.grad(loss)(Tensor.constant(x, dtype=DType.float64)).to_numpy()
    eps = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        num[idx] = (loss(Tensor.constant(x + d, dtype=DType.float64)).item() - loss(Tensor.constant(x - d, dtype=DType.float64)).item()) / (2 * eps)
    np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)
