"""Training glue between maxfx Modules and optax: `init` and `make_train_step`.

optax works on pytrees, and a Module is one (its leaves are its parameter
Tensors), so optax needs almost nothing from maxfx. The one style maxfx
supports is **functional**: a train step takes the model and returns a *new*
Module with updated parameters (the old one is left as it was, unless you ask
for buffer donation); nothing is mutated in place::

    step = maxfx.optim.make_train_step(loss_fn, optax.adam(1e-3))
    opt_state = maxfx.optim.init(optax.adam(1e-3), model)
    for batch in batches:
        model, opt_state, loss = step(model, opt_state, *batch)

``loss_fn(model, *batch)`` returns a floating-point scalar (Tensor or array).

Example:
    >>> import optax
    >>> import maxfx
    >>> from maxfx.experimental import functional as F
    >>> from maxfx.experimental.nn import Linear
    >>> from maxfx.experimental.tensor import Tensor
    >>> model = Linear(2, 1)
    >>> def loss_fn(m, x, y):
    ...     d = m(x) - y
    ...     return F.reshape(F.mean(F.reshape(d * d, [-1]), axis=0), [])
    >>> opt = optax.sgd(0.1)
    >>> step = maxfx.optim.make_train_step(loss_fn, opt)
    >>> state = maxfx.optim.init(opt, model)
    >>> x, y = Tensor.ones([4, 2]), Tensor.zeros([4, 1])
    >>> first = loss_fn(model, x, y).item()
    >>> for _ in range(20):
    ...     model, state, loss = step(model, state, x, y)
    >>> loss.item() < first
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax

from lowering.x64 import Jit
from maxfx._placement import replicated_like
from maxfx._transforms import _leaf_desc, jit, value_and_grad
from maxfx.experimental._tensor import Tensor

__all__ = ["init", "make_train_step"]


def _check_trainable(model: Any, where: str) -> None:
    """optax updates every leaf: all of them must be floating point."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(model, is_leaf=lambda x: isinstance(x, Tensor))[0]:
        dtype = leaf.dtype.to_numpy() if isinstance(leaf, Tensor) else np.asarray(leaf).dtype
        if not np.issubdtype(dtype, np.inexact):
            raise TypeError(
                f"{where}: parameter {jax.tree_util.keystr(path) or 'model'} has {_leaf_desc(leaf)}; optax can only "
                f"update floating-point parameters. Keep integer tensors out of the Module's attributes (e.g. "
                f"store them as numpy arrays) or pass them in the batch"
            )


def init(optimizer: Any, model: Any) -> Any:
    """``optimizer.init(model)``: the optax state for the Module's parameters.

    Raises:
        TypeError: ``optimizer`` is not an optax ``GradientTransformation``, or a
            parameter is not floating point (the message names it).
    """
    if not hasattr(optimizer, "init") or not hasattr(optimizer, "update"):
        raise TypeError(
            "maxfx.optim.init: expected an optax GradientTransformation (with init/update), got "
            f"{type(optimizer).__name__}"
        )
    _check_trainable(model, "maxfx.optim.init")
    # One compiled program instead of op-by-op zeros per parameter shape. optax builds its state
    # from constants, so without out_shardings it would land uncommitted on device 0 whatever
    # the model's placement; placed like the model, every train step shares one executable.
    # Jit: jax.jit traced with 64-bit types (lowering.x64); the state's arrays stay JAX arrays.
    init_state = Jit(optimizer.init)
    state = init_state.eval_shape(model)
    shardings = _state_shardings(state, model)
    if shardings is None:
        return init_state(model)
    leaves = Jit(lambda m: jax.tree.leaves(optimizer.init(m)), out_shardings=shardings)(model)
    return jax.tree.unflatten(jax.tree.structure(state), leaves)


def _state_shardings(state: Any, model: Any) -> list[Any] | None:
    """One sharding per leaf of ``state`` (the shapes of ``optimizer.init(model)``): placed like the model.

    Parts of the state with the model's structure and shapes (Adam's ``mu`` and
    ``nu``, momentum traces) get each parameter's sharding; everything else (the
    step ``count``, scalars) is replicated over the model's devices. None when the
    model has no committed parameter (nothing to follow).
    """
    replicated = replicated_like(model)
    if replicated is None:
        return None
    params = jax.tree.leaves(model)
    model_def = jax.tree.structure(model)
    shapes = [getattr(p, "shape", None) for p in params]

    def mirrors_model(node: Any) -> bool:
        return (
            jax.tree.structure(node) == model_def
            and [getattr(x, "shape", None) for x in jax.tree.leaves(node)] == shapes
        )

    out: list[Any] = []
    for node in jax.tree.leaves(state, is_leaf=mirrors_model):
        if mirrors_model(node):
            out.extend(p.sharding if isinstance(p, jax.Array) and p.committed else replicated for p in params)
        else:
            out.append(replicated)
    return out


def make_train_step(
    loss_fn: Callable[..., Any],
    optimizer: Any,
    *,
    has_aux: bool = False,
    donate: bool = False,
    jit_compile: bool = True,
) -> Callable[..., Any]:
    """A pure train step ``(model, opt_state, *batch) -> (model, opt_state, loss)``.

    Computes ``loss_fn(model, *batch)`` and its gradient with respect to
    ``model`` (`maxfx.value_and_grad`), applies ``optimizer`` and returns the
    new Module, the new optimizer state and the loss (``(loss, aux)`` with
    ``has_aux``). The step is compiled with `maxfx.jit` (one compile per batch
    shape) unless ``jit_compile=False``.

    Args:
        loss_fn: ``loss_fn(model, *batch)`` → a floating-point scalar.
        optimizer: an optax ``GradientTransformation``.
        has_aux: ``loss_fn`` returns ``(loss, aux)``.
        donate: let XLA reuse the buffers of the model and optimizer state
            passed in (faster, less memory; the *old* model's Tensors become
            unusable).
        jit_compile: compile the step (turn off to debug with prints).
    """
    if not hasattr(optimizer, "update"):
        raise TypeError(
            f"maxfx.optim.make_train_step: expected an optax GradientTransformation, got {type(optimizer).__name__}"
        )
    grad_fn = value_and_grad(loss_fn, has_aux=has_aux)

    def step(model: Any, opt_state: Any, *batch: Any) -> tuple[Any, Any, Any]:
        loss, grads = grad_fn(model, *batch)
        updates, opt_state = optimizer.update(grads, opt_state, model)
        return optax.apply_updates(model, updates), opt_state, loss

    step.__name__ = f"train_step[{getattr(loss_fn, '__name__', 'loss_fn')}]"
    if not jit_compile:
        return step
    return jit(step, donate_argnums=(0, 1) if donate else ())
