"""The one cache of compiled XLA executables.

Graphs loaded by an `InferenceSession`, compiled Modules and realized eager
work all keep their executables here: one bounded, least-recently-used table,
so a long-running process that builds many graph shapes holds at most
``capacity`` executables however it runs them. Keys are tuples whose first
item names the mode that made them (``"block"``, ``"eager"``), so modes never
collide.

Example:
    >>> cache = ExecutableCache(capacity=2)
    >>> cache.put(("eager", 1), "exe1"); cache.put(("eager", 2), "exe2")
    >>> cache.get(("eager", 1))  # a hit makes the entry the most recent
    'exe1'
    >>> cache.put(("eager", 3), "exe3")  # evicts the least recently used: 2
    >>> cache.get(("eager", 2)) is None, len(cache)
    (True, 2)
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any

from lowering.logs import CACHE_LOG

__all__ = ["ExecutableCache", "EXECUTABLES"]


class ExecutableCache:
    """A thread-safe LRU table of executables, at most ``capacity`` entries."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"ExecutableCache: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._on_clear: list[Callable[[], None]] = []

    def get(self, key: Hashable) -> Any | None:
        """The executable under ``key`` (now the most recent), or None."""
        # The hot path of every eager step: single OrderedDict operations are atomic
        # under the GIL, so a hit takes no lock (a concurrent eviction is a miss).
        exe = self._entries.get(key)
        if exe is not None:
            try:
                self._entries.move_to_end(key)
            except KeyError:
                pass
        if CACHE_LOG.isEnabledFor(logging.DEBUG):  # one check on the hot path when logging is off
            CACHE_LOG.debug("%s %s", "miss" if exe is None else "hit", _kind(key))
        return exe

    def put(self, key: Hashable, exe: Any) -> None:
        """Keep ``exe`` under ``key``, evicting the least recently used beyond capacity."""
        with self._lock:
            self._entries[key] = exe
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Drop every executable (and every shortcut to one that `on_clear` registered)."""
        with self._lock:
            self._entries.clear()
        for forget in self._on_clear:
            forget()

    def on_clear(self, forget: Callable[[], None]) -> None:
        """Call ``forget`` whenever the cache is cleared (for tables that hold entries of it)."""
        self._on_clear.append(forget)

    def __len__(self) -> int:
        return len(self._entries)


def _kind(key: Hashable) -> Any:
    """The mode a key names (its first item), for the log: the rest is large and opaque."""
    return key[0] if isinstance(key, tuple) and key else key


EXECUTABLES = ExecutableCache(capacity=1024)
"""The process-wide table every mode uses."""
