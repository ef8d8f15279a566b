"""The paged KV cache: graph values (`PagedCacheValues`), step inputs (`RaggedKVCacheInputs`)
and a host-side page allocator (`PagedKVCacheManager`).

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
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.types import DeviceRef
from maxfx.driver import CPU, Tensor
from maxfx.nn.kv_cache._params import KVCacheParams

__all__ = ["KVCacheInputs", "KVCacheInputsSequence", "RaggedKVCacheInputs", "PagedCacheValues", "PagedKVCacheManager"]


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
            raise ValueError(f"PagedCacheValues.from_graph_inputs: expected 4 values (blocks, cache_lengths, lookup_table, max_lengths), got {len(values)}")
        try:
            blocks = values[0].buffer
            cache_lengths, lookup_table, max_lengths = (v.tensor for v in values[1:])
        except (AttributeError, TypeError) as e:
            raise TypeError(f"PagedCacheValues.from_graph_inputs: expected a buffer and three tensors (KVCacheParams.input_types), got {[getattr(v, 'type', v) for v in values]}") from e
        if max_lengths.rank != 2 or int(max_lengths.shape[1]) != 2:
            raise ValueError(f"PagedCacheValues.from_graph_inputs: max_lengths must be [steps, 2], got {list(max_lengths.shape)}")
        return cls(blocks, cache_lengths, lookup_table, max_lengths[0, 0:1], max_lengths[0, 1:2])

    def __iter__(self) -> Iterator[Any]:
        """The values in MAX's ABI order (``kv_scales`` only when set; dispatch metadata never)."""
        yield from (self.kv_blocks, self.cache_lengths, self.lookup_table, self.max_prompt_length, self.max_cache_length)
        if self.kv_scales is not None:
            yield self.kv_scales


class PagedKVCacheManager:
    """Host-side page allocator for one model's paged cache.

    Args:
        params: the `KVCacheParams` (``page_size`` set).
        num_layers: transformer layers sharing the pool.
        total_num_pages: pages in the pool.
        max_batch_size: sequences per step (the lookup table has this many rows at most).
        max_seq_len: longest sequence; fixes the lookup-table width.
        device: driver device of the pool (default CPU).

    Example:
        >>> mgr = PagedKVCacheManager(params, num_layers=2, total_num_pages=8, max_batch_size=2, max_seq_len=64)  # doctest: +SKIP
        >>> a, b = mgr.claim(), mgr.claim()  # doctest: +SKIP
        >>> inputs = mgr.fetch([a, b], [5, 3])  # a RaggedKVCacheInputs for a prefill step  # doctest: +SKIP
        >>> model.execute(tokens, offsets, *inputs); mgr.step([a, b], [5, 3])  # doctest: +SKIP
    """

    def __init__(self, params: KVCacheParams, num_layers: int, total_num_pages: int, max_batch_size: int, max_seq_len: int, device: Any = None):
        if params.page_size is None:
            raise ValueError("PagedKVCacheManager: params.page_size must be set")
        for name, v in (("num_layers", num_layers), ("total_num_pages", total_num_pages), ("max_batch_size", max_batch_size), ("max_seq_len", max_seq_len)):
            if int(v) < 1:
                raise ValueError(f"PagedKVCacheManager: {name} must be >= 1, got {v}")
        self.params = params
        self.num_layers, self.total_num_pages = int(num_layers), int(total_num_pages)
        self.max_batch_size, self.max_seq_len = int(max_batch_size), int(max_seq_len)
        self.page_size = int(params.page_size)
        self.max_pages_per_seq = math.ceil(self.max_seq_len / self.page_size)
        self.device = device if device is not None else CPU()
        shape = params.blocks_shape(self.num_layers, self.total_num_pages)
        self.blocks = Tensor.zeros(shape, params.dtype, self.device)
        self._free = list(range(self.total_num_pages))
        self._pages: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0

    # ── sequences ──
    def claim(self, seq_id: int | None = None) -> int:
        """Register a new sequence (empty cache); returns its id."""
        if seq_id is None:
            while self._next_id in self._pages:
                self._next_id += 1
            seq_id = self._next_id
        if seq_id in self._pages:
            raise ValueError(f"PagedKVCacheManager.claim: sequence {seq_id} is already active")
        self._pages[seq_id], self._lengths[seq_id] = [], 0
        return seq_id

    def release(self, seq_id: int) -> None:
        """Free a sequence's pages."""
        self._check(seq_id, "release")
        self._free.extend(self._pages.pop(seq_id))
        del self._lengths[seq_id]

    def cache_length(self, seq_id: int) -> int:
        """Tokens cached for ``seq_id``."""
        self._check(seq_id, "cache_length")
        return self._lengths[seq_id]

    @property
    def num_free_pages(self) -> int:
        """Pages not held by any sequence."""
        return len(self._free)

    def _check(self, seq_id: int, where: str) -> None:
        if seq_id not in self._pages:
            raise KeyError(f"PagedKVCacheManager.{where}: unknown sequence {seq_id}; claim() it first")

    # ── steps ──
    def fetch(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int]) -> RaggedKVCacheInputs:
        """Allocate pages for this step's new tokens and build the step's `RaggedKVCacheInputs`.

        Raises:
            ValueError: a sequence would exceed ``max_seq_len`` or the batch is too large.
            RuntimeError: the pool has no free page left.
        """
        seq_ids, counts = list(seq_ids), [int(n) for n in num_new_tokens]
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"PagedKVCacheManager.fetch: a sequence appears twice in {seq_ids}")
        if len(seq_ids) != len(counts):
            raise ValueError(f"PagedKVCacheManager.fetch: {len(seq_ids)} sequences but {len(counts)} token counts")
        if not 1 <= len(seq_ids) <= self.max_batch_size:
            raise ValueError(f"PagedKVCacheManager.fetch: batch of {len(seq_ids)} sequences; expected 1..{self.max_batch_size}")
        needed = 0
        for sid, n in zip(seq_ids, counts):
            self._check(sid, "fetch")
            total = self._lengths[sid] + n
            if total > self.max_seq_len:
                raise ValueError(f"PagedKVCacheManager.fetch: sequence {sid} would hold {total} tokens, more than max_seq_len={self.max_seq_len}")
            needed += max(0, math.ceil(total / self.page_size) - len(self._pages[sid]))
        if needed > len(self._free):
            # Checked before allocating anything, so a failed fetch changes nothing.
            raise RuntimeError(f"PagedKVCacheManager.fetch: out of pages (need {needed}, {len(self._free)} free of {self.total_num_pages}); release sequences or make the pool larger")
        lookup = np.zeros((len(seq_ids), self.max_pages_per_seq), np.uint32)
        for row, (sid, n) in enumerate(zip(seq_ids, counts)):
            pages = self._pages[sid]
            while len(pages) * self.page_size < self._lengths[sid] + n:
                pages.append(self._free.pop(0))
            lookup[row, : len(pages)] = pages
        lengths = np.array([self._lengths[s] for s in seq_ids], np.uint32)
        max_lengths = np.array([[max(counts), int((lengths + np.array(counts)).max())]], np.uint32)
        return RaggedKVCacheInputs(self.blocks, Tensor.from_numpy(lengths), Tensor.from_numpy(lookup), Tensor.from_numpy(max_lengths))

    def step(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int]) -> None:
        """Commit a step that ran: each sequence's cache grew by its new tokens."""
        for sid, n in zip(seq_ids, num_new_tokens):
            self._check(sid, "step")
            if self._lengths[sid] + int(n) > len(self._pages[sid]) * self.page_size:
                raise ValueError(f"PagedKVCacheManager.step: sequence {sid} has no pages for {n} more tokens; call fetch() first")
            self._lengths[sid] += int(n)

    def input_types(self) -> list[Any]:
        """Graph input types of the cache (`KVCacheParams.input_types` on this pool's device)."""
        return self.params.input_types(DeviceRef.from_device(self.device))
