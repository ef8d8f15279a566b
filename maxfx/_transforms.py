"""Functional transformations over Tensors and Modules: `jit`, `grad`, `value_and_grad`, `vmap`, `checkpoint`, `scan`.

Each is the JAX transformation of the same name, made for functions of maxfx
`Tensor`\\ s, `Module`\\ s and pytrees of them (both are pytrees: a Tensor is one
array leaf, a Module's leaves are its parameters). They compose with raw
``jax.*`` transforms and ``jax.lax`` control flow in either order.

Two rules make them feel like the eager API:

- **64-bit types**: called outside any JAX trace, a transform traces and runs
  with ``jax_enable_x64`` on (scoped, like the eager path), so int64/float64
  Tensors and ops with 64-bit results (``argmax``, token ids) keep their MAX
  dtypes. Called on tracers (inside ``jax.jit``), the enclosing trace decides.
- **Outputs become Tensors**: when any input leaf is a Tensor, a raw JAX array
  returned by the function, or as a direct item of a returned tuple, list or
  dict, comes back as a Tensor. Tensors and Modules keep their type anyway
  (they are pytrees); arrays nested deeper (an optax state) stay JAX arrays,
  so third-party libraries get back the values they made. Without Tensor
  inputs nothing is converted: the transforms then act exactly like JAX's.

Example:
    >>> import maxfx
    >>> from maxfx.experimental.tensor import Tensor
    >>> f = lambda x: (x * x).sum(axis=0).squeeze(0)
    >>> maxfx.grad(f)(Tensor([1.0, 2.0])).to_numpy().tolist()
    [2.0, 4.0]
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.x64 import Jit, traced, tracing
from maxfx._placement import commit_unplaced
from maxfx.experimental._tensor import Tensor, _leaf
from maxfx.experimental.nn.module import Module

__all__ = ["jit", "grad", "value_and_grad", "vmap", "checkpoint", "remat", "scan"]


# ─── helpers ────────────────────────────────────────────────────────────────


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def _has_tensor(tree: Any) -> bool:
    return any(isinstance(x, Tensor) for x in jax.tree_util.tree_leaves(tree, is_leaf=_is_tensor))


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, jax.core.Tracer)) and not isinstance(x, Tensor)


def _as_tensor(x: Any) -> Any:
    return _leaf(x) if _is_array(x) else x


def _tensorize(out: Any) -> Any:
    """The output rule: raw arrays at the top level (or direct items of a tuple/list/dict) become Tensors."""
    if _is_array(out):
        return _leaf(out)
    if type(out) in (tuple, list):
        return type(out)(_as_tensor(x) for x in out)
    if type(out) is dict:
        return {k: _as_tensor(v) for k, v in out.items()}
    return out


def _converting(fun: Callable[..., Any]) -> Callable[..., Any]:
    """``fun`` with the output rule applied."""

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fun(*args, **kwargs)
        return _tensorize(out) if _has_tensor((args, kwargs)) else out

    return wrapped


def _name(fun: Callable[..., Any]) -> str:
    return getattr(fun, "__name__", None) or type(fun).__name__


def _call_module(module: Any, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


def _shift_argnums(kwargs: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """``kwargs`` with the given argnums options moved one position right (a Module went first)."""
    out = dict(kwargs)
    for name in names:
        nums = out.get(name)
        if nums is not None:
            out[name] = nums + 1 if isinstance(nums, int) else tuple(n + 1 for n in nums)
    return out


def _module_as_argument(
    fun: Any, transform: Callable[..., Any], argnum_options: Sequence[str], **kwargs: Any
) -> Callable[..., Any] | None:
    """``transform`` applied to a Module ``fun`` that takes the Module as its first argument.

    A Module passed as the function is called through ``module(*args)`` with the
    Module itself as a traced argument: its parameters become inputs of the
    compiled program (not constants baked into it, so later in-place updates are
    seen), and parameters still pending in the eager graph are realized before
    tracing starts rather than inside the trace. Returns None for other callables.
    """
    if not isinstance(fun, Module):
        return None
    inner = transform(_call_module, **_shift_argnums(kwargs, argnum_options))

    @functools.wraps(type(fun).__call__)
    def call(*args: Any, **kw: Any) -> Any:
        return inner(fun, *args, **kw)

    return call


# ─── jit ────────────────────────────────────────────────────────────────────


def jit(fun: Callable[..., Any] | None = None, /, **jit_kwargs: Any) -> Any:
    """``jax.jit`` for functions of Tensors, Modules and pytrees of them.

    Keyword arguments go to ``jax.jit`` (``static_argnums``, ``donate_argnums``...).
    Usable as ``@maxfx.jit`` or ``@maxfx.jit(static_argnums=1)``. The compiled
    function runs with 64-bit types enabled (see the module docs). A Module
    given as ``fun`` (``maxfx.jit(model)``) is passed to the program as an
    argument: its parameters are inputs, not constants, so in-place updates
    of the Module are seen by later calls.

    Example:
        >>> import maxfx
        >>> from maxfx.experimental.tensor import Tensor
        >>> @maxfx.jit
        ... def affine(x, w):
        ...     return x @ w + 1
        >>> affine(Tensor.ones([1, 2]), Tensor.ones([2, 2])).to_numpy().tolist()
        [[3.0, 3.0]]
    """
    if fun is None:
        return functools.partial(jit, **jit_kwargs)
    as_module = _module_as_argument(fun, jit, ("static_argnums", "donate_argnums"), **jit_kwargs)
    if as_module is not None:
        return as_module
    jitted = Jit(_converting(fun), **jit_kwargs)  # traced with 64-bit types unless called on tracers (lowering.x64)

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        if tracing((args, kwargs)):
            return jitted.jitted(*args, **kwargs)  # inside an enclosing trace, which decides the types
        # Eager results are uncommitted while a jitted function's outputs are committed, and
        # jax.jit keys its cache on that: without this a training loop fed its own outputs would
        # compile twice. Unplaced values join the committed ones (replicated on their mesh).
        args, kwargs = commit_unplaced((args, kwargs))
        return jitted(*args, **kwargs)

    call.lower = jitted.lower  # type: ignore[attr-defined]
    call.jitted = jitted.jitted  # type: ignore[attr-defined]
    return call


# ─── grad ───────────────────────────────────────────────────────────────────


def _arg_name(fun: Callable[..., Any], i: int) -> str:
    try:
        params = [
            p
            for p in inspect.signature(fun).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    return f"argument {i} ({params[i].name!r})" if i < len(params) else f"argument {i}"


def _leaf_desc(x: Any) -> str:
    shape = [int(d) for d in getattr(x, "shape", ())]
    dtype = x.dtype.name if isinstance(x, Tensor) else np.dtype(getattr(x, "dtype", type(x))).name
    return f"dtype {dtype}, shape {shape}"


def _check_differentiable_args(
    fun: Callable[..., Any], args: Sequence[Any], argnums: Sequence[int], where: str
) -> None:
    """Every leaf we differentiate with respect to must be floating point (else say which one)."""
    for i in argnums:
        if i >= len(args):
            raise TypeError(
                f"{where}({_name(fun)}): argnums includes {i} but only {len(args)} positional argument(s) were given"
            )
        for path, leaf in jax.tree_util.tree_flatten_with_path(args[i], is_leaf=_is_tensor)[0]:
            dtype = leaf.dtype.to_numpy() if isinstance(leaf, Tensor) else getattr(leaf, "dtype", None)
            if dtype is None:
                dtype = np.asarray(leaf).dtype
            if not jnp.issubdtype(dtype, np.inexact):
                where_in = f" at {jax.tree_util.keystr(path)}" if path else ""
                raise TypeError(
                    f"{where}({_name(fun)}): cannot differentiate with respect to {_arg_name(fun, i)}{where_in}: "
                    f"it has {_leaf_desc(leaf)}; gradients need floating-point values. Pass integer inputs "
                    f"(token ids, indices) through a position not in argnums, or cast them to a float dtype"
                )


def _scalar_hint(value: Any, shape: Sequence[int]) -> str:
    """How to get a shape-[] loss from ``value`` (MAX reductions keep the reduced dim, so `.mean()` alone does not)."""
    if tuple(shape) == ():
        return (
            "gradients need a floating-point output: "
            "cast it (e.g. `F.cast(loss, DType.float32)` or `x.astype(jnp.float32)`)"
        )
    one = all(int(d) == 1 for d in shape)
    if not isinstance(value, Tensor):
        fix = "`x.reshape(())`" if one else "`jnp.mean(x)` (reduces over all axes)"
        return f"make it a scalar first, e.g. {fix}, or use jax.vjp/jax.jacrev for non-scalar outputs"
    if one:
        return (
            f"it has one element: drop the size-1 dims with `F.reshape(loss, [])` or `maxfx.losses.reduce_mean(loss)` "
            f"(MAX reductions such as F.mean/.sum() keep the reduced dim, shape {list(shape)})"
        )
    return (
        "reduce over every element to rank 0 with `maxfx.losses.reduce_mean(loss)` (or `reduce_sum`; by hand: "
        "`F.mean(F.reshape(loss, [-1]), axis=0).squeeze(0)`). MAX reductions such as F.mean/.sum() keep the reduced "
        "dim as size 1, so `.mean()` alone is not a scalar. For non-scalar outputs use jax.vjp/jax.jacrev"
    )


def _scalar_output(fun: Callable[..., Any], has_aux: bool, where: str) -> Callable[..., Any]:
    """``fun`` returning a raw scalar array (Tensors unwrapped), checked to be a real scalar."""

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        out = fun(*args, **kwargs)
        if has_aux:
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise TypeError(
                    f"{where}({_name(fun)}, has_aux=True): the function must return a pair (loss, aux), got "
                    f"{type(out).__name__}"
                )
            value, aux = out
        else:
            value, aux = out, None
        array = value._array() if isinstance(value, Tensor) else value
        shape = getattr(array, "shape", None)
        dtype = getattr(array, "dtype", None)
        if shape is None or dtype is None:
            raise TypeError(
                f"{where}({_name(fun)}): the function must return a scalar Tensor or array, got {type(value).__name__}"
            )
        if tuple(shape) != () or not jnp.issubdtype(dtype, np.floating):
            raise TypeError(
                f"{where}({_name(fun)}): the function's output must be a floating-point scalar (shape []), got "
                f"dtype {np.dtype(dtype).name}, shape {list(shape)}; {_scalar_hint(value, shape)}"
            )
        if has_aux:
            return array, (_tensorize(aux) if _has_tensor((args, kwargs)) else aux)
        return array

    return wrapped


def _argnums_tuple(argnums: int | Sequence[int]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else tuple(argnums)


def value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, allow_int: bool = False
) -> Callable[..., Any]:
    """``jax.value_and_grad`` for functions of Tensors and Modules.

    Returns ``f(*args) -> (value, grads)`` (``((value, aux), grads)`` with
    ``has_aux``). Gradients have the structure of the differentiated
    arguments: a Module argument gives a Module of gradient Tensors, ready for
    optax. ``value`` is a Tensor when an input is a Tensor.

    Raises:
        TypeError: the output is not a floating-point scalar, or an argument in
            ``argnums`` holds integer/bool values (the message names the
            argument, its dtype and shape).

    Example:
        >>> import maxfx
        >>> from maxfx.experimental.tensor import Tensor
        >>> loss, g = maxfx.value_and_grad(lambda w: (w * w).sum(axis=0).squeeze(0))(Tensor([3.0]))
        >>> loss.item(), g.to_numpy().tolist()
        (9.0, [6.0])
    """
    return _value_and_grad(fun, argnums, has_aux, allow_int, "maxfx.value_and_grad")


def _value_and_grad(
    fun: Callable[..., Any], argnums: int | Sequence[int], has_aux: bool, allow_int: bool, where: str
) -> Callable[..., Any]:
    nums = _argnums_tuple(argnums)
    inner = jax.value_and_grad(
        _scalar_output(fun, has_aux, where), argnums=argnums, has_aux=has_aux, allow_int=allow_int
    )

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not allow_int:
            _check_differentiable_args(fun, args, nums, where)
        value, grads = traced(inner, *args, **kwargs)
        if _has_tensor((args, kwargs)):
            value = (_as_tensor(value[0]), value[1]) if has_aux else _as_tensor(value)
        return value, grads

    return call


def grad(
    fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False, allow_int: bool = False
) -> Callable[..., Any]:
    """``jax.grad`` for functions of Tensors and Modules (see `value_and_grad`).

    Example:
        >>> import maxfx
        >>> from maxfx.experimental import functional as F
        >>> from maxfx.experimental.tensor import Tensor
        >>> maxfx.grad(lambda x: F.sum(F.sin(x)).squeeze(0))(Tensor([0.0])).to_numpy().tolist()
        [1.0]
    """
    vg = _value_and_grad(fun, argnums, has_aux, allow_int, "maxfx.grad")

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        value, grads = vg(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads

    return call


# ─── vmap, checkpoint, scan ─────────────────────────────────────────────────


def vmap(fun: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0, **vmap_kwargs: Any) -> Callable[..., Any]:
    """``jax.vmap`` for functions of Tensors and Modules.

    ``in_axes`` is a prefix of the arguments' structure as in JAX: use ``None``
    for a Module whose parameters are shared across the batch.

    Example:
        >>> import maxfx
        >>> from maxfx.experimental.tensor import Tensor
        >>> maxfx.vmap(lambda row, w: row @ w, in_axes=(0, None))(Tensor.ones([3, 2]), Tensor.ones([2, 4])).shape
        [Dim(3), Dim(4)]
    """
    if isinstance(fun, Module):  # the Module's parameters are shared by every batch element
        module = fun

        @functools.wraps(type(fun).__call__)
        def call_module(*args: Any, **kwargs: Any) -> Any:
            axes = (None, *in_axes) if isinstance(in_axes, (tuple, list)) else (None,) + (in_axes,) * len(args)
            return vmap(_call_module, in_axes=axes, out_axes=out_axes, **vmap_kwargs)(module, *args, **kwargs)

        return call_module
    inner = jax.vmap(_converting(fun), in_axes=in_axes, out_axes=out_axes, **vmap_kwargs)

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        return traced(inner, *args, **kwargs)

    return call


def checkpoint(fun: Callable[..., Any], **checkpoint_kwargs: Any) -> Callable[..., Any]:
    """``jax.checkpoint`` (rematerialization) for functions of Tensors and Modules.

    The backward pass recomputes ``fun``'s intermediates instead of storing
    them; ``policy=``/``prevent_cse=``/``static_argnums=`` go to JAX. A Module
    works as ``fun`` (``maxfx.checkpoint(block)(x)``). Also named ``remat``.

    Example:
        >>> import maxfx
        >>> from maxfx.experimental import functional as F
        >>> from maxfx.experimental.tensor import Tensor
        >>> body = maxfx.checkpoint(lambda x: F.tanh(x) * 2)
        >>> maxfx.grad(lambda x: body(x).sum(axis=0).squeeze(0))(Tensor([0.0])).to_numpy().tolist()
        [2.0]
    """
    as_module = _module_as_argument(fun, checkpoint, ("static_argnums",), **checkpoint_kwargs)
    if as_module is not None:
        return as_module
    inner = jax.checkpoint(_converting(fun), **checkpoint_kwargs)

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        return traced(inner, *args, **kwargs)

    return call


remat = checkpoint


def _like(template: Any, value: Any) -> Any:
    """``value`` with Tensors where ``template`` has Tensors and arrays where it has arrays.

    ``lax.scan`` needs the carry to keep its exact pytree structure, and a body
    may well return ``jnp`` results for a Tensor carry (or the other way round).
    """

    def match(t: Any, v: Any) -> Any:
        if isinstance(t, Tensor):
            return v if isinstance(v, Tensor) else _leaf(jnp.asarray(v))
        return v._array() if isinstance(v, Tensor) else v

    return jax.tree_util.tree_map(match, template, value, is_leaf=_is_tensor)


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    unroll: int | bool = 1,
) -> tuple[Any, Any]:
    """``jax.lax.scan`` over Tensors and Modules: ``f(carry, x) -> (carry, y)``.

    ``xs`` may be a Module whose parameters are stacked along a leading axis
    (``jax.tree.map(lambda *p: jnp.stack(p), *layers)``): each step then gets
    one layer as a Module, which is how repeated layers compile once. The
    carry keeps its structure (Tensor stays Tensor); stacked ``ys`` follow the
    output rule.

    Example:
        >>> import maxfx
        >>> from maxfx.experimental.tensor import Tensor
        >>> total, running = maxfx.scan(lambda c, x: (c + x, c + x), Tensor(0.0), Tensor([1.0, 2.0, 3.0]))
        >>> total.item(), running.to_numpy().tolist()
        (6.0, [1.0, 3.0, 6.0])
    """

    def body(carry: Any, x: Any) -> tuple[Any, Any]:
        out = f(carry, x)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"maxfx.scan({_name(f)}): the body must return a pair (carry, y), got {type(out).__name__}")
        new_carry, y = out
        try:
            new_carry = _like(carry, new_carry)
        except ValueError as e:
            raise TypeError(
                f"maxfx.scan({_name(f)}): the carry returned by the body must have the structure of init: {e}"
            ) from None
        return new_carry, (_tensorize(y) if _has_tensor((carry, x)) else y)

    return traced(jax.lax.scan, body, init, xs, length=length, reverse=reverse, unroll=unroll)
