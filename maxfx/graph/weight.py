"""Weights and their sharding (``max.graph.weight``).

Example:
    >>> from maxfx.graph.weight import Segment, ShardingStrategy
    >>> ShardingStrategy.segmented(2, axis=0, segments=(Segment.even(64), Segment.head_aware(8, 16))).sharded_axis
    0
"""

from maxfx.graph._weight import (
    Segment,
    ShardingStrategy,
    Weight,
    axiswise_sharding_strategy,
    col_sharding_strategy,
    gate_up_sharding_strategy,
    head_aware_col_sharding_strategy,
    replicate_sharding_strategy,
    row_sharding_strategy,
    segmented_sharding_strategy,
    stacked_qkv_sharding_strategy,
)

__all__ = [
    "Segment",
    "ShardingStrategy",
    "Weight",
    "axiswise_sharding_strategy",
    "col_sharding_strategy",
    "gate_up_sharding_strategy",
    "head_aware_col_sharding_strategy",
    "replicate_sharding_strategy",
    "row_sharding_strategy",
    "segmented_sharding_strategy",
    "stacked_qkv_sharding_strategy",
]
