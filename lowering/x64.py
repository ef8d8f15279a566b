"""Scoped 64-bit mode, entered at the three boundaries all of maxfx's JAX work passes through.

MAX has int64/uint64/float64 tensors (argmax results, token ids, ``int / int``);
JAX only keeps them with ``jax_enable_x64``. maxfx turns it on around its own
work instead of flipping the user's global config, and only here:

* `to_device`: a transfer onto a device or sharding (``jax.device_put``; a
  numpy int64 array put without x64 arrives as int32);
* `traced`: tracing, lowering, compiling and exporting; `jit` is ``jax.jit``
  whose calls, ``lower`` and ``eval_shape`` go through it. Called on tracers (inside
  an enclosing JAX trace) it leaves the mode to that trace: switching it
  mid-trace would mix 32- and 64-bit values;
* `run`: JAX work run now on concrete values (eager ops, the op-by-op
  interpreter, library calls that compute or move arrays: orbax, the
  multi-process all-gather).

Code elsewhere calls these instead of entering `x64` itself. A compiled
executable keeps the dtypes it was compiled for, but its host callbacks (debug
prints, MAX checkpoints) receive their arrays under the caller's mode, so
`lowering.compile` runs its executables through `run`.

Example:
    >>> import numpy as np
    >>> to_device(np.arange(2, dtype=np.int64), None).dtype
    dtype('int64')
    >>> jit(lambda x: x * 2)(np.int64(3)).dtype
    dtype('int64')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

__all__ = ["x64", "to_device", "traced", "run", "jit", "Jit"]


def x64():
    """Context manager enabling 64-bit types (the three boundaries below are its users; tests may enter it)."""
    return jax.enable_x64(True)


def to_device(value: Any, placement: Any) -> jax.Array:
    """``jax.device_put(value, placement)`` keeping 64-bit dtypes: the one transfer onto devices.

    ``placement``: a ``jax.Device``, a ``Sharding``, or None (JAX's default device).
    """
    with x64():
        return jax.device_put(value, placement)


def tracing(tree: Any) -> bool:
    """Whether ``tree`` holds tracers (an enclosing JAX transformation is tracing it)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def traced(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` (something that traces: a jitted call, ``lower``, ``jax.export``,
    ``eval_shape``) with 64-bit types, unless its arguments are tracers: then the enclosing trace decides."""
    if tracing((args, kwargs)):
        return call(*args, **kwargs)
    with x64():
        return call(*args, **kwargs)


def run(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, JAX work on concrete values run now, with 64-bit types."""
    with x64():
        return call(*args, **kwargs)


class Jit:
    """``jax.jit(fun, **jit_kwargs)`` traced with 64-bit types (through `traced`).

    ``jitted`` is the underlying ``jax.jit`` object (for ``jax.export`` and its cache counters).
    """

    __slots__ = ("jitted", "__wrapped__")

    def __init__(self, fun: Callable[..., Any], **jit_kwargs: Any):
        self.jitted = jax.jit(fun, **jit_kwargs)
        self.__wrapped__ = fun

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return traced(self.jitted, *args, **kwargs)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        return traced(self.jitted.lower, *args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        return traced(self.jitted.eval_shape, *args, **kwargs)


def jit(fun: Callable[..., Any], **jit_kwargs: Any) -> Jit:
    """``jax.jit`` for maxfx's own programs: the one entry to tracing and compiling them (see `Jit`)."""
    return Jit(fun, **jit_kwargs)
