"""Which values are ``transpose(w, -1, -2)`` of a matrix, so ``matmul`` can read ``w`` in place.

XLA's CPU backend does not fold a transpose into the dot that consumes it:
``x @ w.T`` copies ``w`` transposed on every call, while a dot that contracts
``w``'s last axis reads ``w`` where it is. For a one-row product (LLM decode)
the copy costs about 5x the product itself (measured, 5632x512 float32:
2.9 ms vs 0.4-0.55 ms). ``x @ w.T`` is how MAX's ``Linear`` and most model code
are written, so `transpose` notes each matrix transpose it makes and `matmul`
multiplies by the source matrix instead (``matmul(..., rhs_transposed=True)``);
the unused transpose is then dead code that XLA removes.

The note is held only while the transposed value lives, and only while the
source still holds the data it held then (an eager ``Tensor`` written in
place gets new storage, and the note no longer applies).

Example:
    >>> from maxfx.tensor import Tensor
    >>> from lowering.ops._transposed import source_of
    >>> w = Tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> wt = w.T
    >>> source_of(wt) is w
    True
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["note", "source_of"]

# id(transposed value) -> (weak reference to it, source, the source's storage then).
_NOTES: dict[int, tuple[weakref.ref, Any, Any]] = {}


def _storage(value: Any) -> Any:
    return getattr(value, "_var", None)


def note(transposed: Any, source: Any) -> None:
    """Record that ``transposed`` is ``source`` with its last two axes swapped (a no-op for values without weak
    references).
    """
    key = id(transposed)
    try:
        ref = weakref.ref(transposed, lambda _, key=key: _NOTES.pop(key, None))
    except TypeError:  # raw JAX values: nothing to hang the note on
        return
    _NOTES[key] = (ref, source, _storage(source))


def source_of(value: Any) -> Any:
    """The matrix ``value`` was transposed from, or None when unknown or since written to."""
    entry = _NOTES.get(id(value))
    if entry is None or entry[0]() is not value:
        return None
    _, source, storage = entry
    return source if _storage(source) is storage else None
