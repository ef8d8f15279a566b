"""``max.nn.attention.multi_latent_attention``: DeepSeek's multi-latent attention over the paged latent cache."""

from maxfx.nn.attention._latent import (
    DataParallelLatentAttentionWithRope,
    LatentAttentionWithRope,
    TensorParallelLatentAttentionWithRope,
)

__all__ = ["DataParallelLatentAttentionWithRope", "LatentAttentionWithRope", "TensorParallelLatentAttentionWithRope"]
