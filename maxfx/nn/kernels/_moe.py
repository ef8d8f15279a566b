"""MoE kernels of ``max.nn.kernels``: routing indices and the grouped (per-expert) matmul.

Example:
    >>> from maxfx.nn import kernels
    >>> callable(kernels.moe_create_indices) and callable(kernels.grouped_matmul_ragged)
    True
"""

from __future__ import annotations

from typing import Any

from maxfx.graph import ops

__all__ = ["moe_create_indices", "grouped_matmul_ragged"]


def moe_create_indices(topk_ids: Any, num_local_experts: int) -> tuple[Any, Any, Any, Any, Any]:
    """Group the router's flattened ``topk_ids [tokens * k]`` by expert.

    Returns uint32 ``(token_expert_order, expert_start_indices [E + 1],
    restore_token_order, expert_ids [E], expert_usage_stats [2])``: the stable
    order sorting the assignments by expert, each active expert's start in it
    (active experts in id order, padding = total), the inverse order, the active
    expert ids (padding 0xFFFFFFFF) and ``[max tokens of one expert, active
    experts]``. ``token_expert_order // k`` is the token of each sorted slot.

    Example:
        >>> order, starts, restore, ids, stats = moe_create_indices(topk.reshape([-1]), 8)  # doctest: +SKIP
    """
    if isinstance(num_local_experts, bool) or not isinstance(num_local_experts, int):
        raise TypeError(f"moe_create_indices: num_local_experts must be an int, got {type(num_local_experts).__name__}")
    return tuple(ops.moe_create_indices(topk_ids, num_local_experts))  # type: ignore[return-value]


def grouped_matmul_ragged(
    hidden_states: Any, weight: Any, expert_start_indices: Any, expert_ids: Any, expert_usage_stats_host: Any
) -> Any:
    """Per-expert matmul over a ragged batch: rows ``[starts[i], starts[i+1])`` times ``weight[expert_ids[i]].T``.

    ``hidden_states [T, K]``, ``weight [E, N, K]`` (transposed per expert);
    only the first ``expert_usage_stats_host[1]`` groups are active and other
    rows give zeros. Returns ``[T, N]`` in the input dtype.

    Example:
        >>> y = grouped_matmul_ragged(h, w, starts, ids, stats)  # doctest: +SKIP
    """
    if weight.rank == 3 and expert_ids.rank == 1 and weight.shape[0] != expert_ids.shape[0]:
        raise ValueError(
            f"grouped_matmul_ragged: expected weight of shape [num_experts={expert_ids.shape[0]}, N, K] "
            f"(one matrix per expert_ids slot), got {list(weight.shape)}"
        )
    return ops.grouped_matmul_ragged(hidden_states, weight, expert_start_indices, expert_ids, expert_usage_stats_host)
