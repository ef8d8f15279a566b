"""``max.nn.attention.ragged_attention``: cache attention with the mask variant inside the kernel."""

from maxfx.nn.attention._attention_without_rope import RaggedAttention

__all__ = ["RaggedAttention"]
