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

__all__ = [
    "AttentionWithRope",
    "AttentionWithRopeNoOpaque",
    "DataParallelAttentionWithRope",
    "GGUFQAttentionWithRope",
    "GPTQAttentionWithRope",
    "TensorParallelAttentionWithRope",
    "distribute_value",
]
