"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, select.

Binary ops promote their operands with MAX's rules (`lowering.dtypes`) before
their rule runs, so rules see equal dtypes; shapes broadcast numpy-style.

Dtype classes (`_rules.Kind`, checked by each op's rule; the error names the
op, the type and the fix):

- *float*: transcendental math (``exp``, ``sqrt``, ``gelu``...) accepts
  floating-point inputs only; ints must be cast first.
- *numeric*: unary arithmetic (``abs``, ``negate``, ``floor``...) accepts ints
  and floats, not bool.
- *any*: binary arithmetic (``add``, ``sub``, ``mul``, ``div``) and ``outer``
  also accept bool, as MAX's graph does: bool operands compute as the integers
  0/1 and the result is cast back to bool (nonzero is True), so ``add`` is OR,
  ``sub`` XOR, ``mul`` AND and ``div`` is False only for ``False / True``.
- *bool*: ``logical_*`` accept bool only.
- comparisons accept any dtype and return bool.

Unary ops need a typed value (a graph value, eager tensor or JAX array): MAX
raises TypeError for ``ops.exp(1.0)`` and so does maxfx.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from lowering.context import bind, is_weak
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, OpError, front, register
from lowering.types import TensorType

__all__ = [
    # unary
    "abs",
    "acos",
    "atanh",
    "ceil",
    "cos",
    "erf",
    "exp",
    "floor",
    "gelu",
    "is_inf",
    "is_nan",
    "log",
    "log1p",
    "logical_not",
    "negate",
    "relu",
    "round",
    "rsqrt",
    "sigmoid",
    "silu",
    "sin",
    "sqrt",
    "tanh",
    "trunc",
    # binary
    "add",
    "sub",
    "mul",
    "div",
    "mod",
    "floor_div",
    "pow",
    "equal",
    "not_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
    # select / other
    "where",
    "outer",
    "complex_mul",
]


def _require_value(name: str, x: Any) -> None:
    # MAX: unary graph ops on non-max objects (Python numbers, numpy arrays) are a TypeError.
    if is_weak(x):
        raise TypeError(
            f"{name}: expected a tensor or graph value, got {type(x).__name__}; "
            "wrap Python/numpy data with ops.constant(value, dtype, device) first"
        )


# ─── unary ops ────────────────────────────────────────────────────────────


def _unary(
    name: str, kind: R.Kind, impl: Callable[..., Any], *, out_dtype: DType | None = None, differentiable: bool = True
) -> OpDef:
    return register(
        OpDef(name, rule=R.unary(name, kind, out_dtype=out_dtype), impl=impl, differentiable=differentiable)
    )


def _bind_unary(op: OpDef, x: Any, **params: Any):
    _require_value(op.name, x)
    return bind(op, x, **params)


def _zero_like(x):
    return jnp.zeros((), x.dtype)


def _acos_impl(x):
    # MAX clamps out-of-domain inputs to [-1, 1] instead of returning NaN.
    one = jnp.ones((), x.dtype)
    return jnp.arccos(jnp.clip(x, -one, one))


def _gelu_impl(x, *, approximate: str):
    if approximate == "none":
        return jax.nn.gelu(x, approximate=False)
    if approximate == "tanh":
        c = jnp.asarray(0.7978845608028654, x.dtype)
        k = jnp.asarray(0.044715, x.dtype)
        half = jnp.asarray(0.5, x.dtype)
        return half * x * (1 + jnp.tanh(c * (x + k * x * x * x)))
    # "quick"; the front and the rule reject anything else.
    return jax.nn.sigmoid(jnp.asarray(1.702, x.dtype) * x) * x


def _floor_impl(x):
    # Integers are already whole: floor/round/trunc are the identity on them.
    return x if not jnp.issubdtype(x.dtype, jnp.floating) else jnp.floor(x)


def _ceil_impl(x):
    return x if not jnp.issubdtype(x.dtype, jnp.floating) else jnp.ceil(x)


def _round_impl(x):
    # jnp.round is round-half-to-even, as MAX 26.7 (0.5 -> 0, 1.5 -> 2, 2.5 -> 2).
    return x if not jnp.issubdtype(x.dtype, jnp.floating) else jnp.round(x)


def _trunc_impl(x):
    return x if not jnp.issubdtype(x.dtype, jnp.floating) else jnp.trunc(x)


abs_p = _unary("abs", R.NUMERIC, jnp.abs)
acos_p = _unary("acos", R.FLOAT, _acos_impl)
atanh_p = _unary("atanh", R.FLOAT, jnp.arctanh)
ceil_p = _unary("ceil", R.NUMERIC, _ceil_impl, differentiable=False)
cos_p = _unary("cos", R.FLOAT, jnp.cos)
erf_p = _unary("erf", R.FLOAT, lax.erf)
exp_p = _unary("exp", R.FLOAT, jnp.exp)
floor_p = _unary("floor", R.NUMERIC, _floor_impl, differentiable=False)
is_inf_p = _unary("is_inf", R.NUMERIC, jnp.isinf, out_dtype=DType.bool, differentiable=False)
is_nan_p = _unary("is_nan", R.NUMERIC, jnp.isnan, out_dtype=DType.bool, differentiable=False)
log_p = _unary("log", R.FLOAT, jnp.log)
log1p_p = _unary("log1p", R.FLOAT, jnp.log1p)
logical_not_p = _unary("logical_not", R.BOOL, jnp.logical_not, differentiable=False)
negate_p = _unary("negate", R.NUMERIC, jnp.negative)
relu_p = _unary("relu", R.NUMERIC, lambda x: jnp.maximum(x, _zero_like(x)))
round_p = _unary("round", R.NUMERIC, _round_impl, differentiable=False)
rsqrt_p = _unary("rsqrt", R.FLOAT, lax.rsqrt)
sigmoid_p = _unary("sigmoid", R.FLOAT, jax.nn.sigmoid)
silu_p = _unary("silu", R.FLOAT, lambda x: x * jax.nn.sigmoid(x))
sin_p = _unary("sin", R.FLOAT, jnp.sin)


def _sqrt_impl(x):
    if jnp.issubdtype(x.dtype, jnp.floating):
        return jnp.sqrt(x)
    # Integers: the integer square root floor(sqrt(x)) in the input dtype (0 for negative inputs).
    r = jnp.floor(jnp.sqrt(jnp.maximum(x, 0).astype(jnp.float64)))
    return r.astype(x.dtype)


sqrt_p = _unary("sqrt", R.NUMERIC, _sqrt_impl)
tanh_p = _unary("tanh", R.FLOAT, jnp.tanh)
trunc_p = _unary("trunc", R.NUMERIC, _trunc_impl, differentiable=False)

_GELU_MODES = ("none", "tanh", "quick")


_gelu_type = R.unary("gelu", R.FLOAT)


def _gelu_rule(x, *, approximate: str) -> TensorType:
    if approximate not in _GELU_MODES:
        raise ValueError(f"gelu: approximate must be one of {', '.join(map(repr, _GELU_MODES))}, got {approximate!r}")
    return _gelu_type(x)


gelu_p = register(OpDef("gelu", rule=_gelu_rule, impl=_gelu_impl))


@front(abs_p)
def abs(x):  # noqa: A001 - MAX's name
    """Elementwise absolute value ``|x|`` (ints and floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.abs(Tensor([-1.5, 0.0, 2.0]))
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [1.5, 0.0, 2.0]
    """
    return _bind_unary(abs_p, x)


@front(acos_p)
def acos(x):
    """Elementwise arccosine in radians, ``[0, pi]``; inputs outside [-1, 1] are clamped to it.

    Raises:
        ValueError: if ``x`` is not floating-point.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.acos(Tensor([1.0, 0.0, 2.0, -2.0]))  # 2.0 and -2.0 are clamped
        TensorType(dtype=float32, shape=[Dim(4)], device=cpu:0): [0.0, 1.5707..., 0.0, 3.1415...]
    """
    return _bind_unary(acos_p, x)


@front(atanh_p)
def atanh(x):
    """Elementwise inverse hyperbolic tangent (floats; +-inf at +-1, NaN outside).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.atanh(Tensor([0.0, 0.5, 1.0, 2.0]))
        TensorType(dtype=float32, shape=[Dim(4)], device=cpu:0): [0.0, 0.5493..., inf, nan]
    """
    return _bind_unary(atanh_p, x)


@front(ceil_p)
def ceil(x):
    """Elementwise smallest integer value ``>= x`` (same dtype; identity on ints).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.ceil(Tensor([-1.5, 0.0, 1.2]))
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [-1.0, 0.0, 2.0]
    """
    return _bind_unary(ceil_p, x)


@front(cos_p)
def cos(x):
    """Elementwise cosine (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.cos(Tensor([0.0, 3.1415927]))
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [1.0, -1.0]
    """
    return _bind_unary(cos_p, x)


@front(erf_p)
def erf(x):
    """Elementwise Gauss error function (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.erf(Tensor([0.0, 1.0, -1.0]))
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [0.0, 0.8427..., -0.8427...]
    """
    return _bind_unary(erf_p, x)


@front(exp_p)
def exp(x):
    """Elementwise ``e ** x`` (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.exp(Tensor([0.0, 1.0]))
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [1.0, 2.7182...]
    """
    return _bind_unary(exp_p, x)


@front(floor_p)
def floor(x):
    """Elementwise largest integer value ``<= x`` (same dtype; identity on ints).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.floor(Tensor([-1.5, 0.0, 1.7]))
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [-2.0, 0.0, 1.0]
    """
    return _bind_unary(floor_p, x)


@front(gelu_p)
def gelu(x, approximate: str = "none"):
    """Elementwise Gaussian error linear unit (floats).

    Args:
        x: the input tensor.
        approximate: ``"none"`` (exact, ``0.5 * x * (1 + erf(x / sqrt(2)))``),
            ``"tanh"`` (``0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x**3)))``)
            or ``"quick"`` (``sigmoid(1.702 * x) * x``).

    Raises:
        ValueError: if ``approximate`` is not one of those, or ``x`` is not floating-point.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.gelu(Tensor([-1.0, 0.0, 1.0]), approximate="tanh")
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [-0.1588..., 0.0, 0.8411...]
    """
    if not isinstance(approximate, str) or approximate not in _GELU_MODES:
        raise ValueError(f"gelu: approximate must be one of {', '.join(map(repr, _GELU_MODES))}, got {approximate!r}")
    return _bind_unary(gelu_p, x, approximate=approximate)


@front(is_inf_p)
def is_inf(x):
    """Elementwise ``x == +inf or x == -inf``, as a bool tensor (all False for ints).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.is_inf(Tensor([1.0, float("inf"), float("-inf"), float("nan")]))
        TensorType(dtype=bool, shape=[Dim(4)], device=cpu:0): [False, True, True, False]
    """
    return _bind_unary(is_inf_p, x)


@front(is_nan_p)
def is_nan(x):
    """Elementwise ``x != x`` (NaN test), as a bool tensor (all False for ints).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.is_nan(Tensor([1.0, float("inf"), float("nan")]))
        TensorType(dtype=bool, shape=[Dim(3)], device=cpu:0): [False, False, True]
    """
    return _bind_unary(is_nan_p, x)


@front(log_p)
def log(x):
    """Elementwise natural logarithm (floats; -inf at 0, NaN below).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.log(Tensor([1.0, 0.0, -1.0]))
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [0.0, -inf, nan]
    """
    return _bind_unary(log_p, x)


@front(log1p_p)
def log1p(x):
    """Elementwise ``log(1 + x)``, accurate near 0 (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.log1p(Tensor([0.0, 1e-10, 1.0]))  # log(1 + 1e-10) would round to 0.0
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [0.0, 1e-10, 0.6931...]
    """
    return _bind_unary(log1p_p, x)


@front(logical_not_p)
def logical_not(x):
    """Elementwise boolean NOT (bool in, bool out); ``~x`` on a TensorValue.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.logical_not(Tensor([True, False]))
        TensorType(dtype=bool, shape=[Dim(2)], device=cpu:0): [False, True]
    """
    return _bind_unary(logical_not_p, x)


@front(negate_p)
def negate(x):
    """Elementwise ``-x`` (ints and floats); ``-x`` on a TensorValue.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.negate(Tensor([1.5, -2.0]))
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [-1.5, 2.0]
    """
    return _bind_unary(negate_p, x)


@front(relu_p)
def relu(x):
    """Rectified linear unit ``max(x, 0)`` (``relu(-2.0)`` is ``0.0``, not ``-0.0``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.relu(Tensor([-2.0, 0.0, 3.0]))
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [0.0, 0.0, 3.0]
    """
    return _bind_unary(relu_p, x)


@front(round_p)
def round(x):  # noqa: A001 - MAX's name
    """Elementwise rounding to the nearest integer, ties to even (``0.5 -> 0``, ``1.5 -> 2``, ``2.5 -> 2``).

    Same dtype as ``x``; the identity on ints.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.round(Tensor([0.5, 1.5, 2.5, -1.7]))
        TensorType(dtype=float32, shape=[Dim(4)], device=cpu:0): [0.0, 2.0, 2.0, -2.0]
    """
    return _bind_unary(round_p, x)


@front(rsqrt_p)
def rsqrt(x):
    """Elementwise ``1 / sqrt(x)`` (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.rsqrt(Tensor([1.0, 4.0, 0.25]))
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [1.0, 0.5, 2.0]
    """
    return _bind_unary(rsqrt_p, x)


@front(sigmoid_p)
def sigmoid(x):
    """Elementwise logistic sigmoid ``1 / (1 + exp(-x))`` (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.sigmoid(Tensor([0.0, 2.0]))
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [0.5, 0.8807...]
    """
    return _bind_unary(sigmoid_p, x)


@front(silu_p)
def silu(x):
    """Elementwise ``x * sigmoid(x)`` (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.silu(Tensor([0.0, 2.0]))
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [0.0, 1.7615...]
    """
    return _bind_unary(silu_p, x)


@front(sin_p)
def sin(x):
    """Elementwise sine (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.sin(Tensor([0.0, 1.5707964]))
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [0.0, 1.0]
    """
    return _bind_unary(sin_p, x)


@front(sqrt_p)
def sqrt(x):
    """Elementwise square root (NaN below 0); on integers the integer square root ``floor(sqrt(x))`` (0 below 0).

    The dtype is kept, as MAX's graph does (its ``TensorValue.stdev`` of an
    integer tensor is an integer tensor).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.sqrt(Tensor([4.0, 2.0, -1.0]))
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [2.0, 1.4142..., nan]
        >>> from maxfx.dtype import DType
        >>> ops.sqrt(Tensor([0, 8, 9, 10], dtype=DType.int32))
        TensorType(dtype=int32, shape=[Dim(4)], device=cpu:0): [0, 2, 3, 3]
    """
    return _bind_unary(sqrt_p, x)


@front(tanh_p)
def tanh(x):
    """Elementwise hyperbolic tangent (floats).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.tanh(Tensor([0.0, 1.0]))
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [0.0, 0.7615...]
    """
    return _bind_unary(tanh_p, x)


@front(trunc_p)
def trunc(x):
    """Elementwise rounding toward zero (same dtype; the identity on ints).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.trunc(Tensor([-1.7, 1.7]))
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [-1.0, 1.0]
    """
    return _bind_unary(trunc_p, x)


# ─── binary ops ───────────────────────────────────────────────────────────


def _binary(name: str, kind: R.Kind, impl: Callable[..., Any], *, out_dtype=None, differentiable: bool = True) -> OpDef:
    return register(
        OpDef(
            name,
            rule=R.binary(name, kind, out_dtype=out_dtype),
            impl=impl,
            promote=(0, 1),
            differentiable=differentiable,
        )
    )


def _div_out_dtype(d: DType) -> DType:
    # True division: ints become float64 (MAX 26.7: int32 / int32 -> float64); bool stays bool.
    return DType.float64 if d.is_integral() else d


def _bool_as_int(impl: Callable[..., Any], work=jnp.int32) -> Callable[..., Any]:
    """``impl`` on bool operands computed as 0/1 integers of ``work``, cast back to bool (nonzero is True)."""

    def run(*xs):
        if xs[0].dtype == jnp.bool_:
            return impl(*(x.astype(work) for x in xs)) != 0
        return impl(*xs)

    return run


def _div_impl(lhs, rhs):
    if lhs.dtype == jnp.bool_:
        # 0/1 as floats: only False / True is 0 (x / False is inf or nan, both nonzero).
        return lax.div(lhs.astype(jnp.float32), rhs.astype(jnp.float32)) != 0
    if not jnp.issubdtype(lhs.dtype, jnp.floating):
        lhs, rhs = lhs.astype(jnp.float64), rhs.astype(jnp.float64)
    return lax.div(lhs, rhs)


def _pow_impl(lhs, rhs):
    # Integer powers stay integers; a negative integer exponent has no integer
    # result and gives 0 for |base| > 1 (XLA's integer pow), not a float.
    return jnp.power(lhs, rhs)


add_p = _binary("add", R.ANY, _bool_as_int(jnp.add))
sub_p = _binary("sub", R.ANY, _bool_as_int(jnp.subtract))
mul_p = _binary("mul", R.ANY, _bool_as_int(jnp.multiply))
div_p = _binary("div", R.ANY, _div_impl, out_dtype=_div_out_dtype)
# jnp.remainder / floor_divide follow Python: the remainder takes the divisor's sign.
mod_p = _binary("mod", R.NUMERIC, jnp.remainder)
floor_div_p = _binary("floor_div", R.NUMERIC, jnp.floor_divide, differentiable=False)
pow_p = _binary("pow", R.NUMERIC, _pow_impl)
equal_p = _binary("equal", R.ANY, jnp.equal, out_dtype=DType.bool, differentiable=False)
not_equal_p = _binary("not_equal", R.ANY, jnp.not_equal, out_dtype=DType.bool, differentiable=False)
greater_p = _binary("greater", R.ANY, jnp.greater, out_dtype=DType.bool, differentiable=False)
greater_equal_p = _binary("greater_equal", R.ANY, jnp.greater_equal, out_dtype=DType.bool, differentiable=False)
logical_and_p = _binary("logical_and", R.BOOL, jnp.logical_and, differentiable=False)
logical_or_p = _binary("logical_or", R.BOOL, jnp.logical_or, differentiable=False)
logical_xor_p = _binary("logical_xor", R.BOOL, jnp.logical_xor, differentiable=False)


@front(add_p)
def add(lhs, rhs):
    """Elementwise ``lhs + rhs`` with numpy broadcasting and MAX dtype promotion.

    Raises:
        ValueError: shapes that do not broadcast, or dtypes MAX does not promote
            (``int32 + float32``, ``int32 + 1.5``).
        TypeError: if neither operand is a tensor or graph value.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> ops.add(x, Tensor([10.0, 20.0]))  # broadcasts [2] against [2, 2]
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [11.0, 22.0, 13.0, 24.0]
        >>> ops.add(x, 1.0)  # a Python scalar takes x's dtype
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [2.0, 3.0, 4.0, 5.0]
    """
    return bind(add_p, lhs, rhs)


@front(sub_p)
def sub(lhs, rhs):
    """Elementwise ``lhs - rhs`` (broadcasting and promotion as `add`).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.sub(2, Tensor([1.0, 5.0]))  # same as 2 - x
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [1.0, -3.0]
    """
    return bind(sub_p, lhs, rhs)


@front(mul_p)
def mul(lhs, rhs):
    """Elementwise ``lhs * rhs`` (broadcasting and promotion as `add`).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.mul(Tensor([1.5, -2.0]), 2.0)
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [3.0, -4.0]
    """
    return bind(mul_p, lhs, rhs)


@front(div_p)
def div(lhs, rhs):
    """Elementwise true division ``lhs / rhs``.

    Float operands keep their (promoted) dtype; integer operands are divided as
    floats and give float64, like Python's ``/`` (and MAX 26.7).

    Raises:
        ValueError: shapes that do not broadcast, or dtypes MAX does not promote.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> ops.div(Tensor([1, 7], dtype=DType.int32), 2)  # int32 / int -> float64
        TensorType(dtype=float64, shape=[Dim(2)], device=cpu:0): [0.5, 3.5]
    """
    return bind(div_p, lhs, rhs)


@front(mod_p)
def mod(lhs, rhs):
    """Elementwise remainder with Python (floor) semantics: the result has the sign of ``rhs``.

    ``-3 % 2 == 1`` and ``3 % -2 == -1``, for ints and floats; ``lhs == (lhs // rhs) * rhs + lhs % rhs``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> ops.mod(Tensor([-3, 3, 4], dtype=DType.int32), 2)
        TensorType(dtype=int32, shape=[Dim(3)], device=cpu:0): [1, 1, 0]
        >>> ops.mod(Tensor([3.0]), -2.0)
        TensorType(dtype=float32, shape=[Dim(1)], device=cpu:0): [-1.0]
    """
    return bind(mod_p, lhs, rhs)


@front(floor_div_p)
def floor_div(lhs, rhs):
    """Elementwise floor division ``lhs // rhs`` (rounds toward -inf; ints stay ints).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> ops.floor_div(Tensor([-7, 7], dtype=DType.int32), 2)
        TensorType(dtype=int32, shape=[Dim(2)], device=cpu:0): [-4, 3]
    """
    return bind(floor_div_p, lhs, rhs)


@front(pow_p)
def pow(lhs, rhs):  # noqa: A001 - MAX's name
    """Elementwise ``lhs ** rhs`` (promoted dtype; integer powers stay integers).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> ops.pow(Tensor([1.5, -2.0]), 2)
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [2.25, 4.0]
        >>> ops.pow(Tensor([2, 3], dtype=DType.int32), 3)  # ints stay ints
        TensorType(dtype=int32, shape=[Dim(2)], device=cpu:0): [8, 27]
    """
    return bind(pow_p, lhs, rhs)


@front(equal_p)
def equal(lhs, rhs):
    """Elementwise ``lhs == rhs`` as a bool tensor.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.equal(Tensor([0.0, 1.0, 0.0]), 0)
        TensorType(dtype=bool, shape=[Dim(3)], device=cpu:0): [True, False, True]
    """
    return bind(equal_p, lhs, rhs)


@front(not_equal_p)
def not_equal(lhs, rhs):
    """Elementwise ``lhs != rhs`` as a bool tensor.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.not_equal(Tensor([0.0, 1.0, 0.0]), 0)
        TensorType(dtype=bool, shape=[Dim(3)], device=cpu:0): [False, True, False]
    """
    return bind(not_equal_p, lhs, rhs)


@front(greater_p)
def greater(lhs, rhs):
    """Elementwise ``lhs > rhs`` as a bool tensor (``lhs < rhs`` is ``greater(rhs, lhs)``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.greater(Tensor([0.0, 0.5, 1.0]), 0.5)
        TensorType(dtype=bool, shape=[Dim(3)], device=cpu:0): [False, False, True]
    """
    return bind(greater_p, lhs, rhs)


@front(greater_equal_p)
def greater_equal(lhs, rhs):
    """Elementwise ``lhs >= rhs`` as a bool tensor (``lhs <= rhs`` is ``greater_equal(rhs, lhs)``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.greater_equal(Tensor([-1.0, 0.0, 1.0]), 0)
        TensorType(dtype=bool, shape=[Dim(3)], device=cpu:0): [False, True, True]
    """
    return bind(greater_equal_p, lhs, rhs)


@front(logical_and_p)
def logical_and(lhs, rhs):
    """Elementwise boolean AND of bool tensors (``a & b``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = Tensor([True, True, False, False])
        >>> b = Tensor([True, False, True, False])
        >>> ops.logical_and(a, b)
        TensorType(dtype=bool, shape=[Dim(4)], device=cpu:0): [True, False, False, False]
    """
    return bind(logical_and_p, lhs, rhs)


@front(logical_or_p)
def logical_or(lhs, rhs):
    """Elementwise boolean OR of bool tensors (``a | b``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = Tensor([True, True, False, False])
        >>> b = Tensor([True, False, True, False])
        >>> ops.logical_or(a, b)
        TensorType(dtype=bool, shape=[Dim(4)], device=cpu:0): [True, True, True, False]
    """
    return bind(logical_or_p, lhs, rhs)


@front(logical_xor_p)
def logical_xor(lhs, rhs):
    """Elementwise boolean XOR of bool tensors (``a ^ b``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = Tensor([True, True, False, False])
        >>> b = Tensor([True, False, True, False])
        >>> ops.logical_xor(a, b)
        TensorType(dtype=bool, shape=[Dim(4)], device=cpu:0): [False, True, True, False]
    """
    return bind(logical_xor_p, lhs, rhs)


# ─── select / outer ───────────────────────────────────────────────────────


def _check_where_devices(c, x, y) -> None:
    """MAX's message, listing the three types, when typed inputs sit on different devices."""
    types = [t for t in (c, x, y) if isinstance(t, TensorType)]
    if len({t.device for t in types}) > 1:
        names = [
            f"    {n}: {t!r}" if isinstance(t, TensorType) else f"    {n}: {type(t).__name__}"
            for n, t in zip(("condition", "x", "y"), (c, x, y))
        ]
        raise OpError("where: Input values must be on the same device\n" + "\n".join(names))


def _where_rule(condition, x, y) -> TensorType:
    c = R.require_tensor("where", condition, "condition")
    tx = R.require_tensor("where", x, "x")
    ty = R.require_tensor("where", y, "y")
    if c.dtype is not DType.bool:
        # MAX's wording.
        raise OpError(
            f"where: Expected condition to be a boolean tensor, but got a tensor with dtype DType.{c.dtype.name} "
            f"(condition: {R.fmt(c)})"
        )
    if tx.dtype is not ty.dtype:
        raise OpError(f"where: x and y must have the same dtype, got {R.fmt_all([tx, ty])}")
    _check_where_devices(c, tx, ty)
    try:
        shape = R.broadcast_shapes("where", c.shape, tx.shape, ty.shape)
    except OpError as e:
        raise OpError(f"{e} (condition, x and y are neither equivalent nor broadcastable)") from None
    return TensorType(tx.dtype, shape, c.device)


where_p = register(OpDef("where", rule=_where_rule, impl=jnp.where, promote=(1, 2)))


@front(where_p)
def where(condition, x, y):
    """Elementwise ``condition ? x : y``, broadcasting all three.

    Args:
        condition: a bool tensor.
        x: values where ``condition`` is true.
        y: values where ``condition`` is false; ``x`` and ``y`` are promoted
            together (either may be a Python scalar, not both).

    Raises:
        ValueError: if ``condition`` is not bool, or the shapes do not broadcast.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([-1.0, 2.0, -3.0, 4.0])
        >>> ops.where(x > 0, x, 0.0)
        TensorType(dtype=float32, shape=[Dim(4)], device=cpu:0): [0.0, 2.0, 0.0, 4.0]
    """
    # Checked before binding, so that MAX's message (not the generic one) reports a device mismatch.
    _check_where_devices(*(getattr(v, "type", v) for v in (condition, x, y)))
    return bind(where_p, condition, x, y)


def _outer_rule(lhs, rhs) -> TensorType:
    ts = [R.require_tensor("outer", lhs, "lhs"), R.require_tensor("outer", rhs, "rhs")]
    for t, name in zip(ts, ("lhs", "rhs")):
        if t.rank != 1:
            raise OpError(f"outer: {name} must be a rank-1 vector, got {R.fmt(t)}; flatten it first (x.reshape([-1]))")
    if ts[0].dtype is not ts[1].dtype:
        raise OpError(f"outer: inputs must have the same dtype, got {R.fmt_all(ts)}")
    device = R.input_device(*ts)
    return TensorType(ts[0].dtype, [ts[0].shape[0], ts[1].shape[0]], device)


outer_p = register(OpDef("outer", rule=_outer_rule, impl=_bool_as_int(jnp.outer), promote=(0, 1)))


@front(outer_p)
def outer(lhs, rhs):
    """Outer product of two vectors: ``out[i, j] = lhs[i] * rhs[j]``, shape ``[len(lhs), len(rhs)]``.

    Raises:
        ValueError: if an input is not rank 1 (MAX's graph requires vectors;
            flatten with ``x.reshape([-1])`` first), or the inputs are on
            different devices.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = Tensor([1.0, 2.0, 3.0])
        >>> b = Tensor([1.0, 2.0, 3.0, 4.0])
        >>> ops.outer(a, b)  # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(3), Dim(4)], device=cpu:0):
        [1.0, 2.0, 3.0, 4.0, 2.0, 4.0, 6.0, 8.0, 3.0, 6.0, 9.0, 12.0]
    """
    return bind(outer_p, lhs, rhs)


# ─── complex numbers as interleaved pairs ─────────────────────────────────


def _complex_mul_rule(lhs, rhs) -> TensorType:
    op = "complex.mul"
    ts = [R.require_tensor(op, lhs, "lhs"), R.require_tensor(op, rhs, "rhs")]
    for t, name in zip(ts, ("lhs", "rhs")):
        if t.rank == 0 or t.shape[-1] != 2:
            raise OpError(f"{op}: {name} must be complex: a last dim of 2 (interleaved real, imag), got {R.fmt(t)}")
    if ts[0].dtype is not ts[1].dtype:
        raise OpError(f"{op}: inputs must have the same dtype, got {R.fmt_all(ts)}")
    device = R.input_device(*ts)
    return TensorType(ts[0].dtype, R.broadcast_shapes(op, ts[0].shape, ts[1].shape), device)


def _complex_mul_impl(lhs, rhs):
    a, b = lhs[..., 0], lhs[..., 1]
    c, d = rhs[..., 0], rhs[..., 1]
    return jnp.stack([a * c - b * d, a * d + b * c], axis=-1)


complex_mul_p = register(
    OpDef("complex_mul", rule=_complex_mul_rule, impl=_bool_as_int(_complex_mul_impl), promote=(0, 1))
)


def complex_mul(lhs, rhs):
    """Complex product of tensors holding complex numbers as interleaved ``[..., 2]`` (real, imag) pairs.

    ``(a + bi)(c + di) = (ac - bd) + (ad + bc)i``; the leading dims broadcast.
    MAX's ``ops.complex.mul``.

    Raises:
        ValueError: an input whose last dim is not 2, or shapes that do not broadcast.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.complex.mul(Tensor([1.0, 2.0]), Tensor([3.0, -1.0]))  # (1+2i)(3-i) = 5+5i
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [5.0, 5.0]
    """
    return bind(complex_mul_p, lhs, rhs)
