"""The paged KV cache: graph values (`PagedCacheValues`) and step inputs (`RaggedKVCacheInputs`);
the host-side page allocator is `maxfx.nn.kv_cache._page_manager.PagedKVCacheManager`.

Design (MAX leaves it open):

* One **block pool** per model holds every layer's K and V:
  ``[total_num_pages, kv_dim, num_layers, page_size, n_kv_heads, head_dim]``
  (``kv_dim`` 2, or 1 for MLA). It is a graph *buffer* input: the kernels write
  new rows into it functionally and the engine writes the final value back
  into the driver Tensor, so one compiled step does prefill or decode.
* A **lookup table** ``[batch, max_pages]`` (uint32) maps page ``i`` of
  sequence ``b`` to a pool page; position ``p`` is slot ``p % page_size`` of
  page ``lookup[b, p // page_size]``.
* **cache_lengths** ``[batch]`` (uint32) counts tokens already cached; this
  step's new tokens go to positions ``cache_lengths[b] + i``.
* **max_lengths** ``[steps, 2]`` (uint32): per step, the longest new-token run
  and the longest total length (informational; kernels take sizes from shapes).

The manager keeps the table width fixed (``ceil(max_seq_len / page_size)``)
so that every decode step has the same input shapes and runs one executable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KVCacheInputs", "KVCacheInputsSequence", "RaggedKVCacheInputs", "PagedCacheValues"]


class KVCacheInputs:
    """Base of the KV-cache tensors fed to a model each step; iterating yields them in order.

    Example:
        >>> model.execute(tokens, offsets, *kv_inputs)  # doctest: +SKIP
    """

    def __iter__(self) -> Iterator[Any]:
        if dataclasses.is_dataclass(self):
            return iter(getattr(self, f.name) for f in dataclasses.fields(self))
        return iter(())

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __getitem__(self, i: int) -> Any:
        return list(iter(self))[i]


@dataclass
class RaggedKVCacheInputs(KVCacheInputs):
    """One step's paged-cache inputs (driver Tensors): ``blocks`` (the pool, updated in place),
    ``cache_lengths [batch]``, ``lookup_table [batch, max_pages]``, ``max_lengths [steps, 2]``."""

    blocks: Any
    cache_lengths: Any
    lookup_table: Any
    max_lengths: Any


@dataclass
class KVCacheInputsSequence(KVCacheInputs):
    """Several `KVCacheInputs` (one per device or per step); iterating yields all their tensors in order."""

    kv_cache_inputs: Sequence[KVCacheInputs]

    def __iter__(self) -> Iterator[Any]:
        for inputs in self.kv_cache_inputs:
            yield from inputs


@dataclass
class PagedCacheValues:
    """The paged cache inside a graph: what the attention kernels take as ``kv_collection``.

    MAX 26.5's fields, in its order (positional construction works as in MAX):

    Attributes:
        kv_blocks: the block pool (a `BufferValue`), ``[pages, kv_dim, layers, page_size,
            n_kv_heads, head_dim]``; a single-layer pool ``[pages, kv_dim, n_kv_heads,
            page_size, head_dim]`` is accepted too (see ``maxfx.nn.kernels``).
        cache_lengths: uint32 ``[batch]``.
        lookup_table: uint32 ``[batch, max_pages]``.
        max_prompt_length: uint32 ``[1]``: the longest new-token run of this step.
        max_cache_length: uint32 ``[1]``: the longest total length (cached + new) of this step.
        kv_scales: optional float8-cache scales (a buffer); maxfx caches store plain values, so
            kernels carry it along unread.
        attention_dispatch_metadata: optional int64 ``[4]`` decode-dispatch scalars (MAX's GPU
            kernels); informational in maxfx.
        mla_num_partitions: optional MLA decode partition count (MAX's GPU kernels); informational.

    Example:
        >>> kv = PagedCacheValues.from_graph_inputs(graph.inputs[2:6])  # doctest: +SKIP
        >>> kv.max_cache_length.shape  # doctest: +SKIP
        [Dim(1)]
    """

    kv_blocks: Any
    cache_lengths: Any
    lookup_table: Any
    max_prompt_length: Any
    max_cache_length: Any
    kv_scales: Any = None
    attention_dispatch_metadata: Any = None
    mla_num_partitions: Any = None

    @classmethod
    def from_graph_inputs(cls, values: Sequence[Any]) -> PagedCacheValues:
        """From the four graph inputs typed by `KVCacheParams.input_types` (buffer first).

        The step's ``max_lengths [steps, 2]`` input gives ``max_prompt_length`` (column 0)
        and ``max_cache_length`` (column 1) of the first step.
        """
        values = list(values)
        if len(values) != 4:
            raise ValueError(
                "PagedCacheValues.from_graph_inputs: expected 4 values (blocks, cache_lengths, lookup_table, "
                f"max_lengths), got {len(values)}"
            )
        try:
            blocks = values[0].buffer
            cache_lengths, lookup_table, max_lengths = (v.tensor for v in values[1:])
        except (AttributeError, TypeError) as e:
            raise TypeError(
                "PagedCacheValues.from_graph_inputs: expected a buffer and three tensors (KVCacheParams.input_types), "
                f"got {[getattr(v, 'type', v) for v in values]}"
            ) from e
        if max_lengths.rank != 2 or int(max_lengths.shape[1]) != 2:
            raise ValueError(
                f"PagedCacheValues.from_graph_inputs: max_lengths must be [steps, 2], got {list(max_lengths.shape)}"
            )
        return cls(blocks, cache_lengths, lookup_table, max_lengths[0, 0:1], max_lengths[0, 1:2])

    def __iter__(self) -> Iterator[Any]:
        """The values in MAX's ABI order (``kv_scales`` only when set; dispatch metadata never)."""
        yield from (
            self.kv_blocks,
            self.cache_lengths,
            self.lookup_table,
            self.max_prompt_length,
            self.max_cache_length,
        )
        if self.kv_scales is not None:
            yield self.kv_scales
