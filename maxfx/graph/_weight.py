"""`Weight`: a named tensor whose value is supplied when the graph is loaded.

A Weight joins the graph that is being built the first time it is used, as an
argument of the compiled program (never a baked-in constant). Its value comes
from ``InferenceSession.load(graph, weights_registry={name: array})``.

Example:
    >>> w = Weight("w", DType.float32, [2, 2], DeviceRef.CPU())  # doctest: +SKIP
    >>> with Graph("g", input_types=[TensorType(DType.float32, [1, 2])]) as g:  # doctest: +SKIP
    ...     g.output(g.inputs[0] @ w)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lowering.dims import Dim, Shape, ShapeLike
from lowering.dtypes import DType
from lowering.types import DeviceRef, TensorType
from maxfx.graph._current import current_graph
from maxfx.graph._value import TensorValue

__all__ = ["Weight", "ShardingStrategy"]


@dataclass(frozen=True)
class ShardingStrategy:
    """How a weight splits across devices.

    Attributes:
        num_devices: number of shards.
        axis: the axis split evenly into ``num_devices`` parts, or None to
            replicate the whole weight on every device.
    """

    num_devices: int
    axis: int | None = 0

    @staticmethod
    def rowwise(num_devices: int) -> ShardingStrategy:
        """Split dim 0 (rows of a ``[out, in]`` Linear weight)."""
        return ShardingStrategy(num_devices, 0)

    @staticmethod
    def columnwise(num_devices: int) -> ShardingStrategy:
        """Split dim 1."""
        return ShardingStrategy(num_devices, 1)

    @staticmethod
    def replicate(num_devices: int) -> ShardingStrategy:
        """Every device holds the whole weight."""
        return ShardingStrategy(num_devices, None)

    @property
    def is_replicate(self) -> bool:
        """True when the weight is copied, not split."""
        return self.axis is None

    def shard_shape(self, shape: Sequence[Dim], name: str) -> list[Dim]:
        if self.axis is None:
            return list(shape)
        dims = list(shape)
        n = int(dims[self.axis])
        if n % self.num_devices:
            raise ValueError(f"Weight {name!r}: dim {self.axis} of size {n} does not split evenly over {self.num_devices} devices")
        dims[self.axis] = Dim(n // self.num_devices)
        return dims


class Weight(TensorValue):
    """A named weight tensor (a `TensorValue` in whichever graph is being built).

    Args:
        name: key of the value in ``weights_registry``.
        dtype, shape, device: its type (uint8 bytes for quantized encodings).
        quantization_encoding: a `QuantizationEncoding` for packed weights.
        align: required byte alignment of the supplied value.
        sharding_strategy: a `ShardingStrategy`, needed by `shard`.
    """

    __slots__ = (
        "name",
        "_dtype",
        "_shape",
        "_device",
        "quantization_encoding",
        "align",
        "_sharding_strategy",
        "shard_idx",
        "_placeholder",
        "_has_alias",
        "_original",
        "_shard_of",
        "_loaded_value",  # set by nn.Module.load_state_dict
    )

    def __init__(
        self,
        name: str,
        dtype: DType,
        shape: ShapeLike,
        device: Any = None,
        quantization_encoding: Any = None,
        align: int | None = None,
        sharding_strategy: ShardingStrategy | None = None,
        _placeholder: bool = False,
        _has_alias: bool = False,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"Weight: name must be a non-empty string, got {name!r}")
        if not isinstance(dtype, DType):
            raise TypeError(f"Weight {name!r}: dtype must be a DType, got {type(dtype).__name__}")
        self.name = name
        self._dtype = dtype
        self._shape = Shape(shape)
        self._device = DeviceRef.from_device(device) if device is not None else DeviceRef.CPU()
        self.quantization_encoding = quantization_encoding
        self.align = align
        self._sharding_strategy = sharding_strategy
        self.shard_idx: int | None = None
        self._placeholder = _placeholder
        self._has_alias = _has_alias
        self._original: tuple[DType, Shape] | None = None
        self._shard_of: tuple[Weight, int] | None = None
        self._loaded_value: Any = None

    # The graph value is resolved against whichever graph is active.
    @property
    def _value(self) -> TensorValue:
        graph = current_graph()
        if graph is None:
            raise RuntimeError(f"Weight {self.name!r} used outside a graph: build ops inside `with Graph(...)`")
        return graph.add_weight(self)

    @property
    def _var(self):  # type: ignore[override]
        return self._value._var

    @property
    def _builder(self):  # type: ignore[override]
        return self._value._builder

    @property
    def __lowering_context__(self):
        return self._value._builder

    def _weight_type(self) -> TensorType:
        return TensorType(self._dtype, self._shape, self._device)

    @property
    def type(self) -> TensorType:
        """``TensorType(dtype, shape, device)`` of the weight."""
        return self._weight_type()

    @property
    def dtype(self) -> DType:
        """Element type (uint8 for quantized weights)."""
        return self._dtype

    @property
    def shape(self) -> Shape:
        """Shape (of this shard, for a sharded weight)."""
        return self._shape

    @property
    def device(self) -> DeviceRef:
        """Device the weight is placed on."""
        return self._device

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """How `shard` splits the weight (None: not shardable)."""
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy | None) -> None:
        self._sharding_strategy = strategy

    @property
    def original_dtype_and_shape(self) -> tuple[DType, Shape]:
        """dtype and shape before quantization (equal to dtype/shape when not quantized)."""
        return self._original if self._original is not None else (self._dtype, self._shape)

    def shard(self, devices: Sequence[Any]) -> list[Weight]:
        """Per-device views of this weight following its `sharding_strategy`."""
        strategy = self._sharding_strategy
        if strategy is None:
            raise ValueError(f"Weight {self.name!r}: set sharding_strategy before calling shard()")
        if self._shard_of is not None:
            raise ValueError(f"Weight {self.name!r}: is already a shard and cannot be re-sharded")
        devices = list(devices)
        if len(devices) != strategy.num_devices:
            raise ValueError(f"Weight {self.name!r}: strategy has {strategy.num_devices} shards but {len(devices)} devices were given")
        shape = strategy.shard_shape(self._shape, self.name)
        out = []
        for i, dev in enumerate(devices):
            w = Weight(self.name, self._dtype, shape, dev, self.quantization_encoding, self.align, strategy)
            w.shard_idx = i
            w._shard_of = (self, i)
            out.append(w)
        return out

    def __repr__(self) -> str:
        return f"Weight({self.name!r}, dtype={self._dtype.name}, shape={list(self._shape)!r}, device={self._device})"

    __hash__ = object.__hash__


def weight_params(weight: Weight) -> dict[str, Any]:
    """Params of the ``weight`` node recording ``weight`` (incl. shard slicing)."""
    params: dict[str, Any] = {"name": weight.name, "type": weight._weight_type()}
    if weight._shard_of is not None and weight._sharding_strategy is not None and weight._sharding_strategy.axis is not None:
        params["shard"] = (weight._sharding_strategy.axis, weight._shard_of[1], weight._sharding_strategy.num_devices)
    return params


WeightLookup = Callable[[str], Any]
