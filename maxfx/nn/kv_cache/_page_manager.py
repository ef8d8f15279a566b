"""`PagedKVCacheManager`: the host-side page allocator of the paged KV cache (see `maxfx.nn.kv_cache._paged`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lowering.types import DeviceRef
from maxfx.driver import CPU, Tensor
from maxfx.nn.kv_cache._paged import RaggedKVCacheInputs
from maxfx.nn.kv_cache._params import KVCacheParams

__all__ = ["PagedKVCacheManager"]


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
        >>> mgr = PagedKVCacheManager(params, num_layers=2, total_num_pages=8, max_batch_size=2,
        ...     max_seq_len=64)  # doctest: +SKIP
        >>> a, b = mgr.claim(), mgr.claim()  # doctest: +SKIP
        >>> inputs = mgr.fetch([a, b], [5, 3])  # a RaggedKVCacheInputs for a prefill step  # doctest: +SKIP
        >>> model.execute(tokens, offsets, *inputs); mgr.step([a, b], [5, 3])  # doctest: +SKIP
    """

    def __init__(
        self,
        params: KVCacheParams,
        num_layers: int,
        total_num_pages: int,
        max_batch_size: int,
        max_seq_len: int,
        device: Any = None,
    ):
        if params.page_size is None:
            raise ValueError("PagedKVCacheManager: params.page_size must be set")
        for name, v in (
            ("num_layers", num_layers),
            ("total_num_pages", total_num_pages),
            ("max_batch_size", max_batch_size),
            ("max_seq_len", max_seq_len),
        ):
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
            raise ValueError(
                f"PagedKVCacheManager.fetch: batch of {len(seq_ids)} sequences; expected 1..{self.max_batch_size}"
            )
        needed = 0
        for sid, n in zip(seq_ids, counts):
            self._check(sid, "fetch")
            total = self._lengths[sid] + n
            if total > self.max_seq_len:
                raise ValueError(
                    f"PagedKVCacheManager.fetch: sequence {sid} would hold {total} tokens, more than "
                    f"max_seq_len={self.max_seq_len}"
                )
            needed += max(0, math.ceil(total / self.page_size) - len(self._pages[sid]))
        if needed > len(self._free):
            # Checked before allocating anything, so a failed fetch changes nothing.
            raise RuntimeError(
                f"PagedKVCacheManager.fetch: out of pages (need {needed}, {len(self._free)} free of "
                f"{self.total_num_pages}); release sequences or make the pool larger"
            )
        lookup = np.zeros((len(seq_ids), self.max_pages_per_seq), np.uint32)
        for row, (sid, n) in enumerate(zip(seq_ids, counts)):
            pages = self._pages[sid]
            while len(pages) * self.page_size < self._lengths[sid] + n:
                pages.append(self._free.pop(0))
            lookup[row, : len(pages)] = pages
        lengths = np.array([self._lengths[s] for s in seq_ids], np.uint32)
        max_lengths = np.array([[max(counts), int((lengths + np.array(counts)).max())]], np.uint32)
        return RaggedKVCacheInputs(
            self.blocks, Tensor.from_numpy(lengths), Tensor.from_numpy(lookup), Tensor.from_numpy(max_lengths)
        )

    def step(self, seq_ids: Sequence[int], num_new_tokens: Sequence[int]) -> None:
        """Commit a step that ran: each sequence's cache grew by its new tokens."""
        for sid, n in zip(seq_ids, num_new_tokens):
            self._check(sid, "step")
            if self._lengths[sid] + int(n) > len(self._pages[sid]) * self.page_size:
                raise ValueError(
                    f"PagedKVCacheManager.step: sequence {sid} has no pages for {n} more tokens; call fetch() first"
                )
            self._lengths[sid] += int(n)

    def input_types(self) -> list[Any]:
        """Graph input types of the cache (`KVCacheParams.input_types` on this pool's device)."""
        return self.params.input_types(DeviceRef.from_device(self.device))
