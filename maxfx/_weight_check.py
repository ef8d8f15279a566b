"""The one check that a weight's value matches its declared dtype and shape, and its one message.

Every place that binds a value to a declared weight calls `check_weight_value`:
graph `Module.load_state_dict`, eager `Module.load_state_dict` / ``load_state``,
``InferenceSession.load``'s ``weights_registry``, ``Module.compile(weights=...)``
and the flax interop. The problem wording (``dimension 0 mismatch: expected
1024, got 512``, ``shape rank mismatch``, ``dtype mismatch``) is MAX's, from its
graph ``Module.load_state_dict``.

Example:
    >>> import numpy as np
    >>> from maxfx.dtype import DType
    >>> check_weight_value("w", np.zeros((4, 8), np.float32), [8, 4], DType.float32, where="Net.load")
    Traceback (most recent call last):
    ...
    ValueError: Net.load: weight 'w' expects float32[8, 4], got float32[4, 8]: dimension 0 mismatch: expected 8, got 4
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from lowering.dims import format_shape
from lowering.dtypes import DType

__all__ = ["check_weight_value"]


def _static(d: Any) -> int | None:
    """A dimension's size; None for a symbolic one (which accepts any size)."""
    try:
        return int(d)
    except (TypeError, ValueError):
        return None


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, DType):
        return dtype.name
    try:
        return DType.from_numpy(dtype).name
    except ValueError:  # no MAX equivalent (complex64) or no dtype at all (a Python scalar)
        return np.dtype(dtype).name if dtype is not None else "no dtype"


def check_weight_value(
    name: str,
    value: Any,
    declared_shape: Iterable[Any],
    declared_dtype: DType,
    *,
    where: str,
    error: type[ValueError] = ValueError,
    note: str = "",
) -> None:
    """Raise ``error`` unless ``value`` (anything with ``shape`` and ``dtype``) is a ``declared_dtype[declared_shape]``.

    A symbolic dimension of ``declared_shape`` accepts any size. The message
    names the weight, both types and what differs, then ``note``.

    Raises:
        ValueError: (or the ``error`` subclass) the dtype, the rank or a static dimension differs.
    """
    declared = list(declared_shape)
    got = [int(d) for d in np.shape(value)]
    got_dtype = _dtype_name(getattr(value, "dtype", None))
    problems = []
    if len(got) != len(declared):
        problems.append(f"shape rank mismatch: expected rank {len(declared)}, got {len(got)}")
    else:
        for i, (d, g) in enumerate(zip(declared, got, strict=True)):
            if _static(d) is not None and _static(d) != g:
                problems.append(f"dimension {i} mismatch: expected {_static(d)}, got {g}")
                break
    if got_dtype != declared_dtype.name:
        problems.append(f"dtype mismatch: expected {declared_dtype.name}, got {got_dtype}")
    if problems:
        raise error(
            f"{where}: weight {name!r} expects {declared_dtype.name}{format_shape(declared)}, "
            f"got {got_dtype}{format_shape(got)}: {'; '.join(problems)}{note}"
        )
