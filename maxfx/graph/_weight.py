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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from lowering.dims import Dim, Shape, ShapeLike
from lowering.dtypes import DType
from lowering.types import DeviceRef, TensorType
from maxfx.graph import ops
from maxfx.graph._current import current_graph
from maxfx.graph._value import TensorValue

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


@dataclass(frozen=True)
class Segment:
    """One contiguous block of a weight axis for `segmented_sharding_strategy`.

    Attributes:
        size: number of elements of the block along the sharded axis.
        num_heads: None for an *even* block (its elements split evenly, the
            first ``size % num_devices`` devices get one more); otherwise the
            block is ``num_heads`` heads of ``size // num_heads`` elements and
            whole heads are split over devices the same way.
    """

    size: int
    num_heads: int | None = None

    @staticmethod
    def even(size: int) -> Segment:
        """A block of ``size`` elements split evenly over the devices."""
        return Segment(int(size))

    @staticmethod
    def head_aware(num_heads: int, head_dim: int) -> Segment:
        """A block of ``num_heads`` heads of ``head_dim`` elements, split by whole heads."""
        return Segment(int(num_heads) * int(head_dim), int(num_heads))

    def _part(self, i: int, num_devices: int) -> tuple[int, int]:
        """(start, length) of device ``i``'s part of this block."""
        if self.num_heads is None:
            return _split(self.size, i, num_devices)
        head_dim = self.size // self.num_heads
        start, n = _split(self.num_heads, i, num_devices)
        return start * head_dim, n * head_dim


def _split(total: int, i: int, num_devices: int) -> tuple[int, int]:
    """(start, length) of part ``i`` of ``total`` items over ``num_devices``: the
    first ``total % num_devices`` parts have one item more (MAX's uneven split)."""
    if not 0 <= i < num_devices:
        raise ValueError(f"shard index {i} is out of range for {num_devices} devices")
    base, rem = divmod(total, num_devices)
    return i * base + min(i, rem), base + (1 if i < rem else 0)


# Kinds whose shards are one slice along `axis` (what `Weight.shard` binds at load time).
_AXIS_KINDS = ("rowwise", "columnwise", "axiswise")


@dataclass(frozen=True)
class ShardingStrategy:
    """How a weight splits across devices.

    Build one with a factory (`rowwise`, `columnwise`, `axiswise`, `replicate`,
    `stacked_qkv`, `head_aware_columnwise`, `gate_up`, `segmented`,
    `tensor_parallel`, `expert_parallel`), or pass your own ``shard`` function
    ``(weight, i, num_devices) -> TensorValue``. Calling the strategy,
    ``strategy(weight, i)``, gives shard ``i`` of ``weight`` in the graph being built.

    Attributes:
        num_devices: number of shards.
        axis: the axis that is split (None: not split along one axis).
        kind: which factory made it (``"custom"`` for a ``shard`` function).
        num_heads, head_dim: heads of the head-aware kinds.
        segments: the blocks of a segmented strategy.
        shard: the function computing one shard.

    Example:
        >>> ShardingStrategy.rowwise(4).is_rowwise, ShardingStrategy.replicate(4).sharded_axis
        (True, None)
    """

    num_devices: int
    axis: Any = 0
    kind: str = ""
    num_heads: int | None = None
    head_dim: int | None = None
    segments: tuple[Segment, ...] = ()
    shard: Callable[..., TensorValue] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        axis, kind, shard = self.axis, self.kind, self.shard
        if callable(axis):  # MAX's positional form ShardingStrategy(num_devices, shard)
            axis, shard, kind = None, axis, "custom"
        if not kind:
            if shard is not None:
                kind = "custom"
            else:
                kind = {None: "replicate", 0: "rowwise", 1: "columnwise"}.get(axis, "axiswise")
        if shard is None:
            shard = self._builtin_shard(kind)
        object.__setattr__(self, "axis", axis)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "shard", shard)

    def _builtin_shard(self, kind: str) -> Callable[..., TensorValue]:
        if kind == "replicate":
            return replicate_sharding_strategy
        if kind in _AXIS_KINDS:
            return partial(axiswise_sharding_strategy, axis=self.axis)
        if kind == "stacked_qkv":
            return partial(stacked_qkv_sharding_strategy, num_heads=self.num_heads, head_dim=self.head_dim)
        if kind == "head_aware_columnwise":
            return partial(head_aware_col_sharding_strategy, num_heads=self.num_heads, head_dim=self.head_dim)
        if kind == "gate_up":
            return partial(gate_up_sharding_strategy, axis=self.axis)
        if kind == "segmented":
            return partial(segmented_sharding_strategy, axis=self.axis, segments=self.segments)
        return _module_level_shard(kind)

    def __call__(self, weight: Weight, i: int) -> TensorValue:
        """Shard ``i`` of ``weight`` as a value of the graph being built."""
        return self.shard(weight, i, self.num_devices)

    # -- factories -----------------------------------------------------------
    @staticmethod
    def rowwise(num_devices: int) -> ShardingStrategy:
        """Split dim 0 (rows of a ``[out, in]`` Linear weight); uneven sizes give the first devices one row more."""
        return ShardingStrategy(num_devices, 0, "rowwise")

    @staticmethod
    def columnwise(num_devices: int) -> ShardingStrategy:
        """Split dim 1."""
        return ShardingStrategy(num_devices, 1, "columnwise")

    @staticmethod
    def axiswise(axis: int, num_devices: int) -> ShardingStrategy:
        """Split dim ``axis``."""
        return ShardingStrategy(num_devices, axis, "axiswise")

    @staticmethod
    def replicate(num_devices: int) -> ShardingStrategy:
        """Every device holds the whole weight."""
        return ShardingStrategy(num_devices, None, "replicate")

    @staticmethod
    def stacked_qkv(num_devices: int, num_heads: int, head_dim: int) -> ShardingStrategy:
        """Split a stacked ``[3 * num_heads * head_dim, ...]`` QKV weight by heads (Q, K and V alike)."""
        return ShardingStrategy(num_devices, 0, "stacked_qkv", num_heads, head_dim)

    @staticmethod
    def head_aware_columnwise(num_devices: int, num_heads: int, head_dim: int) -> ShardingStrategy:
        """Split dim 1 by whole heads (an attention output projection)."""
        return ShardingStrategy(num_devices, 1, "head_aware_columnwise", num_heads, head_dim)

    @staticmethod
    def gate_up(num_devices: int, axis: int = 2) -> ShardingStrategy:
        """Split each half of a fused ``[gate | up]`` axis evenly (the halves stay paired on each device)."""
        return ShardingStrategy(num_devices, axis, "gate_up")

    @staticmethod
    def segmented(num_devices: int, axis: int, segments: Sequence[Segment]) -> ShardingStrategy:
        """Split each `Segment` of ``axis`` on its own and concatenate the parts."""
        return ShardingStrategy(num_devices, axis, "segmented", segments=tuple(segments))

    @staticmethod
    def tensor_parallel(num_devices: int) -> ShardingStrategy:
        """Module-level tensor parallelism (a module splits its own weights)."""
        return ShardingStrategy(num_devices, None, "tensor_parallel")

    @staticmethod
    def expert_parallel(num_devices: int) -> ShardingStrategy:
        """Module-level expert parallelism (MoE experts spread over devices)."""
        return ShardingStrategy(num_devices, None, "expert_parallel")

    # -- predicates ------------------------------------------------------------
    @property
    def is_rowwise(self) -> bool:
        """True for `rowwise`."""
        return self.kind == "rowwise"

    @property
    def is_colwise(self) -> bool:
        """True for `columnwise` (not `head_aware_columnwise`)."""
        return self.kind == "columnwise"

    @property
    def is_replicate(self) -> bool:
        """True when the weight is copied, not split."""
        return self.kind == "replicate"

    @property
    def is_stacked_qkv(self) -> bool:
        """True for `stacked_qkv`."""
        return self.kind == "stacked_qkv"

    @property
    def is_head_aware_colwise(self) -> bool:
        """True for `head_aware_columnwise`."""
        return self.kind == "head_aware_columnwise"

    @property
    def is_gate_up(self) -> bool:
        """True for `gate_up`."""
        return self.kind == "gate_up"

    @property
    def is_segmented(self) -> bool:
        """True for `segmented`."""
        return self.kind == "segmented"

    @property
    def is_tensor_parallel(self) -> bool:
        """True for `tensor_parallel`."""
        return self.kind == "tensor_parallel"

    @property
    def is_expert_parallel(self) -> bool:
        """True for `expert_parallel`."""
        return self.kind == "expert_parallel"

    @property
    def sharded_axis(self) -> int | None:
        """The axis a weight is split along (None: replicated, module-level or custom)."""
        if self.kind in ("replicate", "tensor_parallel", "expert_parallel", "custom"):
            return None
        return self.axis

    def shard_shape(self, shape: Sequence[Dim], name: str) -> list[Dim]:
        """Shape of each shard made by `Weight.shard` (an even split along `axis`)."""
        if self.kind == "replicate":
            return list(shape)
        if self.kind not in _AXIS_KINDS:
            raise ValueError(
                f"Weight {name!r}: Weight.shard supports rowwise/columnwise/axiswise/replicate strategies; "
                f"for {self.kind!r} call the strategy in the graph: strategy(weight, i)"
            )
        dims = list(shape)
        n = int(dims[self.axis])
        if n % self.num_devices:
            raise ValueError(f"Weight {name!r}: dim {self.axis} of size {n} does not split evenly over {self.num_devices} devices")
        dims[self.axis] = Dim(n // self.num_devices)
        return dims


def _module_level_shard(kind: str) -> Callable[..., TensorValue]:
    def shard(weight: Weight, i: int, num_devices: int) -> TensorValue:
        raise ValueError(f"ShardingStrategy.{kind} is a module-level strategy: the module shards its own weights, a single weight has no {kind} shard")

    return shard


# ─── shard functions: (weight, i, num_devices) -> shard i as a graph value ────


def _slice_axis(weight: Any, axis: int, parts: Sequence[tuple[int, int]]) -> TensorValue:
    """Concatenation along ``axis`` of the ``(start, length)`` slices of ``weight``."""
    value = weight._value if isinstance(weight, Weight) else weight
    rank = value.rank
    axis = axis % rank
    pieces = []
    for start, length in parts:
        index = [slice(None)] * rank
        index[axis] = slice(start, start + length)
        pieces.append(ops.slice_tensor(value, index))
    return pieces[0] if len(pieces) == 1 else ops.concat(pieces, axis=axis)


def replicate_sharding_strategy(weight: Weight, i: int, num_devices: int) -> TensorValue:
    """Every shard is the whole weight."""
    _split(num_devices, i, num_devices)  # checks the shard index
    return weight._value if isinstance(weight, Weight) else weight


def axiswise_sharding_strategy(weight: Weight, i: int, num_devices: int, axis: int) -> TensorValue:
    """Shard ``i`` of ``weight`` split along ``axis``; the first ``dim % num_devices`` shards get one element more."""
    dim = int(weight.shape[axis])
    return _slice_axis(weight, axis, [_split(dim, i, num_devices)])


def row_sharding_strategy(weight: Weight, i: int, num_devices: int) -> TensorValue:
    """Shard ``i`` of ``weight`` split along dim 0 (uneven sizes: the first shards get one row more).

    Example:
        >>> from maxfx.graph import Graph, DeviceRef
        >>> from maxfx.dtype import DType
        >>> with Graph("rows"):
        ...     w = Weight("w", DType.float32, [10, 4], DeviceRef.CPU())
        ...     [int(row_sharding_strategy(w, i, 3).shape[0]) for i in range(3)]
        [4, 3, 3]
    """
    return axiswise_sharding_strategy(weight, i, num_devices, 0)


def col_sharding_strategy(weight: Weight, i: int, num_devices: int) -> TensorValue:
    """Shard ``i`` of ``weight`` split along dim 1 (uneven sizes: the first shards get one column more)."""
    return axiswise_sharding_strategy(weight, i, num_devices, 1)


def segmented_sharding_strategy(weight: Weight, i: int, num_devices: int, axis: int, segments: Sequence[Segment]) -> TensorValue:
    """Split each `Segment` of ``axis`` over the devices and concatenate device ``i``'s parts.

    The segments must cover the axis: their sizes add up to its length, or to
    twice it for a packed FP4 (uint8) weight, whose elements hold two values.

    Raises:
        ValueError: the segments do not cover the axis, or a packed part is odd.
    """
    if not segments:
        raise ValueError(f"segmented_sharding_strategy: weight {weight.name!r} needs at least one segment")
    dim = int(weight.shape[axis])
    total = sum(seg.size for seg in segments)
    if total == dim:
        pack = 1
    elif weight.dtype is DType.uint8 and total == 2 * dim:
        pack = 2
    else:
        raise ValueError(
            f"segmented_sharding_strategy: weight {weight.name!r} segments cover {total} elements "
            f"but axis {axis} of shape {list(weight.shape)} has {dim}"
        )
    parts, offset = [], 0
    for seg in segments:
        start, length = seg._part(i, num_devices)
        if (start % pack) or (length % pack):
            raise ValueError(f"segmented_sharding_strategy: weight {weight.name!r}: shard {i} of segment {seg} splits a packed element")
        parts.append(((offset + start) // pack, length // pack))
        offset += seg.size
    return _slice_axis(weight, axis, parts)


def stacked_qkv_sharding_strategy(weight: Weight, i: int, num_devices: int, num_heads: int, head_dim: int) -> TensorValue:
    """Shard ``i`` of a stacked ``[Q; K; V]`` weight (dim 0 is ``3 * num_heads * head_dim``),
    each of Q, K, V split by whole heads."""
    seg = Segment.head_aware(num_heads, head_dim)
    return segmented_sharding_strategy(weight, i, num_devices, 0, (seg, seg, seg))


def head_aware_col_sharding_strategy(weight: Weight, i: int, num_devices: int, num_heads: int, head_dim: int) -> TensorValue:
    """Shard ``i`` of ``weight`` split along dim 1 by whole heads of ``head_dim`` columns."""
    return segmented_sharding_strategy(weight, i, num_devices, 1, (Segment.head_aware(num_heads, head_dim),))


def gate_up_sharding_strategy(weight: Weight, i: int, num_devices: int, axis: int = 2) -> TensorValue:
    """Shard ``i`` of a fused ``[gate | up]`` weight: each half of ``axis`` split evenly."""
    half = int(weight.shape[axis]) // 2
    return segmented_sharding_strategy(weight, i, num_devices, axis, (Segment.even(half), Segment.even(half)))


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
            raise ValueError(f"Weight {self.name!r} has no parent graph: it can only be used in ops inside `with Graph(...)`")
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
