"""``max.nn.attention.multihead_attention``: padded multi-head attention without a KV cache."""

from maxfx.nn.attention._other import MultiheadAttention

__all__ = ["MultiheadAttention"]
