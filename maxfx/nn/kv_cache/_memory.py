"""KV-cache memory: quantization config, allocated buffers, trees of caches and memory estimation.

MAX's ``max.nn.kv_cache`` names, over maxfx's paged pool (one block tensor
``[total_num_pages, kv_dim, num_layers, page_size, n_kv_heads_per_device,
head_dim]`` per device, see `KVCacheParams`):

* `KVCacheQuantizationConfig`: scale dtype and granularity of an FP8/int8 cache;
* `KVCacheBuffer` / `MultiKVCacheBuffer`: one replica's allocated block
  tensors (``KVCacheParams.allocate_buffers``), one per tensor-parallel shard;
* `MultiKVCacheParams`: a tree of caches sharing one page pool (target/draft,
  sliding/global);
* `compute_num_device_blocks`, `estimated_memory_size`,
  `compute_max_seq_len_fitting_in_cache`, `spec_decode_cache_slack`: how many
  pages fit in a memory budget, as MAX sizes its pool.

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph import DeviceRef
    >>> from maxfx.nn.kv_cache import MHAKVCacheParams, estimated_memory_size
    >>> p = MHAKVCacheParams(DType.float32, head_dim=8, num_layers=2, devices=[DeviceRef.CPU()], n_kv_heads=2,
    ...     page_size=16)
    >>> p.bytes_per_block  # 2 (K, V) * 2 layers * 16 tokens * 2 heads * 8 * 4 bytes
    4096
    >>> estimated_memory_size(p, available_cache_memory=1 << 20, max_batch_size=4, max_seq_len=64)
    65536
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.nn.kv_cache._data_parallel import split_into_groups
from maxfx.nn.kv_cache._symbolic_inputs import KVCacheLeafInputs, MultiKVCacheInputs

__all__ = [
    "KVCacheBuffer",
    "KVCacheQuantizationConfig",
    "MultiKVCacheBuffer",
    "MultiKVCacheParams",
    "compute_max_seq_len_fitting_in_cache",
    "compute_num_device_blocks",
    "estimated_memory_size",
    "spec_decode_cache_slack",
]

logger = logging.getLogger("max.pipelines")


@dataclass
class KVCacheQuantizationConfig:
    """How a quantized KV cache stores its scales (MAX supports FP8 values with float32/e8m0 scales, int8 with float16).

    Attributes:
        scale_dtype: the dtype of the scales.
        quantization_granularity: the block of ``head_dim`` one scale covers
            (it must divide ``head_dim``).
    """

    scale_dtype: DType = DType.float32
    quantization_granularity: int = 128


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


@dataclass
class KVCacheBuffer:
    """One data-parallel replica's allocated cache: one value tensor per tensor-parallel shard (and scales when
    quantized).

    Attributes:
        replicates_kv_across_tp: every shard holds the same values (MLA under
            tensor parallelism); needs two or more shards.
        values: the block tensors, one per shard (same dtype and shape).
        scales: the quantization scales, one per shard, or None.
        leaf_id: the pool leaf the pages belong to.

    Raises:
        ValueError: no values, shards of different dtypes or shapes, scales not
            one per value or on another device or with another page count.
    """

    replicates_kv_across_tp: bool
    values: list[Any]
    scales: list[Any] | None = None
    leaf_id: str = field(default="", kw_only=True)

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("KVCacheBuffer: the list of values must be non-empty")
        if self.replicates_kv_across_tp and len(self.values) <= 1:
            raise ValueError(
                "KVCacheBuffer: replicates_kv_across_tp=True requires at least 2 TP shards (len(values) > 1)"
            )
        for what, group in (("values", self.values), ("scales", self.scales or [])):
            if len({b.dtype for b in group}) > 1:
                raise ValueError(
                    f"KVCacheBuffer: all {what} must have the same dtype, got {sorted(str(b.dtype) for b in group)}"
                )
            if len({tuple(b.shape) for b in group}) > 1:
                raise ValueError(
                    f"KVCacheBuffer: all {what} must have the same shape, got {[tuple(b.shape) for b in group]}"
                )
        if self.scales is None:
            return
        if len(self.scales) != len(self.values):
            raise ValueError(
                f"KVCacheBuffer: scales must be one per value ({len(self.values)}), got {len(self.scales)}"
            )
        if self.scales[0].shape[0] != self.values[0].shape[0]:
            raise ValueError(
                f"KVCacheBuffer: values and scales must have the same number of pages, got {self.values[0].shape[0]} "
                f"and {self.scales[0].shape[0]}"
            )
        for v, s in zip(self.values, self.scales):
            if v.device != s.device:
                raise ValueError(f"KVCacheBuffer: a value on {v.device} has its scales on {s.device}")

    @property
    def total_num_pages(self) -> int:
        """Pages in the pool (the leading dim of each value tensor)."""
        return int(self.values[0].shape[0])

    @property
    def all_buffers(self) -> list[Any]:
        """Every value tensor, then every scale tensor."""
        return [*self.values, *(self.scales or [])]


@dataclass
class MultiKVCacheBuffer:
    """One replica's buffers of a `MultiKVCacheParams` tree, by child name."""

    children: dict[str, Any]

    @property
    def total_num_pages(self) -> int:
        """Pages in the shared pool (the first child's)."""
        return next(iter(self.children.values())).total_num_pages

    @property
    def all_buffers(self) -> list[Any]:
        """Every child's buffers, child by child."""
        return [b for child in self.children.values() for b in child.all_buffers]


def _devices_of(params: Any) -> list[DeviceRef]:
    devices = getattr(params, "devices", None)
    return list(devices) if devices is not None else params._symbolic_devices()


def _shared(params: Sequence[Any], name: str, value: Any = None) -> Any:
    values = {repr(getattr(p, name, value)) for p in params}
    if len(values) > 1:
        raise ValueError(f"MultiKVCacheParams: all params must use the same {name}, got: {sorted(values)}")
    return getattr(params[0], name, value)


@dataclass(frozen=True)
class MultiKVCacheParams:
    """A tree of KV caches that share one page pool (e.g. ``{"target": mha, "draft": mha}``, or nested trees).

    Every sequence occupies the same pages in every child, so a block costs the
    sum of the children's `bytes_per_block`; the children must agree on the
    pool (page size, devices, data-parallel degree, prefix caching). Build it
    with `from_params`. The graph inputs are the children's, child by child,
    each child's page-count dim in its own namespace (``target_total_num_pages``).

    Raises:
        ValueError: no children, or children that disagree on the pool.

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import DeviceRef
        >>> from maxfx.nn.kv_cache import MHAKVCacheParams, MultiKVCacheParams
        >>> mha = lambda n: MHAKVCacheParams(DType.float32, head_dim=8, num_layers=n, devices=[DeviceRef.CPU()],
        ...     n_kv_heads=2, page_size=16)
        >>> tree = MultiKVCacheParams.from_params({"target": mha(4), "draft": mha(1)})
        >>> tree.bytes_per_block == mha(4).bytes_per_block + mha(1).bytes_per_block
        True
        >>> len(tree.flattened_kv_inputs())  # 6 inputs per child on one device
        12
    """

    children: dict[str, Any]
    page_size: int
    data_parallel_degree: int
    devices: Sequence[DeviceRef]
    num_draft_tokens: int = 0

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> MultiKVCacheParams:
        """A tree of ``params`` (name -> `KVCacheParams` or `MultiKVCacheParams`), reading the pool off the first.

        Raises:
            ValueError: ``params`` is empty or its entries disagree on the pool.
        """
        if not params:
            raise ValueError("MultiKVCacheParams requires at least one param.")
        first = next(iter(params.values()))
        return cls(
            children=dict(params),
            page_size=first.page_size,
            data_parallel_degree=first.data_parallel_degree,
            devices=_devices_of(first),
            num_draft_tokens=getattr(first, "num_draft_tokens", 0),
        )

    def __post_init__(self) -> None:
        if not self.children:
            raise ValueError("MultiKVCacheParams requires at least one param set.")
        params = list(self.children.values())
        for name in ("page_size", "data_parallel_degree", "enable_prefix_caching", "num_draft_tokens"):
            _shared(params, name, 0 if name == "num_draft_tokens" else None)
        if len({tuple(_devices_of(p)) for p in params}) > 1:
            raise ValueError(
                f"MultiKVCacheParams: all params must use the same devices, got: {[_devices_of(p) for p in params]}"
            )

    @property
    def n_devices(self) -> int:
        """The number of devices (every child's)."""
        return len(self.devices)

    @property
    def enable_prefix_caching(self) -> bool:
        """Whether the shared pool caches prefixes."""
        return next(iter(self.children.values())).enable_prefix_caching

    @property
    def tensor_parallel_degree(self) -> int:
        """Devices per data-parallel replica."""
        return self.n_devices // self.data_parallel_degree

    @property
    def bytes_per_block(self) -> int:
        """The bytes one page costs across the tree (the sum over the children)."""
        return sum(p.bytes_per_block for p in self.children.values())

    def get_symbolic_inputs(self, namespace: str = "") -> MultiKVCacheInputs[Any, Any]:
        """The children's graph input types, each child's page-count dim prefixed by ``{namespace}{name}_``."""
        return MultiKVCacheInputs(
            children={k: p.get_symbolic_inputs(namespace=f"{namespace}{k}_") for k, p in self.children.items()}
        )

    def flattened_kv_inputs(self) -> list[Any]:
        """Every child's graph input types, in graph-input order."""
        return self.get_symbolic_inputs().flatten()

    def unflatten_kv_inputs(self, it: Iterator[Any]) -> MultiKVCacheInputs[Any, Any]:
        """`get_symbolic_inputs` rebuilt from an iterator of graph inputs (values in the same order)."""
        return self.get_symbolic_inputs().unflatten(iter(it))

    def unflatten_basic_kv_tree(self, it: Iterator[Any]) -> tuple[list[Any], ...]:
        """For a tree of leaf caches: each child's per-device inputs, in child order.

        Raises:
            ValueError: a child is itself a tree.
        """
        tree = self.unflatten_kv_inputs(it)
        out = []
        for child in tree.children.values():
            if not isinstance(child, KVCacheLeafInputs):
                raise ValueError("MultiKVCacheParams.unflatten_basic_kv_tree: unable to flatten a nested KV tree")
            out.append(list(child.inputs))
        return tuple(out)

    def allocate_buffers(self, total_num_pages: int) -> list[MultiKVCacheBuffer]:
        """One `MultiKVCacheBuffer` per data-parallel replica, holding each child's buffers of ``total_num_pages``
        pages.
        """
        per_child = {k: p.allocate_buffers(total_num_pages) for k, p in self.children.items()}
        return [
            MultiKVCacheBuffer(children={k: bufs[r] for k, bufs in per_child.items()})
            for r in range(self.data_parallel_degree)
        ]

    @cached_property
    def devices_per_replica(self) -> list[Sequence[DeviceRef]]:
        """The devices of each data-parallel replica."""
        return split_into_groups(list(self.devices), self.data_parallel_degree)


def spec_decode_cache_slack(params: Any) -> int:
    """Extra KV positions a request may take past ``max_seq_len`` under speculative decoding (0 without it).

    MAX's worst case: ``3 * num_draft_tokens + 1``, plus one for block drafts
    (a method that drafts all tokens per step).
    """
    n = int(getattr(params, "num_draft_tokens", 0) or 0)
    if n <= 0:
        return 0
    per_step = int(getattr(params, "num_draft_tokens_per_step", 1) or 1)
    return 3 * n + (1 if per_step == n else 0) + 1


def compute_num_device_blocks(
    params: Any,
    available_cache_memory: int,
    max_batch_size: int | None,
    max_seq_len: int | None,
    require_max_seq_len_fits: bool = False,
    include_null_block: bool = False,
) -> int:
    """Pages one replica allocates: what ``available_cache_memory`` (all devices) holds, capped by the batch's need.

    The need is ``ceil((max_seq_len + slack) / page_size) * max_batch_size``
    (plus the null block with ``include_null_block``); without both bounds the
    memory alone decides. A batch of one token per request or one request at
    ``max_seq_len`` that does not fit is logged as a warning (an error with
    ``require_max_seq_len_fits``).

    Raises:
        RuntimeError: not even one page fits, or (``require_max_seq_len_fits``)
            one request at ``max_seq_len`` does not.
    """
    per_req = total = None
    if max_seq_len is not None and max_batch_size is not None:
        per_req = math.ceil((max_seq_len + spec_decode_cache_slack(params)) / params.page_size)
        total = per_req * max_batch_size + (1 if include_null_block else 0)
    memory = available_cache_memory // params.data_parallel_degree
    allocable = memory // params.bytes_per_block
    devices = params.n_devices // params.data_parallel_degree
    across = f" across {devices} devices" if devices > 1 else ""
    have = f"only have enough memory for {allocable} pages ({_human_bytes(memory)}{across})"
    if allocable == 0:
        raise RuntimeError(
            "Insufficient cache memory to allocate even a single page.\nOne page requires "
            f"{_human_bytes(params.bytes_per_block)} but only {_human_bytes(memory)} are available{across}."
        )
    if max_batch_size is not None and max_batch_size > allocable:
        logger.warning(
            f"Insufficient cache memory to support a batch containing {max_batch_size} requests with one token per "
            f"request. Need to allocate at least {max_batch_size} pages, but {have}."
        )
    if per_req is not None and per_req > allocable:
        msg = (
            "Insufficient cache memory to support a batch containing one request at the max sequence length of "
            f"{max_seq_len} tokens. Need to allocate at least {per_req} pages "
            f"({_human_bytes(per_req * params.bytes_per_block)}), but {have}."
        )
        if require_max_seq_len_fits:
            raise RuntimeError(
                msg
                + f" Reduce the max length to at most {allocable * params.page_size} or give the KV cache more memory."
            )
        logger.warning(msg)
    return allocable if total is None else min(allocable, total)


def estimated_memory_size(
    params: Any, available_cache_memory: int, max_batch_size: int, max_seq_len: int, include_null_block: bool = False
) -> int:
    """Bytes the KV cache of every replica takes: `compute_num_device_blocks` pages of `bytes_per_block`, per
    replica.
    """
    blocks = compute_num_device_blocks(
        params, available_cache_memory, max_batch_size, max_seq_len, include_null_block=include_null_block
    )
    return blocks * params.bytes_per_block * params.data_parallel_degree


def compute_max_seq_len_fitting_in_cache(
    params: Any, available_cache_memory: int, include_null_block: bool = False
) -> int:
    """The longest sequence whose pages fit in ``available_cache_memory`` (less the speculative slack; at least 1).

    Raises:
        ValueError: ``params.bytes_per_block`` is 0.
    """
    if params.bytes_per_block == 0:
        raise ValueError("bytes_per_block cannot be zero")
    blocks = compute_num_device_blocks(
        params, available_cache_memory, max_batch_size=1, max_seq_len=None, include_null_block=include_null_block
    )
    return max(1, blocks * params.page_size - spec_decode_cache_slack(params))
