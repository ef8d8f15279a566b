"""LoRA kernels of ``max.nn.kernels``: SGMV shrink/expand over a ragged batch of requests.

A batch holds groups of rows (``input_row_offsets`` prefix sums); group ``i``
uses adapter ``lora_ids[i]`` of rank ``lora_ranks[i]`` (id < 0 or rank 0: no
adapter). Adapters are stacked: ``lora_a [num_loras, max_rank, in_dim]``,
``lora_b [num_loras, out_dim, max_rank]``.

Example:
    >>> from maxfx.nn import kernels
    >>> callable(kernels.sgmv_lora_kernel)
    True
"""

from __future__ import annotations

from typing import Any

from maxfx.graph import ops

__all__ = ["sgmv_kernel", "sgmv_lora_kernel"]


def _max_len(kernel: str, max_lora_seq_len: Any) -> None:
    if isinstance(max_lora_seq_len, bool) or not isinstance(max_lora_seq_len, int) or max_lora_seq_len <= 0:
        raise ValueError(f"{kernel}: max_lora_seq_len must be a positive int, got {max_lora_seq_len!r}")


def sgmv_kernel(
    input: Any,
    lora: Any,
    lora_ids: Any,
    lora_ranks: Any,
    input_row_offsets: Any,
    max_lora_seq_len: int,
    bias: Any = None,
) -> Any:  # noqa: A002
    """Rows of group ``i`` times ``lora[lora_ids[i]].T`` (+ ``bias[lora_ids[i]]``), one LoRA step (A or B).

    ``lora`` is ``[num_loras, out, in]``; rows of groups without an adapter and
    rows after the last offset are zero. ``max_lora_seq_len`` (MAX's launch
    bound) must be positive.

    Example:
        >>> v = sgmv_kernel(x, lora_a, ids, ranks, offsets, 128)  # doctest: +SKIP
    """
    _max_len("sgmv_kernel", max_lora_seq_len)
    return ops.sgmv(input, lora, lora_ids, lora_ranks, input_row_offsets, bias)


def sgmv_lora_kernel(
    input: Any,  # noqa: A002
    lora_a: Any,
    lora_b: Any,
    lora_ids: Any,
    lora_ranks: Any,
    grouped_row_offsets: Any,
    max_lora_seq_len: int,
    bias: Any = None,
) -> Any:
    """The LoRA delta ``(x @ A[id].T)[:, :rank] @ B[id].T (+ bias[id])`` of each group's rows.

    Shrink to the adapter's rank (columns past ``lora_ranks[i]`` dropped), then
    expand to ``out_dim``.

    Example:
        >>> delta = sgmv_lora_kernel(x, a, b, ids, ranks, offsets, 128)  # doctest: +SKIP
    """
    _max_len("sgmv_lora_kernel", max_lora_seq_len)
    if lora_a.rank == 3 and lora_b.rank == 3 and lora_a.shape[1] != lora_b.shape[2]:
        raise ValueError(
            f"sgmv_lora_kernel: lora_a [L, rank, in] and lora_b [L, out, rank] ranks differ: {list(lora_a.shape)} vs "
            f"{list(lora_b.shape)}"
        )
    shrunk = ops.sgmv(input, lora_a, lora_ids, lora_ranks, grouped_row_offsets, None, mask_rank=True)
    return ops.sgmv(shrunk, lora_b, lora_ids, lora_ranks, grouped_row_offsets, bias)
