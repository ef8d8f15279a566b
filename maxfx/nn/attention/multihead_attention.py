"""``max.nn.attention.multihead_attention``: padded multi-head attention without a KV cache."""

from maxfx.nn.attention._attention_without_rope import MultiheadAttention

__all__ = ["MultiheadAttention"]
