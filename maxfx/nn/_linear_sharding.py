"""How a `Linear` splits over devices: its weight, bias and float8 scales.

Setting ``Linear.sharding_strategy`` gives the weight that strategy and picks
matching strategies for the other tensors (`set_linear_strategy`), as MAX does:

* bias: split like the output rows when the weight's rows are split (rowwise,
  stacked QKV, ...); otherwise whole. When the weight's *columns* are split
  (columnwise, head-aware columnwise) every device computes a partial sum that
  an allreduce adds up, so only device 0 keeps the bias (`shard_linear`).
* weight_scale: a per-tensor scale is replicated (and shared, it is a scalar
  on the CPU); a row-wise scale ``[out, 1]`` follows a row split and is
  replicated under a column split; a block scale ``[out/bn, in/bk]`` is split
  along the same axis in blocks (head-aware in heads of blocks when a head is
  a whole number of blocks).
* input_scale: a scalar, shared by every shard.

Example:
    >>> lin = Linear(8, 6, DType.float32, DeviceRef.CPU(), has_bias=True)  # doctest: +SKIP
    >>> lin.sharding_strategy = ShardingStrategy.columnwise(2)  # doctest: +SKIP
    >>> [s.bias is not None for s in lin.shard([DeviceRef.CPU(), DeviceRef.CPU()])]  # doctest: +SKIP
    [True, False]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lowering.types import DeviceRef
from maxfx.graph._weight import ShardingStrategy, _split

__all__ = ["bias_strategy", "set_linear_strategy", "shard_linear", "splits_columns", "splits_rows"]


def splits_columns(strategy: ShardingStrategy) -> bool:
    """True when the weight's input features (dim 1) are split: each device's output is a partial sum."""
    return strategy.sharded_axis == 1


def splits_rows(strategy: ShardingStrategy) -> bool:
    """True when the weight's output features (dim 0) are split."""
    return strategy.sharded_axis == 0


def _block_scale_strategy(layer: Any, strategy: ShardingStrategy) -> ShardingStrategy:
    scale, n = layer.weight_scale, strategy.num_devices
    bn, bk = layer.quant_config.weight_scale.block_size
    if splits_rows(strategy) and not strategy.is_rowwise:
        raise ValueError(
            f"Linear: block-wise float8 scales follow only a rowwise or columnwise weight split, got a {strategy.kind} "
            "strategy"
        )
    if strategy.is_rowwise or strategy.is_colwise or strategy.is_head_aware_colwise:
        axis = 0 if strategy.is_rowwise else 1
        blocks = int(scale.shape[axis])
        if blocks % n:
            extra = "" if axis == 0 else " with columnwise weight sharding"
            raise ValueError(
                f"Weight scale dim {axis} ({blocks}) is not divisible by the number of devices ({n}) for block-wise "
                f"scaling{extra}."
            )
        if not strategy.is_head_aware_colwise:
            # The weight's split must land on block edges, or a shard's scales would cover another shard's rows.
            size, block = int(layer.weight.shape[axis]), (bn if axis == 0 else bk)
            starts = [_split(size, i, n)[0] for i in range(n)]
            if any(start % block for start in starts):
                raise ValueError(
                    f"Linear: splitting weight dim {axis} ({size}) over {n} devices starts shards at {starts}, which "
                    f"are not all multiples of the float8 block size {block}"
                )
            return strategy
        if strategy.head_dim % bk == 0:  # heads are whole blocks: split the scale by heads of blocks
            return ShardingStrategy.head_aware_columnwise(n, strategy.num_heads, strategy.head_dim // bk)
        return ShardingStrategy.columnwise(n)
    return strategy


def _weight_scale_strategy(layer: Any, strategy: ShardingStrategy) -> ShardingStrategy:
    spec, n = layer.quant_config.weight_scale, strategy.num_devices
    if spec.is_tensor:
        return ShardingStrategy.replicate(n)
    if spec.is_rowwise:  # [out, 1]: one scale per output row
        return ShardingStrategy.replicate(n) if splits_columns(strategy) else strategy
    if spec.is_colwise:  # [1, in]: one scale per input column
        return strategy if splits_columns(strategy) else ShardingStrategy.replicate(n)
    return _block_scale_strategy(layer, strategy)


def bias_strategy(strategy: ShardingStrategy) -> ShardingStrategy:
    # A 1-D bias is split along axis 0 exactly as the weight's rows (stacked QKV by heads alike).
    return strategy if splits_rows(strategy) else ShardingStrategy.replicate(strategy.num_devices)


def set_linear_strategy(layer: Any, strategy: ShardingStrategy) -> None:
    """Give ``layer.weight`` ``strategy`` and its bias / weight_scale the matching ones.

    Raises:
        ValueError: a block-wise scale cannot follow the split (MAX's
            ``not divisible by the number of devices (N)``).
    """
    if not isinstance(strategy, ShardingStrategy):
        raise TypeError(f"Linear.sharding_strategy must be a ShardingStrategy, got {type(strategy).__name__}")
    scale_strategy = _weight_scale_strategy(layer, strategy) if layer.weight_scale is not None else None
    layer.weight.sharding_strategy = strategy
    if scale_strategy is not None:
        layer.weight_scale.sharding_strategy = scale_strategy
    if layer.bias is not None:
        layer.bias.sharding_strategy = bias_strategy(strategy)


def shard_linear(layer: Any, devices: Iterable[Any], make: Any) -> list[Any]:
    """One `Linear` per device holding its shards; ``make(**kwargs)`` builds an empty one.

    Raises:
        ValueError: ``layer`` has no sharding strategy.
    """
    strategy = layer.weight.sharding_strategy
    if strategy is None:
        raise ValueError("Linear layer cannot be sharded because no sharding strategy was provided.")
    devices = [DeviceRef.from_device(d) if d is not None else DeviceRef.CPU() for d in devices]
    weights = layer.weight.shard(devices)
    biases = layer.bias.shard(devices) if layer.bias is not None else [None] * len(devices)
    scale = layer.weight_scale
    scales = scale.shard(devices) if scale is not None and len(scale.shape) > 0 else [scale] * len(devices)
    full_cols = int(layer.weight.shape[1])
    out = []
    for i, (device, weight) in enumerate(zip(devices, weights)):
        rows, cols = int(weight.shape[0]), int(weight.shape[1])
        shard = make(
            in_dim=layer.in_dim * cols // full_cols,  # packed (GGUF) columns scale with the logical ones
            out_dim=rows,
            dtype=weight.dtype,
            device=device,
            has_bias=layer.bias is not None,
            quantization_encoding=layer.quantization_encoding,
            quant_config=layer.quant_config,
            clip_weight=layer.clip_weight,
            is_sharding=True,
        )
        shard.weight = weight
        # Column splits give partial sums that an allreduce adds: the bias must be added once.
        shard.bias = None if (splits_columns(strategy) and i > 0) else biases[i]
        shard.weight_scale = scales[i]
        shard.input_scale = layer.input_scale  # a scalar on the CPU, shared
        out.append(shard)
    return out
