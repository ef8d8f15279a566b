"""Neural-network layers (``max.nn``).

The graph-API layers build graph ops inside ``with Graph(...)``: `Module` /
`Layer` and containers, `Linear` (+ GGUF/GPTQ/float8), `StackedLinear`, `MLP`, `Embedding`,
norms, rotary embeddings (``rotary_embedding``), attention and the paged KV
cache (``attention``, ``kv_cache``), ``transformer``, ``kernels``, ``conv``,
``moe``, ``lora``, ``sampling``, ``hooks`` and the tensor-parallel layers.
``maxfx.nn.module_v3`` is the eager Module API (the same classes as
``maxfx.experimental.nn``).

Example:
    >>> from maxfx import nn
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph import DeviceRef
    >>> mlp = nn.MLP(DType.float32, None, 8, 32, [DeviceRef.CPU()])
    >>> sorted(mlp.state_dict())
    ['down_proj.weight', 'gate_proj.weight', 'up_proj.weight']
"""

from maxfx.nn import (
    activation,
    attention,
    clamp,
    comm,
    conv,
    conv_transpose,
    embedding,
    float8_config,
    hooks,
    identity,
    kernels,
    kv_cache,
    layer,
    linear,
    lora,
    module_v3,
    moe,
    norm,
    quant_config,
    rotary_embedding,
    sampling,
    sequential,
    stacked_linear,
    transformer,
)
from maxfx.nn._basic import MLP, Embedding, LayerNorm, Linear, RMSNorm, Sequential
from maxfx.nn._gptq import GPTQLinear
from maxfx.nn._identity import Identity
from maxfx.nn._layer import Layer, LayerList, Module, Shardable, add_layer_hook, clear_hooks, recursive_named_layers
from maxfx.nn._norm_layers import ConstantLayerNorm, GroupNorm
from maxfx.nn._parallel import ColumnParallelLinear, DistributedGemmConfig, VocabParallelEmbedding
from maxfx.nn._v1 import MLPV1, EmbeddingV1, GPTQLinearV1, LayerNormV1, LinearV1, QLinearV1, RMSNormV1
from maxfx.nn.attention import AttentionWithRope, MultiheadAttention, RaggedAttention
from maxfx.nn.comm import Allreduce, Signals
from maxfx.nn.conv import *  # noqa: F403
from maxfx.nn.conv_transpose import *  # noqa: F403
from maxfx.nn.float8_config import *  # noqa: F403 - float8 specs and parse_float8_config
from maxfx.nn.hooks import PrintHook
from maxfx.nn.kv_cache import KVCacheParams, KVCacheStrategy, PagedCacheValues, PagedKVCacheManager
from maxfx.nn.lora import *  # noqa: F403 - AttentionWithRopeAndLoRA, LinearLoRA, SupportsLoRA
from maxfx.nn.moe import *  # noqa: F403 - MoE, MoEFp8, MoEGate
from maxfx.nn.quant_config import *  # noqa: F403 - QuantConfig, QuantFormat, InputScaleSpec, WeightScaleSpec, ScaleGranularity, ScaleOrigin
from maxfx.nn.rotary_embedding import *  # noqa: F403 - RoPE layers and scaling params
from maxfx.nn.sampling import *  # noqa: F403
from maxfx.nn.stacked_linear import StackedLinear
from maxfx.nn.transformer import (
    DistributedTransformer,
    DistributedTransformerBlock,
    ReturnLogits,
    Transformer,
    TransformerBlock,
)

EmbeddingV2 = Embedding
"""Seed 002's example name for `Embedding` (API_INVENTORY §6 #8)."""

__all__ = [
    "activation",
    "identity",
    "attention",
    "kv_cache",
    "transformer",
    "AttentionWithRope",
    "MultiheadAttention",
    "RaggedAttention",
    "KVCacheParams",
    "KVCacheStrategy",
    "PagedCacheValues",
    "PagedKVCacheManager",
    "DistributedTransformer",
    "DistributedTransformerBlock",
    "ReturnLogits",
    "Transformer",
    "TransformerBlock",
    *float8_config.__all__,
    *lora.__all__,
    *moe.__all__,
    "Allreduce",
    "ColumnParallelLinear",
    "DistributedGemmConfig",
    "GPTQLinear",
    "Signals",
    "VocabParallelEmbedding",
    "comm",
    "float8_config",
    "kernels",
    "lora",
    "moe",
    *rotary_embedding.__all__,
    *conv.__all__,
    *conv_transpose.__all__,
    "conv",
    "conv_transpose",
    *sampling.__all__,
    "PrintHook",
    "hooks",
    "sampling",
    "rotary_embedding",
    "ConstantLayerNorm",
    "EmbeddingV1",
    "GPTQLinearV1",
    "GroupNorm",
    "LayerNormV1",
    "LinearV1",
    "MLPV1",
    "QLinearV1",
    "RMSNormV1",
    "Embedding",
    "Identity",
    "EmbeddingV2",
    "Layer",
    "LayerList",
    "LayerNorm",
    "Linear",
    "MLP",
    "Module",
    "RMSNorm",
    "Sequential",
    "Shardable",
    "add_layer_hook",
    "clamp",
    "clear_hooks",
    "embedding",
    "layer",
    "linear",
    "module_v3",
    "norm",
    "quant_config",
    *quant_config.__all__,
    "recursive_named_layers",
    "sequential",
    "stacked_linear",
    "StackedLinear",
]
