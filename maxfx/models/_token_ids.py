"""The vocabulary bound of token ids at a model's entry.

An embedding lookup is a gather: under ``jax.jit`` (``generate``'s steps) an id
outside the table is clamped to its last row, silently. Where the ids are
concrete (an eager ``model(ids)`` call) the model checks them first and names
the bad id and the vocabulary size.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["TokenIdError", "check_token_ids"]


class TokenIdError(ValueError, IndexError):
    """A token id outside ``[0, vocab_size)`` (a ValueError and an IndexError, as ``gather``'s)."""


def check_token_ids(where: str, ids: Any, vocab_size: int) -> None:
    """Raise `TokenIdError` if a concrete id in ``ids`` is negative or ``>= vocab_size``.

    ``ids`` is an eager Tensor or a numpy array (the graph models' host-side
    rows). Traced or still-pending ids (inside ``jax.jit``, ``F.lazy()``) are
    not read: checking them would stop the trace or force a computation.

    Example:
        >>> from maxfx.experimental.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> check_token_ids("LlamaForCausalLM", Tensor([[1, 300]], dtype=DType.int64), 256)
        ... # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        maxfx.models._token_ids.TokenIdError: LlamaForCausalLM: token id 300 is out of range for the vocabulary
        of 256 tokens (config.vocab_size); valid ids are 0 to 255
    """
    if isinstance(ids, np.ndarray):
        a = ids
    else:
        var = getattr(ids, "_var", None)
        array = getattr(var, "array", None)
        if array is None or isinstance(array, jax.core.Tracer) or not var.realized:
            return
        a = np.asarray(array)  # the ids of one forward call: a small [batch, seq] read
    if a.size == 0:
        return
    lo, hi = int(a.min()), int(a.max())
    if lo < 0 or hi >= vocab_size:
        bad = hi if hi >= vocab_size else lo
        raise TokenIdError(
            f"{where}: token id {bad} is out of range for the vocabulary of {vocab_size} tokens (config.vocab_size); "
            f"valid ids are 0 to {vocab_size - 1}"
        )
