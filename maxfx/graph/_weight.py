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
    "head_aware_row_sharding_strategy",
    "query_kv_heads",
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


# A shard's *slices*: ``(axis, ((start, length), ...))``, the pieces of the host
# weight along ``axis`` whose concatenation is the shard, or None for the whole
# weight (replicate). Every built-in strategy is such a plan, so `Weight.shard`
# knows each shard's shape without a graph, the engine slices the loaded value
# (lowering's ``weight`` op, ``shard`` param) and the strategy functions below
# build the same slices as graph ops: one definition of each split.
Slices = tuple[int, tuple[tuple[int, int], ...]]


def _dim(shape: Sequence[Any], axis: int, what: str) -> int:
    try:
        return int(shape[axis])
    except TypeError:
        raise ValueError(f"{what}: axis {axis} of shape {list(shape)} must be static to be sharded") from None


def _norm_axis(shape: Sequence[Any], axis: int, what: str) -> int:
    rank = len(shape)
    if not -rank <= axis < rank:
        raise ValueError(f"{what}: axis {axis} is out of range for a weight of rank {rank} (shape {list(shape)})")
    return axis % rank


def _axis_slices(shape: Sequence[Any], i: int, num_devices: int, axis: int) -> Slices:
    axis = _norm_axis(shape, axis, "axiswise sharding")
    return axis, (_split(_dim(shape, axis, "axiswise sharding"), i, num_devices),)


def _segmented_slices(
    shape: Sequence[Any], dtype: DType, i: int, num_devices: int, axis: int, segments: Sequence[Segment], name: str
) -> Slices:
    if not segments:
        raise ValueError(f"segmented_sharding_strategy: weight {name!r} needs at least one segment")
    axis = _norm_axis(shape, axis, "segmented_sharding_strategy")
    dim = _dim(shape, axis, "segmented_sharding_strategy")
    total = sum(seg.size for seg in segments)
    if total == dim:
        pack = 1
    elif dtype is DType.uint8 and total == 2 * dim:
        pack = 2  # packed FP4: each uint8 holds two values
    else:
        raise ValueError(
            f"segmented_sharding_strategy: weight {name!r} segments cover {total} elements but axis {axis} of shape "
            f"{list(shape)} has {dim}"
        )
    parts, offset = [], 0
    for seg in segments:
        start, length = seg._part(i, num_devices)
        if (start % pack) or (length % pack):
            raise ValueError(
                f"segmented_sharding_strategy: weight {name!r}: shard {i} of segment {seg} splits a packed element"
            )
        parts.append(((offset + start) // pack, length // pack))
        offset += seg.size
    return axis, tuple(parts)


def query_kv_heads(num_heads: int, num_kv_heads: int, i: int, num_devices: int) -> tuple[int, ...]:
    """The KV heads device ``i`` holds so that its query heads (split as
    ``num_heads_for_device``: the first devices one head more) attend as on one device.

    With ``g = num_heads // num_kv_heads`` query heads per KV head, query head
    ``h`` reads KV head ``h // g``. When the device's query heads read their KV
    heads in equal groups, it holds that contiguous range (an even split of the
    KV heads when the groups split evenly; a KV head shared by two devices is
    held by both). Otherwise it holds one copy of the KV head per query head
    (group 1), so every device still runs grouped-query attention with one
    group size. Head counts that are not grouped (``num_heads % num_kv_heads``)
    split the KV heads evenly, like any row split.

    Example:
        >>> [query_kv_heads(8, 2, i, 2) for i in range(2)], query_kv_heads(9, 3, 0, 2)
        ([(0,), (1,)], (0, 0, 0, 1, 1))
    """
    q_start, q_count = _split(num_heads, i, num_devices)
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        kv_start, kv_count = _split(num_kv_heads, i, num_devices)
        return tuple(range(kv_start, kv_start + kv_count))
    group = num_heads // num_kv_heads
    reads = [(q_start + j) // group for j in range(q_count)]
    if not reads:
        return ()
    distinct = reads[-1] - reads[0] + 1
    if q_count % distinct == 0 and all(kv - reads[0] == j // (q_count // distinct) for j, kv in enumerate(reads)):
        return tuple(range(reads[0], reads[0] + distinct))
    return tuple(reads)


def _head_rows(heads: Sequence[int], head_dim: int, offset: int = 0) -> tuple[tuple[int, int], ...]:
    """``(start, length)`` rows of ``heads`` (consecutive heads merged into one slice)."""
    parts: list[list[int]] = []
    for h in heads:
        start = offset + h * head_dim
        if parts and parts[-1][0] + parts[-1][1] == start:
            parts[-1][1] += head_dim
        else:
            parts.append([start, head_dim])
    return tuple((a, b) for a, b in parts)


def _query_rows(
    num_heads: int, head_dim: int, i: int, num_devices: int, offset: int = 0
) -> tuple[tuple[int, int], ...]:
    start, count = _split(num_heads, i, num_devices)
    return _head_rows(range(start, start + count), head_dim, offset)


def _head_rows_slices(
    shape: Sequence[Any], i: int, num_devices: int, num_heads: int, head_dim: int, num_kv_heads: int | None, name: str
) -> Slices:
    """Dim 0 in whole heads: query heads, or (``num_kv_heads``) the KV heads they read."""
    rows = _dim(shape, 0, "head_aware_rowwise")
    heads = num_heads if num_kv_heads is None else num_kv_heads
    if rows != heads * head_dim:
        raise ValueError(
            f"head_aware_rowwise: weight {name!r} has {rows} rows but {heads} heads of {head_dim} need "
            f"{heads * head_dim}"
        )
    if num_kv_heads is None:
        return 0, _query_rows(num_heads, head_dim, i, num_devices)
    return 0, _head_rows(query_kv_heads(num_heads, num_kv_heads, i, num_devices), head_dim)


def _stacked_qkv_slices(
    shape: Sequence[Any],
    dtype: DType,
    i: int,
    num_devices: int,
    num_heads: int,
    head_dim: int,
    name: str,
    num_kv_heads: int | None = None,
) -> Slices:
    rows = _dim(shape, 0, "stacked_qkv_sharding_strategy")
    if num_kv_heads is None:
        if rows % 3:
            raise ValueError(
                f"Stacked QKV weight must have shape [3*hidden_size, hidden_size], got shape {list(shape)}"
            )
        if rows // 3 != num_heads * head_dim:
            raise ValueError(
                f"Weight hidden_size {rows // 3} doesn't match num_heads * head_dim = {num_heads} * {head_dim} = "
                f"{num_heads * head_dim}"
            )
        seg = Segment.head_aware(num_heads, head_dim)
        return _segmented_slices(shape, dtype, i, num_devices, 0, (seg, seg, seg), name)
    # Grouped-query [Q; K; V]: Q by query heads, K and V by the KV heads those queries read.
    q_rows, kv_rows = num_heads * head_dim, num_kv_heads * head_dim
    if rows != q_rows + 2 * kv_rows:
        raise ValueError(
            f"stacked_qkv_sharding_strategy: weight {name!r} has {rows} rows; {num_heads} query and 2 x {num_kv_heads} "
            f"KV heads of {head_dim} need {q_rows + 2 * kv_rows}"
        )
    kv = query_kv_heads(num_heads, num_kv_heads, i, num_devices)
    parts = (
        _query_rows(num_heads, head_dim, i, num_devices)
        + _head_rows(kv, head_dim, q_rows)
        + _head_rows(kv, head_dim, q_rows + kv_rows)
    )
    return 0, parts


def _head_aware_col_slices(shape: Sequence[Any], i: int, num_devices: int, num_heads: int, head_dim: int) -> Slices:
    """Device ``i``'s whole heads of dim 1. As in MAX, a packed weight's columns are
    bytes (FP4: half the logical width, MXFP6: three quarters), read off its width;
    any other width is sliced by head columns as is."""
    start, n = _split(num_heads, i, num_devices)
    begin, end = start * head_dim, (start + n) * head_dim
    logical, cols = num_heads * head_dim, _dim(shape, 1, "head_aware_col_sharding_strategy")
    if cols * 2 == logical:
        begin, end = begin // 2, end // 2
    elif cols * 4 == logical * 3:
        begin, end = begin * 3 // 4, end * 3 // 4
    return 1, ((begin, end - begin),)


def _gate_up_slices(shape: Sequence[Any], dtype: DType, i: int, num_devices: int, axis: int, name: str) -> Slices:
    full = _dim(shape, _norm_axis(shape, axis, "gate_up_sharding_strategy"), "gate_up_sharding_strategy")
    if full % 2:
        raise ValueError(f"Dimension {axis} must be even for gate_up sharding, got {full}")
    half = Segment.even(full // 2)
    return _segmented_slices(shape, dtype, i, num_devices, axis, (half, half), name)


def _sliced_shape(shape: Sequence[Any], slices: Slices | None) -> list[Any]:
    dims = list(shape)
    if slices is not None:
        axis, parts = slices
        dims[axis] = Dim(sum(length for _, length in parts))
    return dims


# Kinds whose shards are one slice along `axis` (what `Weight.shard` binds at load time).
_AXIS_KINDS = ("rowwise", "columnwise", "axiswise")


@dataclass(frozen=True)
class ShardingStrategy:
    """How a weight splits across devices.

    Build one with a factory (`rowwise`, `columnwise`, `axiswise`, `replicate`,
    `stacked_qkv`, `head_aware_columnwise`, `gate_up`, `segmented`,
    `tensor_parallel`, `expert_parallel`), MAX's way with a strategy function
    (``ShardingStrategy(n, shard=row_sharding_strategy)``, or a ``partial`` of
    one), or pass your own ``shard`` function ``(weight, i, num_devices) ->
    TensorValue``. Calling the strategy, ``strategy(weight, i)``, gives shard
    ``i`` of ``weight`` in the graph being built. Uneven sizes give the first
    devices one element (or head) more, as in MAX.

    Attributes:
        num_devices: number of shards.
        axis: the axis that is split (None: not split along one axis).
        kind: which factory made it (``"custom"`` for your own ``shard`` function).
        num_heads, head_dim: heads of the head-aware kinds (a rowwise strategy
            with heads splits dim 0 in whole heads, see `head_aware_rowwise`).
        segments: the blocks of a segmented strategy.
        num_kv_heads: grouped-query KV heads (`head_aware_rowwise` of K/V rows,
            `stacked_qkv` of a ``[Q; K; V]`` weight with fewer KV heads).
        shard: the function computing one shard.

    Example:
        >>> ShardingStrategy.rowwise(4).is_rowwise, ShardingStrategy.replicate(4).sharded_axis
        (True, None)
        >>> ShardingStrategy(2, shard=col_sharding_strategy).is_colwise
        True
    """

    num_devices: int
    axis: Any = 0
    kind: str = ""
    num_heads: int | None = None
    head_dim: int | None = None
    segments: tuple[Segment, ...] = ()
    num_kv_heads: int | None = None
    shard: Callable[..., TensorValue] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        axis, kind, shard = self.axis, self.kind, self.shard
        if callable(axis):  # MAX's positional form ShardingStrategy(num_devices, shard)
            axis, shard, kind = 0, axis, ""
        if not kind and shard is not None:
            known = _builtin_kind(shard)
            if known is None:
                axis, kind = None, "custom"
            else:
                kind, axis, heads, head_dim, segments, kv_heads = known
                object.__setattr__(self, "num_heads", heads)
                object.__setattr__(self, "head_dim", head_dim)
                object.__setattr__(self, "segments", segments)
                object.__setattr__(self, "num_kv_heads", kv_heads)
        if not kind:
            kind = {None: "replicate", 0: "rowwise", 1: "columnwise"}.get(axis, "axiswise")
        object.__setattr__(self, "axis", axis)
        object.__setattr__(self, "kind", kind)
        if shard is None:
            shard = self._builtin_shard(kind)
        object.__setattr__(self, "shard", shard)

    def _builtin_shard(self, kind: str) -> Callable[..., TensorValue]:
        if kind == "replicate":
            return replicate_sharding_strategy
        if kind == "rowwise":
            if self.num_heads is not None:
                return partial(
                    head_aware_row_sharding_strategy,
                    num_heads=self.num_heads,
                    head_dim=self.head_dim,
                    num_kv_heads=self.num_kv_heads,
                )
            return row_sharding_strategy
        if kind == "columnwise":
            return col_sharding_strategy
        if kind == "axiswise":
            return partial(axiswise_sharding_strategy, axis=self.axis)
        if kind == "stacked_qkv":
            kv = {} if self.num_kv_heads is None else {"num_kv_heads": self.num_kv_heads}
            return partial(stacked_qkv_sharding_strategy, num_heads=self.num_heads, head_dim=self.head_dim, **kv)
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

    def _slices(self, shape: Sequence[Any], dtype: DType, i: int, name: str) -> Slices | None:
        """The slices of shard ``i`` of a ``shape`` weight (None: the whole weight).

        Raises:
            ValueError: ``i`` is out of range, the split does not fit the shape,
                or the strategy is module-level or custom (no static slices).
        """
        _split(self.num_devices, i, self.num_devices)  # checks the shard index
        n, kind = self.num_devices, self.kind
        if kind == "replicate":
            return None
        if kind == "rowwise" and self.num_heads is not None:
            return _head_rows_slices(shape, i, n, self.num_heads, self.head_dim, self.num_kv_heads, name)  # type: ignore[arg-type]
        if kind in _AXIS_KINDS:
            return _axis_slices(shape, i, n, self.axis)
        if kind == "stacked_qkv":
            return _stacked_qkv_slices(shape, dtype, i, n, self.num_heads, self.head_dim, name, self.num_kv_heads)  # type: ignore[arg-type]
        if kind == "head_aware_columnwise":
            return _head_aware_col_slices(shape, i, n, self.num_heads, self.head_dim)  # type: ignore[arg-type]
        if kind == "gate_up":
            return _gate_up_slices(shape, dtype, i, n, self.axis, name)
        if kind == "segmented":
            return _segmented_slices(shape, dtype, i, n, self.axis, self.segments, name)
        raise ValueError(f"Weight {name!r}: a {kind} strategy has no static slices")

    # -- factories -----------------------------------------------------------
    @staticmethod
    def rowwise(num_devices: int) -> ShardingStrategy:
        """Split dim 0 (rows of a ``[out, in]`` Linear weight); uneven sizes give the first devices one row more."""
        return ShardingStrategy(num_devices, 0, "rowwise")

    @staticmethod
    def columnwise(num_devices: int) -> ShardingStrategy:
        """Split dim 1; uneven sizes give the first devices one column more."""
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
    def head_aware_rowwise(
        num_devices: int, num_heads: int, head_dim: int, num_kv_heads: int | None = None
    ) -> ShardingStrategy:
        """Split dim 0 in whole heads of ``head_dim`` rows (a rowwise strategy: ``is_rowwise``).

        The rows are ``num_heads`` query heads split as ``num_heads_for_device``;
        with ``num_kv_heads`` they are the KV heads and each device takes the
        ones its query heads read (`query_kv_heads`), so uneven and grouped
        splits stay exact.

        Example:
            >>> s = ShardingStrategy.head_aware_rowwise(2, num_heads=9, head_dim=4, num_kv_heads=3)
            >>> s.is_rowwise, s._slices([12, 16], DType.float32, 1, "k")  # query heads 5..8 read KV heads 1, 2, 2, 2
            (True, (0, ((4, 8), (8, 4), (8, 4))))
        """
        return ShardingStrategy(num_devices, 0, "rowwise", num_heads, head_dim, num_kv_heads=num_kv_heads)

    @staticmethod
    def stacked_qkv(
        num_devices: int, num_heads: int, head_dim: int, num_kv_heads: int | None = None
    ) -> ShardingStrategy:
        """Split a stacked ``[Q; K; V]`` weight by heads: ``[3 * num_heads * head_dim, ...]``, or with
        ``num_kv_heads`` (grouped-query) ``[(num_heads + 2 * num_kv_heads) * head_dim, ...]`` whose
        K and V rows follow the query heads as in `head_aware_rowwise`."""
        return ShardingStrategy(num_devices, 0, "stacked_qkv", num_heads, head_dim, num_kv_heads=num_kv_heads)

    @staticmethod
    def head_aware_columnwise(num_devices: int, num_heads: int, head_dim: int) -> ShardingStrategy:
        """Split dim 1 by whole heads (an attention output projection); uneven head counts give the first devices one
        head more.
        """
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
    def is_axiswise(self) -> bool:
        """True for `axiswise`."""
        return self.kind == "axiswise"

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


def _module_level_shard(kind: str) -> Callable[..., TensorValue]:
    def shard(weight: Weight, i: int, num_devices: int) -> TensorValue:
        raise ValueError(
            f"ShardingStrategy.{kind} is a module-level strategy: the module shards its own weights, a single weight "
            f"has no {kind} shard"
        )

    return shard


def _builtin_kind(
    shard: Callable[..., Any],
) -> tuple[str, Any, int | None, int | None, tuple[Segment, ...], int | None] | None:
    """``(kind, axis, num_heads, head_dim, segments, num_kv_heads)`` when ``shard`` is one of the
    strategy functions below (or a ``partial`` binding their keywords), else None."""
    func, kw = (shard.func, dict(shard.keywords)) if isinstance(shard, partial) and not shard.args else (shard, {})
    kv = kw.get("num_kv_heads")
    if func is row_sharding_strategy and not kw:
        return "rowwise", 0, None, None, (), None
    if func is head_aware_row_sharding_strategy and {"num_heads", "head_dim"} <= set(kw) <= {
        "num_heads",
        "head_dim",
        "num_kv_heads",
    }:
        return "rowwise", 0, kw["num_heads"], kw["head_dim"], (), kv
    if func is col_sharding_strategy and not kw:
        return "columnwise", 1, None, None, (), None
    if func is replicate_sharding_strategy and not kw:
        return "replicate", None, None, None, (), None
    if func is axiswise_sharding_strategy and set(kw) == {"axis"}:
        return "axiswise", kw["axis"], None, None, (), None
    if func is gate_up_sharding_strategy and set(kw) <= {"axis"}:
        return "gate_up", kw.get("axis", 2), None, None, (), None
    if func is stacked_qkv_sharding_strategy and {"num_heads", "head_dim"} <= set(kw) <= {
        "num_heads",
        "head_dim",
        "num_kv_heads",
    }:
        return "stacked_qkv", 0, kw["num_heads"], kw["head_dim"], (), kv
    if func is head_aware_col_sharding_strategy and set(kw) == {"num_heads", "head_dim"}:
        return "head_aware_columnwise", 1, kw["num_heads"], kw["head_dim"], (), None
    if func is segmented_sharding_strategy and set(kw) == {"axis", "segments"}:
        return "segmented", kw["axis"], None, None, tuple(kw["segments"]), None
    return None


# ─── shard functions: (weight, i, num_devices) -> shard i as a graph value ────


def _slice_axis(weight: Any, slices: Slices | None) -> TensorValue:
    """Concatenation along the axis of the ``(start, length)`` slices of ``weight``."""
    value = weight._value if isinstance(weight, Weight) else weight
    if slices is None:
        return value
    axis, parts = slices
    pieces = []
    for start, length in parts:
        index = [slice(None)] * value.rank
        index[axis] = slice(start, start + length)
        pieces.append(ops.slice_tensor(value, index))
    return pieces[0] if len(pieces) == 1 else ops.concat(pieces, axis=axis)


def _name(weight: Any) -> str:
    return getattr(weight, "name", None) or "<tensor>"


def replicate_sharding_strategy(weight: Weight, i: int, num_devices: int) -> TensorValue:
    """Every shard is the whole weight."""
    _split(num_devices, i, num_devices)  # checks the shard index
    return weight._value if isinstance(weight, Weight) else weight


def axiswise_sharding_strategy(weight: Weight, i: int, num_devices: int, axis: int) -> TensorValue:
    """Shard ``i`` of ``weight`` split along ``axis``; the first ``dim % num_devices`` shards get one element more."""
    return _slice_axis(weight, _axis_slices(weight.shape, i, num_devices, axis))


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


def segmented_sharding_strategy(
    weight: Weight, i: int, num_devices: int, axis: int, segments: Sequence[Segment]
) -> TensorValue:
    """Split each `Segment` of ``axis`` over the devices and concatenate device ``i``'s parts.

    The segments must cover the axis: their sizes add up to its length, or to
    twice it for a packed FP4 (uint8) weight, whose elements hold two values.

    Raises:
        ValueError: the segments do not cover the axis, or a packed part is odd.
    """
    return _slice_axis(
        weight, _segmented_slices(weight.shape, weight.dtype, i, num_devices, axis, segments, _name(weight))
    )


def stacked_qkv_sharding_strategy(
    weight: Weight, i: int, num_devices: int, num_heads: int, head_dim: int, num_kv_heads: int | None = None
) -> TensorValue:
    """Shard ``i`` of a stacked ``[Q; K; V]`` weight (dim 0 is ``3 * num_heads * head_dim``, or
    ``(num_heads + 2 * num_kv_heads) * head_dim`` grouped-query), each of Q, K, V split by whole heads."""
    return _slice_axis(
        weight,
        _stacked_qkv_slices(
            weight.shape, weight.dtype, i, num_devices, num_heads, head_dim, _name(weight), num_kv_heads
        ),
    )


def head_aware_row_sharding_strategy(
    weight: Weight, i: int, num_devices: int, num_heads: int, head_dim: int, num_kv_heads: int | None = None
) -> TensorValue:
    """Shard ``i`` of ``weight`` split along dim 0 in whole heads (see `ShardingStrategy.head_aware_rowwise`)."""
    return _slice_axis(
        weight, _head_rows_slices(weight.shape, i, num_devices, num_heads, head_dim, num_kv_heads, _name(weight))
    )


def head_aware_col_sharding_strategy(
    weight: Weight, i: int, num_devices: int, num_heads: int, head_dim: int
) -> TensorValue:
    """Shard ``i`` of ``weight`` split along dim 1 by whole heads of ``head_dim`` columns
    (packed FP4 / MXFP6 weights: the matching byte columns)."""
    return _slice_axis(weight, _head_aware_col_slices(weight.shape, i, num_devices, num_heads, head_dim))


def gate_up_sharding_strategy(weight: Weight, i: int, num_devices: int, axis: int = 2) -> TensorValue:
    """Shard ``i`` of a fused ``[gate | up]`` weight: each half of ``axis`` split evenly."""
    return _slice_axis(weight, _gate_up_slices(weight.shape, weight.dtype, i, num_devices, axis, _name(weight)))


class Weight(TensorValue):
    """A named weight tensor (a `TensorValue` in whichever graph is being built).

    Args:
        name: key of the value in ``weights_registry``.
        dtype: its element type (uint8 bytes for quantized encodings).
        shape: its shape (of the packed bytes for quantized encodings).
        device: the device it is placed on.
        quantization_encoding: a `QuantizationEncoding` for packed weights.
        align: required byte alignment of the supplied value.
        sharding_strategy: a `ShardingStrategy`, needed by `shard`.
    """

    __slots__ = (
        "_name",
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
        "_custom_value",  # (graph, value) of a custom-strategy shard, built once per graph
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
        self._custom_value: tuple[Any, TensorValue] | None = None

    @property
    def name(self) -> str:
        """Key of the value in ``weights_registry``. A shard reads its host weight's
        value, so it follows the host's (current) name until it is renamed itself."""
        if self._name is None and self._shard_of is not None:
            return self._shard_of[0].name
        return self._name  # type: ignore[return-value]

    @name.setter
    def name(self, name: str) -> None:
        self._name = name

    # The graph value is resolved against whichever graph is active.
    @property
    def _value(self) -> TensorValue:
        graph = current_graph()
        if graph is None:
            raise ValueError(
                f"Weight {self.name!r} has no parent graph: it can only be used in ops inside `with Graph(...)`"
            )
        if self._is_custom_shard():
            return self._custom_shard_value(graph)
        return graph.add_weight(self)

    def _is_custom_shard(self) -> bool:
        return (
            self._shard_of is not None
            and self._sharding_strategy is not None
            and self._sharding_strategy.kind == "custom"
        )

    def _custom_shard_value(self, graph: Any) -> TensorValue:
        """A custom strategy's shard is its function applied to the host weight in the
        graph (as in MAX), moved to this shard's device; built once per graph."""
        if self._custom_value is not None and self._custom_value[0] is graph:
            return self._custom_value[1]
        host, i = self._shard_of  # type: ignore[misc]
        value = self._sharding_strategy(host, i)  # type: ignore[misc]
        if value.device != self._device:
            value = ops.transfer_to(value, self._device)
        self._custom_value = (graph, value)
        return value

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
        if self._is_custom_shard():
            return self._value.type
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
        """Shape (of this shard, for a sharded weight; a custom strategy's shard needs a graph, as in MAX)."""
        if self._is_custom_shard():
            return self._value.shape
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
        """Per-device views of this weight following its `sharding_strategy`.

        Each shard is a `Weight` on its device whose value is its slice of this
        weight's value (sliced when the graph is loaded); uneven splits give the
        first devices one row (or head) more. A custom strategy's shards are
        computed in the graph by its function.

        Example:
            >>> from maxfx.dtype import DType
            >>> from maxfx.graph import DeviceRef
            >>> w = Weight("w", DType.float32, [10, 4], DeviceRef.CPU(), sharding_strategy=ShardingStrategy.rowwise(3))
            >>> [int(s.shape[0]) for s in w.shard([DeviceRef.CPU()] * 3)]
            [4, 3, 3]

        Raises:
            ValueError: no strategy, an already sharded weight, a device count
                other than the strategy's, or a split that does not fit the shape.
        """
        strategy = self._sharding_strategy
        if strategy is None:
            raise ValueError(f"Weight {self.name} cannot be sharded because no sharding strategy was provided.")
        if self._shard_of is not None:
            raise ValueError(f"Weight {self.name} was already sharded and cannot be sharded again.")
        devices = list(devices)
        if len(devices) != strategy.num_devices:
            raise ValueError(
                f"Weight {self.name!r}: strategy has {strategy.num_devices} shards but {len(devices)} devices were "
                "given"
            )
        out = []
        for i, dev in enumerate(devices):
            if strategy.kind == "custom":
                shape = self._shape  # placeholder: a custom shard's shape comes from its graph value
            else:
                shape = _sliced_shape(self._shape, strategy._slices(self._shape, self._dtype, i, self.name))
            w = Weight(self.name, self._dtype, shape, dev, self.quantization_encoding, self.align, strategy)
            w.shard_idx = i
            w._shard_of = (self, i)
            w._name = None  # follow the host's name (it may be qualified after sharding)
            out.append(w)
        return out

    def __repr__(self) -> str:
        return f"Weight({self.name!r}, dtype={self._dtype.name}, shape={list(self._shape)!r}, device={self._device})"

    __hash__ = object.__hash__


def weight_params(weight: Weight) -> dict[str, Any]:
    """Params of the ``weight`` node recording ``weight`` (incl. shard slicing)."""
    params: dict[str, Any] = {"name": weight.name, "type": weight._weight_type()}
    strategy = weight._sharding_strategy
    if weight._shard_of is not None and strategy is not None:
        host, i = weight._shard_of
        slices = strategy._slices(host._shape, host._dtype, i, weight.name)
        if slices is not None:
            # (axis, ((start, length), ...), full size of axis): the engine checks the
            # registry value against the full size and loads the concatenated slices.
            axis, parts = slices
            params["shard"] = (axis, parts, int(host._shape[axis]))
    return params


WeightLookup = Callable[[str], Any]
