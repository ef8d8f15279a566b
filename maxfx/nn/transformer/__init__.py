"""``max.nn.transformer``: decoder stacks over ragged batches and the paged KV cache.

Example:
    >>> from maxfx.nn.transformer import ReturnLogits
    >>> ReturnLogits.LAST_TOKEN.value
    'last_token'
"""

from maxfx.nn.transformer import distributed_transformer, transformer
from maxfx.nn.transformer._distributed import (
    DistributedTransformer,
    DistributedTransformerBlock,
    ShardableCallable,
    distribute_value,
    forward_sharded_layers,
    take,
)
from maxfx.nn.transformer._sequential import forward_sequential_layers
from maxfx.nn.transformer._transformer import ReturnLogits, Transformer, TransformerBlock

__all__ = [
    "DistributedTransformer",
    "DistributedTransformerBlock",
    "ReturnLogits",
    "ShardableCallable",
    "Transformer",
    "TransformerBlock",
    "distribute_value",
    "distributed_transformer",
    "forward_sharded_layers",
    "forward_sequential_layers",
    "take",
    "transformer",
]
