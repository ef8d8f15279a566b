"""Tensor-parallel layers: `ColumnParallelLinear`, `VocabParallelEmbedding`, `DistributedGemmConfig`.

Each device holds a slice of the weight; the per-device partial results are
combined with a collective (allgather of output columns, or an allreduce of
partial embeddings), so every device ends with the full result. In maxfx the
whole multi-device graph is one XLA program and the collectives are
``ops.allgather`` / `Allreduce` (device transfers plus adds).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import ShardingStrategy, Weight
from maxfx.nn._basic import Embedding, Linear
from maxfx.nn.comm import Allreduce

__all__ = ["ColumnParallelLinear", "VocabParallelEmbedding", "DistributedGemmConfig"]


@dataclass
class DistributedGemmConfig:
    """How a distributed GEMM runs: ``enable_matmul_allreduce`` fuses the matmul with its allreduce.

    XLA schedules a matmul and the following collective together on its own, so
    in maxfx both settings compute the same values; the flag tells layers which
    of MAX's two code paths to build.

    Example:
        >>> DistributedGemmConfig.generate()
        DistributedGemmConfig(enable_matmul_allreduce=False)
    """

    enable_matmul_allreduce: bool

    @staticmethod
    def generate() -> DistributedGemmConfig | None:
        """The default config: matmul+allreduce fusion off unless ``MAXFX_ENABLE_MATMUL_ALLREDUCE=1``."""
        return DistributedGemmConfig(
            enable_matmul_allreduce=os.environ.get("MAXFX_ENABLE_MATMUL_ALLREDUCE", "0") == "1"
        )


def _refs(devices: Sequence[Any], owner: str) -> list[DeviceRef]:
    refs = [DeviceRef.from_device(d) for d in devices]
    if not refs:
        raise ValueError(f"{owner} requires a non-empty devices argument (got no devices)")
    return refs


def _per_device(x: Any, devices: list[DeviceRef], owner: str) -> list[Any]:
    xs = list(x) if isinstance(x, (list, tuple)) else [x] * len(devices)
    if len(xs) != len(devices):
        raise ValueError(f"{owner}: expected one input per device ({len(devices)}), got {len(xs)}")
    return [ops.transfer_to(v, d) for v, d in zip(xs, devices)]


class ColumnParallelLinear(Linear):
    """`Linear` whose weight rows (output features) and bias are split over ``devices``.

    Device i computes ``y_i = x @ W_i.T + b_i``; the slices are gathered along
    the last axis, so each device gets ``y = x @ W.T + b``. An ``out_dim`` that
    does not divide gives the first devices one row more (as in MAX). ``tied_weight``
    (e.g. an embedding table for a tied LM head) replaces the layer's own weight.

    Example:
        >>> lin = ColumnParallelLinear(8, 4, DType.float32, [DeviceRef.CPU(0), DeviceRef.CPU(1)])
        >>> [list(s.weight.shape) for s in lin.distributed_linear_layers]
        [[2, 8], [2, 8]]
        >>> ys = lin(x, signal_buffers)  # doctest: +SKIP  (one [.., 4] result per device)
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        devices: Sequence[Any],
        tied_weight: Weight | None = None,
        **kwargs: Any,
    ):
        self.devices = _refs(devices, "ColumnParallelLinear")
        n = len(self.devices)
        if tied_weight is not None and (
            kwargs.get("quant_config") is not None or kwargs.get("float8_config") is not None or kwargs.get("has_bias")
        ):
            raise ValueError(
                "ColumnParallelLinear: float8 and bias are both unsupported by ColumnParallelLinear currently when a "
                "tied_weight is given "
                "(the tied weight has no scales or bias to shard); drop quant_config/float8_config and has_bias"
            )
        super().__init__(in_dim, out_dim, dtype, self.devices[0], **kwargs)
        if tied_weight is not None:
            if list(tied_weight.shape) != [out_dim, in_dim]:
                raise ValueError(
                    f"ColumnParallelLinear: tied_weight must be [{out_dim}, {in_dim}], got {list(tied_weight.shape)}"
                )
            self.set_shared_weight("weight", tied_weight)
        self.sharding_strategy = ShardingStrategy.rowwise(n)
        self.__dict__["distributed_linear_layers"] = self.shard(self.devices)

    def __call__(self, x: Any, signal_buffers: Sequence[Any] | None = None) -> list[Any]:  # type: ignore[override]
        """One full output per device; ``x`` is one tensor (used on every device) or one per device.

        With ``signal_buffers`` (one per device) the slices are combined by
        ``ops.allgather``; without, each device concatenates transferred slices.
        """
        xs = _per_device(x, self.devices, "ColumnParallelLinear")
        parts = [layer(v) for layer, v in zip(self.distributed_linear_layers, xs)]
        if len(parts) == 1:
            return parts
        if signal_buffers is not None:
            return ops.allgather(parts, signal_buffers, axis=-1)
        return [ops.concat([ops.transfer_to(p, d) for p in parts], axis=-1) for d in self.devices]


class VocabParallelEmbedding(Embedding):
    """`Embedding` whose vocabulary (rows) is split over ``devices``.

    Device i looks up the ids in its row range (others give zeros); an
    allreduce sums the partial results, so each device gets the full lookup.

    Example:
        >>> emb = VocabParallelEmbedding(10, 4, DType.float32, [DeviceRef.CPU(0), DeviceRef.CPU(1)])
        >>> outs = emb(ids, signal_buffers)  # doctest: +SKIP  (one [.., 4] per device)
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_dim: int,
        dtype: DType,
        devices: Sequence[Any],
        quantization_encoding: Any = None,
        name: str | None = None,
    ):
        self.devices = _refs(devices, "VocabParallelEmbedding")
        n = len(self.devices)
        if vocab_size % n:
            raise ValueError(f"VocabParallelEmbedding: vocab_size {vocab_size} must split evenly over {n} devices")
        if quantization_encoding is not None:
            raise ValueError(
                "VocabParallelEmbedding: quantized tables are not supported (their packed rows cannot be split per "
                "device)"
            )
        super().__init__(vocab_size, hidden_dim, dtype, self.devices[0], None, name)
        self.vocab_size, self.hidden_dim, self.shard_rows = int(vocab_size), int(hidden_dim), int(vocab_size) // n
        self.weight.sharding_strategy = ShardingStrategy.rowwise(n)
        self.__dict__["_shards"] = self.weight.shard(self.devices)
        self.__dict__["_allreduce"] = Allreduce(n)

    def _local_lookup(self, i: int, ids: Any) -> Any:
        local = ids.cast(DType.int64) - i * self.shard_rows
        inside = ops.logical_and(local >= 0, local < self.shard_rows)
        rows = ops.gather(self._shards[i], ops.where(inside, local, 0), axis=0)
        return rows * ops.unsqueeze(inside, -1).cast(rows.dtype)

    def __call__(self, indices: Any, signal_buffers: Sequence[Any] | None = None) -> list[Any]:  # type: ignore[override]
        """One ``[*indices.shape, hidden_dim]`` lookup per device."""
        ids = _per_device(indices, self.devices, "VocabParallelEmbedding")
        parts = [self._local_lookup(i, v) for i, v in enumerate(ids)]
        if len(parts) == 1:
            return parts
        if signal_buffers is None:
            return [Allreduce._sum_on(parts, d) for d in self.devices]
        return self._allreduce(parts, signal_buffers)
