"""Linear algebra: ``matmul``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from custom_calls.qmatmul.dispatch import float_matmul_nt
from lowering.context import bind
from lowering.dims import Dim
from lowering.ops import _rules as R
from lowering.registry import OpDef, front, register
from lowering.types import TensorType

__all__ = ["matmul"]


def _matmul_rule(lhs, rhs) -> TensorType:
    lhs = R.require_tensor("matmul", lhs, "lhs")
    rhs = R.require_tensor("matmul", rhs, "rhs")
    if lhs.rank == 0 or rhs.rank == 0:
        raise R.OpError(f"matmul: inputs must have rank >= 1, got {R.fmt(lhs)} @ {R.fmt(rhs)}")
    device = R.input_device(lhs, rhs)
    ls, rs = list(lhs.shape), list(rhs.shape)
    lhs_vec, rhs_vec = len(ls) == 1, len(rs) == 1
    if lhs_vec:
        ls = [Dim(1)] + ls
    if rhs_vec:
        rs = rs + [Dim(1)]
    if ls[-1] != rs[-2]:
        raise R.OpError(
            f"matmul: contracting dims differ: lhs {R.fmt(lhs)} has {ls[-1]} columns but rhs {R.fmt(rhs)} has {rs[-2]} "
            "rows"
        )
    batch = R.broadcast_shapes("matmul", ls[:-2], rs[:-2])
    out = list(batch) + ([] if lhs_vec else [ls[-2]]) + ([] if rhs_vec else [rs[-1]])
    return TensorType(lhs.dtype, out, device)


def _transposed_from(rhs):
    """The matrix ``rhs`` was transposed from in the program being traced, or None.

    XLA's CPU backend does not fold a transpose into the dot that consumes it:
    ``x @ w.T`` copies ``w`` transposed on every call, while a dot contracting
    ``w``'s last axis reads it in place (one row times 5632x512 float32, JAX
    0.11.2: 3.0 ms vs 0.47-0.61 ms). ``x @ w.T`` is how MAX's ``Linear`` and
    model code are written, so the product reads the equation that made its rhs
    in the jaxpr being built (``DynamicJaxprTracer.parent``, JAX's only handle
    on it; pyproject pins JAX, and the HLO test in tests/ops/test_linalg.py
    guards it) and multiplies by ``w``; the transpose is then dead code. Graphs,
    eager programs and user ``jax.jit`` all trace through here; concrete arrays
    (op by op) have no producer, and their transpose has already run.
    """
    eqn = getattr(rhs, "parent", None) if isinstance(rhs, jax.core.Tracer) else None
    if eqn is None or eqn.primitive is not jax.lax.transpose_p or tuple(eqn.params["permutation"]) != (1, 0):
        return None
    return eqn.in_tracers[0]


def _matmul_impl(lhs, rhs):
    if lhs.dtype == jnp.bool_:  # numpy's boolean product: any(lhs[i, k] and rhs[k, j]), counted in int32
        return _matmul_impl(lhs.astype(jnp.int32), rhs.astype(jnp.int32)) > 0
    # Half-precision inputs accumulate in float32, like MAX's kernels.
    half = lhs.dtype in (jnp.float16, jnp.bfloat16)
    options = {"preferred_element_type": jnp.float32} if half else {"precision": jax.lax.Precision.HIGHEST}
    source = _transposed_from(rhs)
    if source is not None:  # lhs [..., k] times source [n, k] contracted on k: XLA reads source in place
        kernel = float_matmul_nt(lhs, source)  # a decode step's float32 projection on a CPU: the C++ kernel
        if kernel is not None:
            return kernel
        out = jax.lax.dot_general(lhs, source, (((lhs.ndim - 1,), (1,)), ((), ())), **options)
    else:
        out = jnp.matmul(lhs, rhs, **options)
    return out.astype(lhs.dtype) if half else out


matmul_p = register(OpDef("matmul", rule=_matmul_rule, impl=_matmul_impl, promote=(0, 1)))


@front(matmul_p)
def matmul(lhs, rhs):
    """Matrix product with numpy semantics: batch dims broadcast, 1-D operands
    become a row (lhs) or column (rhs) vector whose added dim is removed; for
    bool operands an entry is true when any ``lhs[i, k] and rhs[k, j]`` is.

    Raises:
        ValueError: when the contracting dims differ (names both shapes).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])  # [batch=2, k=2]
        >>> w = Tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])  # [k=2, n=3]
        >>> ops.matmul(x, w)
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0): [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]
        >>> ops.matmul(Tensor([1.0, 1.0]), w)  # a 1-D lhs is a row vector
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [1.0, 1.0, 2.0]
    """
    return bind(matmul_p, lhs, rhs)
