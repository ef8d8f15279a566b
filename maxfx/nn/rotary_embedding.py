"""``max.nn.rotary_embedding``: RoPE layers and their scaling parameters."""

from maxfx.nn._rope import (
    DeepseekYarnRopeScalingParams,
    DeepseekYarnRotaryEmbedding,
    DynamicRotaryEmbedding,
    LinearScalingParams,
    Llama3RopeScalingParams,
    Llama3RotaryEmbedding,
    LongRoPERotaryEmbedding,
    LongRoPEScalingParams,
    RotaryEmbedding,
    YarnRotaryEmbedding,
    YarnScalingParams,
)

__all__ = [
    "DeepseekYarnRopeScalingParams",
    "DeepseekYarnRotaryEmbedding",
    "DynamicRotaryEmbedding",
    "LinearScalingParams",
    "Llama3RopeScalingParams",
    "Llama3RotaryEmbedding",
    "LongRoPERotaryEmbedding",
    "LongRoPEScalingParams",
    "RotaryEmbedding",
    "YarnRotaryEmbedding",
    "YarnScalingParams",
]
