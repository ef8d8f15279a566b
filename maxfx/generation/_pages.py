"""`PagePool`: the host-side allocator of the engine's paged KV cache, with prefix caching.

The device holds, per layer, ``num_pages`` pages of ``page_size`` token slots.
This class decides which pages a request owns; it never touches device memory.

- Page 0 is the *scratch* page: padded tokens of a fixed-shape step write there,
  so they never land in a real page.
- Pages are reference counted. A page whose ``page_size`` slots are all written
  is *sealed* under a key: a hash of its tokens and of the key of the page before
  it, so a key names the whole prefix up to the page's end. A new request whose
  prompt starts with the same tokens takes the sealed pages instead of computing
  them again (`match_prefix`).
- A released sealed page stays cached (least recently used first out) until the
  pool needs it; other released pages go back to the free list.

Example:
    >>> pool = PagePool(num_pages=9, page_size=4, enable_prefix_caching=True)
    >>> pages = pool.allocate(2)
    >>> pool.seal(pages, list(range(8)))  # two full pages sealed
    2
    >>> pool.release(pages)
    >>> pool.match_prefix(list(range(10)))  # the two sealed pages cover 8 tokens
    [1, 2]
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["OutOfPagesError", "PagePool", "PrefixCacheStats"]


class OutOfPagesError(RuntimeError):
    """The pool has fewer free (or evictable) pages than asked for; nothing was allocated."""


@dataclass
class PrefixCacheStats:
    """Prefix-cache counters: tokens looked up, tokens found in cached pages, pages evicted."""

    queried_tokens: int = 0
    hit_tokens: int = 0
    evicted_pages: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of looked-up prompt tokens served from cached pages."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def _page_key(parent: int | None, tokens: Sequence[int]) -> int:
    return hash((parent, tuple(tokens)))


class PagePool:
    """Reference-counted pages with an LRU cache of sealed (full, hashed) pages.

    Args:
        num_pages: pages in the pool, including the scratch page 0 (>= 2).
        page_size: token slots per page (>= 1).
        enable_prefix_caching: seal full pages and reuse them across requests.
    """

    SCRATCH = 0

    def __init__(self, num_pages: int, page_size: int, enable_prefix_caching: bool = False):
        if int(num_pages) < 2:
            raise ValueError(f"PagePool: num_pages must be >= 2 (page 0 is scratch), got {num_pages}")
        if int(page_size) < 1:
            raise ValueError(f"PagePool: page_size must be >= 1, got {page_size}")
        self.num_pages, self.page_size = int(num_pages), int(page_size)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._free: collections.deque[int] = collections.deque(range(1, self.num_pages))
        self._refs = [0] * self.num_pages
        self._key_of: dict[int, int] = {}  # sealed page -> key
        self._page_of: dict[int, int] = {}  # key -> sealed page
        self._cached: collections.OrderedDict[int, None] = collections.OrderedDict()  # sealed, unreferenced, LRU first
        self.stats = PrefixCacheStats()

    # ── capacity ──
    @property
    def num_available(self) -> int:
        """Pages an allocation can take now: free ones plus cached ones it may evict."""
        return len(self._free) + len(self._cached)

    @property
    def num_used(self) -> int:
        """Pages referenced by some request."""
        return self.num_pages - 1 - self.num_available

    @property
    def usage(self) -> float:
        """Share of the usable pages (all but scratch) that requests hold."""
        return self.num_used / (self.num_pages - 1)

    def pages_for(self, num_tokens: int) -> int:
        """Pages that hold ``num_tokens`` token slots."""
        return -(-int(num_tokens) // self.page_size)

    # ── allocation ──
    def allocate(self, n: int) -> list[int]:
        """``n`` pages with one reference each; OutOfPagesError (and no change) when fewer are available."""
        n = int(n)
        if n > self.num_available:
            raise OutOfPagesError(f"PagePool: need {n} pages, {self.num_available} available of {self.num_pages - 1}")
        out = []
        for _ in range(n):
            if self._free:
                page = self._free.popleft()
            else:  # evict the least recently used cached prefix page
                page, _ = self._cached.popitem(last=False)
                del self._page_of[self._key_of.pop(page)]
                self.stats.evicted_pages += 1
            self._refs[page] = 1
            out.append(page)
        return out

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference from each page; unreferenced sealed pages stay cached, others are freed."""
        for page in pages:
            if page == self.SCRATCH or self._refs[page] <= 0:
                raise ValueError(f"PagePool.release: page {page} is not held")
            self._refs[page] -= 1
            if self._refs[page] == 0:
                if page in self._key_of:
                    self._cached[page] = None
                else:
                    self._free.append(page)

    # ── prefix caching ──
    def seal(self, pages: Sequence[int], tokens: Sequence[int], start_page: int = 0) -> int:
        """Key every full page of ``pages`` from ``start_page`` on by its tokens (``tokens`` covers them from position
        0).

        Returns the number of full pages now sealed (the next call can start there).
        A page whose key is already held by another page stays unsealed (its twin serves lookups).
        """
        if not self.enable_prefix_caching:
            return start_page
        full = min(len(pages), len(tokens) // self.page_size)
        parent = self._key_of.get(pages[start_page - 1]) if start_page else None
        for i in range(start_page, full):
            key = _page_key(parent, tokens[i * self.page_size : (i + 1) * self.page_size])
            page = pages[i]
            if page not in self._key_of and key not in self._page_of:
                self._key_of[page], self._page_of[key] = key, page
            parent = key
        return max(full, start_page)

    def match_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Take the cached pages that hold a prefix of ``tokens`` (one more reference each).

        At most ``(len(tokens) - 1) // page_size`` pages match: the last token is always
        computed again, since its logits are needed.
        """
        if not self.enable_prefix_caching:
            return []
        self.stats.queried_tokens += len(tokens)
        out: list[int] = []
        parent = None
        for i in range((len(tokens) - 1) // self.page_size):
            key = _page_key(parent, tokens[i * self.page_size : (i + 1) * self.page_size])
            page = self._page_of.get(key)
            if page is None:
                break
            if self._refs[page] == 0:
                del self._cached[page]
            self._refs[page] += 1
            out.append(page)
            parent = key
        self.stats.hit_tokens += len(out) * self.page_size
        return out

    def clear_prefix_cache(self) -> None:
        """Forget every cached (unreferenced) prefix page; referenced pages stay sealed."""
        for page in list(self._cached):
            del self._page_of[self._key_of.pop(page)]
            self._free.append(page)
        self._cached.clear()
