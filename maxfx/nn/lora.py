"""``max.nn.lora``: layers that add per-request LoRA adapters to their output.

A batch mixes requests that use different adapters (or none). The caller
describes it with `set_lora_batch_info`: ``lora_ids [groups]`` (adapter slot of
each group of rows, < 0 for none), ``lora_ranks [groups]`` and
``lora_grouped_offsets [groups + 1]`` (row prefix sums; rows after the last
offset use no adapter). `LinearLoRA.apply_lora` then computes
``x @ W.T + b + (x @ A[id].T)[:, :rank] @ B[id].T (+ lora_bias[id])`` per group
with the SGMV kernels. `AttentionWithRopeAndLoRA` puts `LinearLoRA` adapters on
the Q/K/V projections of `AttentionWithRope` (over the paged KV cache).

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph import DeviceRef
    >>> lin = LinearLoRA(8, 4, max_num_loras=3, max_lora_rank=2, dtype=DType.float32, device=DeviceRef.CPU())
    >>> sorted(lin.state_dict())
    ['lora_A', 'lora_B', 'weight']
"""

from __future__ import annotations

from maxfx.nn._lora_attention import AttentionWithRopeAndLoRA
from maxfx.nn._lora_linear import LinearLoRA, SupportsLoRA

__all__ = ["AttentionWithRopeAndLoRA", "SupportsLoRA", "LinearLoRA"]
