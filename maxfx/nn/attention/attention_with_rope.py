"""``max.nn.attention.attention_with_rope``: an opaque KV Cache optimized attention mechanism with Rope."""

from maxfx.nn.attention._rope_attention import (
    Allreduce,
    AttentionWithRope,
    AttentionWithRopeNoOpaque,
    DataParallelAttentionWithRope,
    GGUFQAttentionWithRope,
    GPTQAttentionWithRope,
    TensorParallelAttentionWithRope,
    distribute_value,
)

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
