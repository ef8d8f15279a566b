"""The memory behind driver tensors and the view recipes applied to it.

A `Tensor` is a root storage plus a recipe of view steps (basic indexing, dtype
reinterpretation). All views of one storage see each other's writes, as MAX's
strided views do:

- `HostStorage` holds a numpy array. When it wraps read-only memory (an XLA
  result, a read-only numpy array, an ``mmap`` opened with ``mode='r'``) reads
  are zero-copy and the first write through any tensor copies it into a
  writable array (copy-on-write); views re-derive from the new array.
- `DeviceStorage` holds an immutable ``jax.Array`` on an accelerator. A write
  to a view builds the updated root functionally (``.at[].set`` up the recipe)
  and swaps it in, so every view observes it.

Layout questions (shape, strides, contiguity, bounds) are answered on a
*shadow*: a numpy array with the tensor's shape and strides over one scratch
element, so no data is touched (or waited for) to answer them.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering.x64 import run

__all__ = [
    "HostStorage",
    "DeviceStorage",
    "IndexStep",
    "ViewStep",
    "shadow_of",
    "apply_np",
    "apply_jax",
    "write_back_jax",
    "device_zeros",
    "np_view",
    "is_strided_contiguous",
]

# One recipe step: ("index", key) for basic indexing, ("view", np.dtype, shape) for reinterpretation.
IndexStep = tuple[str, Any]
ViewStep = tuple[str, np.dtype, tuple[int, ...]]


class HostStorage:
    """Host memory: a numpy array, or a read-only source copied on first write."""

    __slots__ = ("_np", "_jax", "version")

    def __init__(self, data: np.ndarray | jax.Array):
        self._np: np.ndarray | None = data if isinstance(data, np.ndarray) else None
        self._jax: jax.Array | None = None if isinstance(data, np.ndarray) else data
        self.version = 0

    def read(self) -> np.ndarray:
        """The root array, zero-copy (read-only when the memory is)."""
        if self._np is None:
            self._np = np.asarray(self._jax)  # zero-copy, read-only view of the XLA buffer
        return self._np

    def writable(self) -> np.ndarray:
        """The root array, copied first if it is read-only (copy-on-write)."""
        arr = self.read()
        if not arr.flags.writeable:
            self._np = arr.copy(order="C")
            self._jax = None
            self.version += 1
        return self._np

    def jax_input(self) -> np.ndarray | jax.Array:
        """What JAX should consume: the wrapped jax.Array if still pristine, else the numpy root."""
        return self._jax if self._jax is not None else self.read()

    @property
    def jax_array(self) -> jax.Array | None:
        """The wrapped jax.Array while no write has happened."""
        return self._jax

    def replace(self, data: np.ndarray | jax.Array) -> None:
        """New root contents (same shape/dtype); writable memory is written in place to keep aliases."""
        if self._np is not None and self._np.flags.writeable:
            np.copyto(self._np, np.asarray(data))
            return
        if not isinstance(data, np.ndarray) and any(d.platform != "cpu" for d in data.devices()):
            data = np.asarray(data)  # host memory must stay on the host (DLPack, to_numpy)
        self._np, self._jax = (data, None) if isinstance(data, np.ndarray) else (None, data)
        self.version += 1


class DeviceStorage:
    """Accelerator memory: one immutable jax.Array, replaced on every write."""

    __slots__ = ("data", "version")

    def __init__(self, data: jax.Array):
        self.data = data
        self.version = 0

    def replace(self, data: jax.Array) -> None:
        """Swap in new root contents (views re-derive from it)."""
        self.data = data
        self.version += 1


@functools.cache
def _scratch(dtype: np.dtype) -> np.ndarray:
    return np.zeros(1, dtype)


def shadow_of(shape: tuple[int, ...], dtype: np.dtype, strides: tuple[int, ...] | None = None) -> np.ndarray:
    """A read-only array with this layout over one scratch element: shape/stride arithmetic only, never read."""
    if strides is None:
        strides = _c_strides(shape, dtype.itemsize)
    return np.lib.stride_tricks.as_strided(_scratch(dtype), shape=shape, strides=strides, writeable=False)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, acc = [], itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def is_strided_contiguous(arr: np.ndarray) -> bool:
    """C-contiguous with no negative steps (MAX counts negative steps as non-contiguous)."""
    return bool(arr.flags.c_contiguous) and all(s >= 0 for s in arr.strides)


def np_view(arr: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Reinterpret ``arr``'s bytes as ``dtype`` with ``shape`` without copying.

    Raises:
        ValueError: when the bytes cannot be reinterpreted in place.
    """
    base = arr.reshape(1) if arr.ndim == 0 else arr  # numpy cannot change the itemsize of a 0-d array
    out = base.view(dtype)
    if out.shape != shape:
        out = _reshape_no_copy(out, shape)
    return out


def _reshape_no_copy(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Reshape as a view; raise ValueError where numpy would have to copy."""
    try:
        return arr.reshape(shape, copy=False)  # numpy >= 2.1
    except TypeError:
        out = arr.view()
        try:
            out.shape = shape
        except AttributeError as e:
            raise ValueError(str(e)) from None
        return out


def apply_np(arr: np.ndarray, steps: tuple) -> np.ndarray:
    """Apply a view recipe to a numpy array (result shares its memory)."""
    for step in steps:
        arr = arr[step[1]] if step[0] == "index" else np_view(arr, step[1], step[2])
    return arr


def _jax_bytes(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if x.dtype != jnp.uint8:
        x = lax.bitcast_convert_type(x, jnp.uint8)  # adds a trailing byte axis for wider types
    return x.reshape(-1)


def _jax_from_bytes(b: jax.Array, dtype: np.dtype, shape: tuple[int, ...]) -> jax.Array:
    if dtype == np.bool_:
        out = b != 0
    elif dtype == np.uint8:
        out = b
    elif dtype.itemsize == 1:
        out = lax.bitcast_convert_type(b, dtype)
    else:
        out = lax.bitcast_convert_type(b.reshape(-1, dtype.itemsize), dtype)
    return out.reshape(shape)


def jax_view(x: jax.Array, dtype: np.dtype, shape: tuple[int, ...]) -> jax.Array:
    """The jax counterpart of `np_view` (a bitcast through bytes; XLA arrays are dense)."""
    return _jax_from_bytes(_jax_bytes(x), dtype, shape)


def _apply_jax(arr: jax.Array, steps: tuple) -> jax.Array:
    for step in steps:
        arr = arr[step[1]] if step[0] == "index" else jax_view(arr, step[1], step[2])
    return arr


def apply_jax(arr: jax.Array, steps: tuple) -> jax.Array:
    """Apply a view recipe to a jax.Array (produces new arrays; JAX has no aliasing views).

    Runs with 64-bit types (`lowering.x64.run`): an int64 or float64 view keeps its width.
    """
    return run(_apply_jax, arr, steps)


def _write_back_jax(root: jax.Array, steps: tuple, leaf: Any) -> jax.Array:
    if not steps:
        return leaf
    step, rest = steps[0], steps[1:]
    if step[0] == "index":
        child = root[step[1]]
        new_child = _write_back_jax(child, rest, leaf)
        return root.at[step[1]].set(jnp.asarray(new_child, dtype=root.dtype))
    child = jax_view(root, step[1], step[2])
    new_child = _write_back_jax(child, rest, leaf)
    return jax_view(jnp.asarray(new_child, dtype=step[1]), root.dtype, root.shape)


def write_back_jax(root: jax.Array, steps: tuple, leaf: Any) -> jax.Array:
    """The root array after the view at the end of ``steps`` is replaced by ``leaf`` (run with 64-bit types, as
    `apply_jax`).
    """
    return run(_write_back_jax, root, steps, leaf)


def device_zeros(shape: tuple[int, ...], dtype: np.dtype, device: jax.Device) -> jax.Array:
    """A zeroed array on ``device`` (XLA has no uninitialised allocation), allocated there, 64-bit dtypes kept."""
    return run(jnp.zeros, shape, dtype, device=device)
