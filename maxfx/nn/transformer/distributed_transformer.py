"""``max.nn.transformer.distributed_transformer``: the transformer split over several devices."""

from maxfx.nn.transformer._distributed import (
    DistributedTransformer,
    DistributedTransformerBlock,
    ShardableCallable,
    distribute_value,
    forward_sharded_layers,
    take,
)

__all__ = [
    "DistributedTransformer",
    "DistributedTransformerBlock",
    "ShardableCallable",
    "distribute_value",
    "forward_sharded_layers",
    "take",
]
