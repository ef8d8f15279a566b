"""The routed experts of a Mixture of Experts, written once over ``maxfx.graph.ops`` for both module APIs.

The graph `maxfx.nn.MoE` (and `MoEFp8`) and the eager
`maxfx.experimental.nn.common_layers.moe.MoE` keep their own routers, weights
and placement, and call `routed_experts` with the router's choice: on graph
values it records graph ops, on eager Tensors it runs.

Example:
    >>> from maxfx.driver import CPU
    >>> from maxfx.experimental.tensor import Tensor
    >>> from maxfx.nn.kernels import grouped_matmul_ragged
    >>> gate_up, down = Tensor.ones([2, 8, 3]), Tensor.ones([2, 3, 4])
    >>> matmul = lambda rows, which, groups: grouped_matmul_ragged(rows, gate_up if which == "gate_up" else down,
    ...     *groups)
    >>> idx, w = Tensor([[0], [1]], dtype=DType.int32), Tensor([[1.0], [1.0]])
    >>> routed_experts(Tensor.ones([2, 3]), idx, w, 2, matmul, moe_dim=4, host=CPU()).shape
    [Dim(2), Dim(3)]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.nn.kernels._moe import moe_create_indices

__all__ = ["routed_experts"]


def routed_experts(
    x: Any,
    topk_indices: Any,
    topk_weights: Any,
    num_experts: int,
    expert_matmul: Callable[[Any, str, tuple[Any, Any, Any]], Any],
    *,
    moe_dim: int,
    host: Any,
    apply_router_weight_first: bool = False,
    sum_dtype: DType | None = None,
) -> Any:
    """The routed experts' output for ``x [tokens, hidden]``: ``[tokens, hidden]`` in ``x``'s dtype.

    Tokens are sorted by expert (``moe_create_indices``); ``expert_matmul(rows,
    which, groups)`` multiplies each expert's rows by its ``"gate_up"`` weights
    (gate rows then up rows, ``2 * moe_dim`` wide) or its ``"down"`` weights
    (``groups``: the expert starts, ids and host-side counts the grouped
    matmuls take), with ``silu(gate) * up`` between the two; the results go
    back to token order and are summed weighted by ``topk_weights [tokens, k]``
    (the inputs are scaled instead with ``apply_router_weight_first``).
    ``sum_dtype`` is the dtype of that weighted sum (None: the experts'
    output dtype); ``host`` the device that holds the counts.
    """
    seq_len, k = x.shape[0], int(topk_indices.shape[-1])
    order, starts, restore, ids, stats = moe_create_indices(
        ops.cast(ops.reshape(topk_indices, [-1]), DType.int32), num_experts
    )
    order = ops.cast(order, DType.int32)
    states = ops.gather(x, order // k, axis=0)
    if apply_router_weight_first:
        states = states * ops.cast(ops.gather(ops.reshape(topk_weights, [-1, 1]), order, axis=0), x.dtype)
    groups = (starts, ids, stats.to(host))  # the kernel reads the group sizes on the host
    gate_up = expert_matmul(states, "gate_up", groups)
    down = expert_matmul(ops.silu(gate_up[:, :moe_dim]) * gate_up[:, moe_dim:], "down", groups)
    down = ops.reshape(ops.gather(down, ops.cast(restore, DType.int32), axis=0), [seq_len, k, -1])
    down = down if sum_dtype is None else ops.cast(down, sum_dtype)
    if apply_router_weight_first:
        out = ops.sum(down, axis=1)  # [tokens, 1, hidden]
    else:
        out = ops.unsqueeze(ops.cast(topk_weights, down.dtype), 1) @ down  # [tokens, 1, k] @ [tokens, k, hidden]
    return ops.cast(ops.squeeze(out, 1), x.dtype)
