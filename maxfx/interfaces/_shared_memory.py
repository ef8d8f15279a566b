"""Large numpy arrays through POSIX shared memory instead of the message bytes."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["SharedMemoryArray", "ndarray_to_shared_memory", "open_shm_array", "resolve_dtype"]


def resolve_dtype(name: str) -> np.dtype:
    """``np.dtype`` of a dtype name, including ``ml_dtypes`` names (``bfloat16``...) when ml_dtypes is loaded."""
    try:
        return np.dtype(name)
    except TypeError:
        ml_dtypes = sys.modules.get("ml_dtypes")
        if ml_dtypes is not None and hasattr(ml_dtypes, name):
            return np.dtype(getattr(ml_dtypes, name))
        raise TypeError(f"unknown numpy dtype {name!r} (an ml_dtypes type needs ml_dtypes imported)") from None


@dataclass(frozen=True)
class SharedMemoryArray:
    """Placeholder for an array that lives in a shared-memory segment: its name, shape and dtype.

    On the wire it is ``{"__shm__": True, "name", "shape", "dtype"}``; the
    decoder turns it back into an array and frees the segment.

    Example::

        >>> import numpy as np
        >>> ref = ndarray_to_shared_memory(np.arange(6, dtype=np.int64).reshape(2, 3))
        >>> ref.shape, ref.dtype
        ((2, 3), 'int64')
        >>> open_shm_array(ref).tolist()
        [[0, 1, 2], [3, 4, 5]]
    """

    name: str
    shape: tuple[int, ...]
    dtype: str


def ndarray_to_shared_memory(array: npt.NDArray[Any]) -> SharedMemoryArray | None:
    """Copy ``array`` into a new shared-memory segment; ``None`` when no segment can be created.

    The segment belongs to whoever opens it with :func:`open_shm_array`, which
    unlinks it; the creating process stops tracking it.
    """
    if array.dtype.hasobject:
        raise TypeError("arrays of Python objects cannot be placed in shared memory")
    try:
        shm = shared_memory.SharedMemory(create=True, size=max(array.nbytes, 1))
    except OSError:
        return None
    try:
        np.ndarray(array.shape, dtype=array.dtype, buffer=shm.buf)[...] = array
        ref = SharedMemoryArray(name=shm.name, shape=tuple(int(d) for d in array.shape), dtype=str(array.dtype))
    finally:
        shm.close()
    try:
        # The receiver unlinks it; without this the creator's tracker would unlink it (or warn) at exit.
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001
    except Exception:  # noqa: BLE001 - tracking is best effort
        pass
    return ref


def open_shm_array(ref: SharedMemoryArray | dict[str, Any]) -> npt.NDArray[Any]:
    """Read the array a :class:`SharedMemoryArray` (or its wire dict) points to, then free the segment.

    Raises ``FileNotFoundError`` if the segment is gone (already read, or never created).
    """
    if isinstance(ref, dict):
        ref = SharedMemoryArray(name=ref["name"], shape=tuple(ref["shape"]), dtype=ref["dtype"])
    shm = shared_memory.SharedMemory(name=ref.name)
    try:
        dtype = resolve_dtype(ref.dtype)
        view = np.ndarray(tuple(ref.shape), dtype=dtype, buffer=shm.buf)
        out = view.copy()
        del view
    finally:
        shm.close()
        shm.unlink()
    return out
