"""The KV cache's graph inputs as structured records: MAX's ``KVCacheInputsPerDevice`` and its groups.

`KVCacheParams.get_symbolic_inputs` describes the cache inputs of a model as
one `KVCacheInputsPerDevice` of graph *types* per device (``BufferType`` for the
block pool, ``TensorType`` for the rest); ``flatten`` lists them in the graph's
input order and ``unflatten`` rebuilds the same record from an iterator of the
graph's *values* (or of eager tensors), so a model never unpacks cache inputs
field by field.

`KVCacheInputsPerDevice` is a `PagedCacheValues` (MAX: ``PagedCacheValues =
KVCacheInputsPerDevice[TensorValue, BufferValue]``), so an unflattened record
goes straight to the attention kernels.

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph import DeviceRef
    >>> from maxfx.nn.kv_cache import MLAKVCacheParams
    >>> p = MLAKVCacheParams(DType.float32, head_dim=80, num_layers=2, devices=[DeviceRef.CPU()], num_q_heads=8)
    >>> symbols = p.get_symbolic_inputs()
    >>> [type(t).__name__ for t in symbols.inputs[0].flatten()]
    ['BufferType', 'TensorType', 'TensorType', 'TensorType', 'TensorType', 'TensorType', 'TensorType']
    >>> symbols.unflatten(iter(range(7))).inputs[0].lookup_table
    2
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lowering.dtypes import DType
from maxfx.nn.kv_cache._paged import KVCacheInputs, PagedCacheValues

__all__ = ["KVCacheInputsInterface", "KVCacheInputsPerDevice", "KVCacheLeafInputs", "MultiKVCacheInputs"]

_OPTIONAL_TAIL = (
    "kv_scales",
    "attention_dispatch_metadata",
    "draft_attention_dispatch_metadata",
    "mla_num_partitions",
    "draft_mla_num_partitions",
)


def _check_rank1_int64(name: str, t: Any) -> None:
    if t is None or not hasattr(t, "dtype"):
        return
    if t.dtype != DType.int64:
        raise ValueError(f"KVCacheInputsPerDevice: {name} must be int64, got {t.dtype}")
    rank = getattr(t, "rank", None)
    if rank is not None and rank != 1:
        raise ValueError(f"KVCacheInputsPerDevice: {name} must be rank 1, got rank {rank} (shape {list(t.shape)})")


@dataclass
class KVCacheInputsPerDevice[Tensor, Buffer](PagedCacheValues):
    """One device's paged-cache inputs: graph types, graph values, driver or eager tensors.

    Fields (MAX's, in graph-input order): ``kv_blocks`` (the block pool, a
    buffer), ``cache_lengths [batch]``, ``lookup_table [batch, max_pages]``,
    ``max_prompt_length [1]``, ``max_cache_length [1]`` and the optional
    ``kv_scales``, ``attention_dispatch_metadata`` (int64 rank 1),
    ``draft_attention_dispatch_metadata``, ``mla_num_partitions`` (int64 rank 1),
    ``draft_mla_num_partitions`` and ``kv_blocks_per_layer`` (one buffer per
    layer). A `PagedCacheValues`, so maxfx's kernels take it as ``kv_collection``.

    Raises:
        ValueError: a dispatch-metadata or partition field that is not a rank-1 int64 tensor.

    Example:
        >>> symbols = p.get_symbolic_inputs().inputs[0]  # doctest: +SKIP
        >>> kv = symbols.unflatten(iter(graph.inputs[2:]))  # the same record, holding graph values  # doctest: +SKIP
    """

    draft_attention_dispatch_metadata: Any = None
    draft_mla_num_partitions: Any = None
    kv_blocks_per_layer: list[Any] | None = None

    def __post_init__(self) -> None:
        for name in (
            "attention_dispatch_metadata",
            "draft_attention_dispatch_metadata",
            "mla_num_partitions",
            "draft_mla_num_partitions",
        ):
            _check_rank1_int64(name, getattr(self, name))

    def flatten(self) -> list[Any]:
        """The fields in graph-input order; unset optional fields are left out (`unflatten` is the inverse)."""
        head = [self.kv_blocks, self.cache_lengths, self.lookup_table, self.max_prompt_length, self.max_cache_length]
        tail = [getattr(self, name) for name in _OPTIONAL_TAIL if getattr(self, name) is not None]
        return [*head, *tail, *(self.kv_blocks_per_layer or ())]

    def flatten_without_attention_dispatch_metadata(self) -> list[Any]:
        """`flatten` without the dispatch metadata and partition fields (what MAX's kernels take)."""
        scales = [self.kv_scales] if self.kv_scales is not None else []
        return [
            self.kv_blocks,
            self.cache_lengths,
            self.lookup_table,
            self.max_prompt_length,
            self.max_cache_length,
            *scales,
            *(self.kv_blocks_per_layer or ()),
        ]

    def unflatten(self, it: Iterator[Any]) -> KVCacheInputsPerDevice[Any, Any]:
        """A record like this one holding the next values of ``it``, consumed in `flatten`'s order.

        Raises:
            ValueError: ``it`` ends before every field has a value.
        """
        try:
            head = [next(it) for _ in range(5)]
            tail = {name: (next(it) if getattr(self, name) is not None else None) for name in _OPTIONAL_TAIL}
            per_layer = [next(it) for _ in self.kv_blocks_per_layer] if self.kv_blocks_per_layer else None
        except StopIteration:
            raise ValueError(
                f"KVCacheInputsPerDevice.unflatten: the iterator ended early; it needs {len(self.flatten())} values "
                "(see flatten())"
            ) from None
        return KVCacheInputsPerDevice(*head, kv_blocks_per_layer=per_layer, **tail)


class KVCacheInputsInterface[Tensor, Buffer](ABC):
    """A KV cache's inputs, a leaf (`KVCacheLeafInputs`) or a tree (`MultiKVCacheInputs`): ``flatten`` /
    ``unflatten``.
    """

    @abstractmethod
    def flatten(self) -> list[Any]:
        """Every input of this (sub)tree, in graph-input order."""

    @abstractmethod
    def unflatten(self, it: Iterator[Any]) -> KVCacheInputsInterface[Any, Any]:
        """The same (sub)tree holding the next values of ``it``."""


@dataclass
class KVCacheLeafInputs[Tensor, Buffer](KVCacheInputs, KVCacheInputsInterface[Tensor, Buffer]):
    """One cache's inputs on every device: what `KVCacheParams.get_symbolic_inputs` returns.

    MAX calls this record ``KVCacheInputs``; in maxfx that name is the base of
    the per-step driver inputs (`RaggedKVCacheInputs`), which this class
    extends: iterating yields the flattened inputs.

    Attributes:
        inputs: one `KVCacheInputsPerDevice` per device (replica-major, then tensor-parallel shard).
    """

    inputs: Sequence[KVCacheInputsPerDevice[Tensor, Buffer]]

    def flatten(self) -> list[Any]:
        return list(itertools.chain.from_iterable(d.flatten() for d in self.inputs))

    def unflatten(self, it: Iterator[Any]) -> KVCacheLeafInputs[Any, Any]:
        return KVCacheLeafInputs(inputs=[d.unflatten(it) for d in self.inputs])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.flatten())


@dataclass
class MultiKVCacheInputs[Tensor, Buffer](KVCacheInputsInterface[Tensor, Buffer]):
    """A tree of caches' inputs (e.g. ``{"target": ..., "draft": ...}``), flattened child by child in key order."""

    children: dict[str, KVCacheInputsInterface[Tensor, Buffer]]

    def flatten(self) -> list[Any]:
        return list(itertools.chain.from_iterable(c.flatten() for c in self.children.values()))

    def unflatten(self, it: Iterator[Any]) -> MultiKVCacheInputs[Any, Any]:
        return MultiKVCacheInputs(children={k: c.unflatten(it) for k, c in self.children.items()})
