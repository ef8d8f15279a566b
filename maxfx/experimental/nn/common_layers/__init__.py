"""``max.experimental.nn.common_layers``: shared building blocks of eager (module_v3) models.

Submodules: ``activation``, ``mesh_axis`` (``TP``/``DP``), ``mlp``, ``moe``,
``kv_cache`` (the paged cache as distributed tensors) and
``multi_latent_attention`` (`LatentAttentionWithRope`).

Example:
    >>> from maxfx.experimental.nn.common_layers.activation import activation_function_from_name
    >>> activation_function_from_name("swish").__name__
    'silu'
"""

from maxfx.experimental.nn.common_layers import activation, kv_cache, multi_latent_attention
from maxfx.experimental.nn.common_layers.kv_cache import PagedCacheValues
from maxfx.experimental.nn.common_layers.multi_latent_attention import (
    LatentAttentionWithRope,
    MLAPrefillMetadata,
    tensor_parallel_latent_attention_with_rope,
)

__all__ = [
    "LatentAttentionWithRope",
    "MLAPrefillMetadata",
    "PagedCacheValues",
    "activation",
    "kv_cache",
    "multi_latent_attention",
    "tensor_parallel_latent_attention_with_rope",
]
