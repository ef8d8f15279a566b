"""``max.nn.attention.attention_with_rope``: an opaque KV Cache optimized attention mechanism with Rope."""

from maxfx.nn.attention._rope_attention import (
    AttentionWithRope,
    AttentionWithRopeNoOpaque,
    DataParallelAttentionWithRope,
    GGUFQAttentionWithRope,
    GPTQAttentionWithRope,
    TensorParallelAttentionWithRope,
    distribute_value,
)
from maxfx.nn.comm import Allreduce

__all__ = [
    "Allreduce",
    "AttentionWithRope",
    "AttentionWithRopeNoOpaque",
    "DataParallelAttentionWithRope",
    "GGUFQAttentionWithRope",
    "GPTQAttentionWithRope",
    "TensorParallelAttentionWithRope",
    "distribute_value",
]
