"""``max.nn.attention``: attention layers over ragged batches and the paged KV cache.

`AttentionWithRope` is Llama's attention (fused QKV projection writing the
cache, RoPE, causal flash attention, ``o_proj``); `RaggedAttention` drops RoPE;
`MultiheadAttention` works on padded batches without a cache; the latent
(MLA), quantized and distributed variants follow MAX's names.

Example:
    >>> from maxfx.nn.attention import MultiheadAttention
    >>> MultiheadAttention(num_attention_heads=2, hidden_size=8).head_dim
    4
"""

from maxfx.nn.attention import (
    attention_with_rope,
    interfaces,
    mask_config,
    multi_latent_attention,
    multihead_attention,
    ragged_attention,
)
from maxfx.nn.attention._attention_without_rope import MultiheadAttention, RaggedAttention
from maxfx.nn.attention._latent import (
    DataParallelLatentAttentionWithRope,
    LatentAttentionWithRope,
    TensorParallelLatentAttentionWithRope,
)
from maxfx.nn.attention._rope_attention import (
    AttentionWithRope,
    AttentionWithRopeNoOpaque,
    DataParallelAttentionWithRope,
    GGUFQAttentionWithRope,
    GPTQAttentionWithRope,
    distribute_value,
    num_heads_for_device,
)
from maxfx.nn.attention.attention_with_rope import TensorParallelAttentionWithRope
from maxfx.nn.attention.interfaces import DistributedAttentionImpl
from maxfx.nn.attention.mask_config import (
    AttentionMaskVariant,
    MHAMaskConfig,
    MHAMaskVariant,
    PositionalEncodingVariant,
)

__all__ = [
    "AttentionMaskVariant",
    "AttentionWithRope",
    "AttentionWithRopeNoOpaque",
    "DataParallelAttentionWithRope",
    "DataParallelLatentAttentionWithRope",
    "LatentAttentionWithRope",
    "TensorParallelLatentAttentionWithRope",
    "multi_latent_attention",
    "DistributedAttentionImpl",
    "GGUFQAttentionWithRope",
    "GPTQAttentionWithRope",
    "MHAMaskConfig",
    "MHAMaskVariant",
    "MultiheadAttention",
    "PositionalEncodingVariant",
    "RaggedAttention",
    "TensorParallelAttentionWithRope",
    "attention_with_rope",
    "distribute_value",
    "interfaces",
    "mask_config",
    "multihead_attention",
    "num_heads_for_device",
    "ragged_attention",
]
