"""Minimal non-blocking queue protocols and the helpers that drain them."""

from __future__ import annotations

import queue
import time
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["MAXPullQueue", "MAXPushQueue", "drain_queue", "get_blocking"]

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)
_T_contra = TypeVar("_T_contra", contravariant=True)


@runtime_checkable
class MAXPullQueue(Protocol[_T_co]):
    """Consumer side of a queue: ``get_nowait()`` pops an item or raises ``queue.Empty``.

    ``queue.Queue``, ``asyncio.Queue`` and ``multiprocessing`` queues all satisfy it.

    Example::

        >>> import queue
        >>> isinstance(queue.Queue(), MAXPullQueue)
        True
    """

    def get_nowait(self) -> _T_co:
        """Remove and return an item without blocking; raise ``queue.Empty`` when there is none.

        The default calls ``self.get(block=False)`` (``queue.Queue``'s blocking API).
        """
        if not callable(getattr(self, "get", None)):
            raise TypeError(f"{type(self).__name__} must implement get_nowait() (or get(block=...))")
        return self.get(block=False)


@runtime_checkable
class MAXPushQueue(Protocol[_T_contra]):
    """Producer side of a queue: ``put_nowait(item)`` enqueues or fails at once (e.g. ``queue.Full``).

    Example::

        >>> import queue
        >>> isinstance(queue.Queue(), MAXPushQueue)
        True
    """

    def put_nowait(self, item: _T_contra) -> None:
        """Enqueue ``item`` without waiting; raise if it cannot be added now.

        The default calls ``self.put(item, block=False)`` (``queue.Queue``'s blocking API).
        """
        if not callable(getattr(self, "put", None)):
            raise TypeError(f"{type(self).__name__} must implement put_nowait(item) (or put(item, block=...))")
        self.put(item, block=False)


def drain_queue(pull_queue: MAXPullQueue[_T], max_items: int | None = None) -> list[_T]:  # noqa: UP047
    """Pop items without blocking until the queue is empty or ``max_items`` were taken.

    Example::

        >>> import queue
        >>> q = queue.Queue()
        >>> for i in range(5): q.put(i)
        >>> drain_queue(q, max_items=2), drain_queue(q), drain_queue(q)
        ([0, 1], [2, 3, 4], [])
    """
    if max_items is not None and (isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 0):
        raise ValueError(f"drain_queue: max_items must be None or an int >= 0, got {max_items!r}")
    items: list[_T] = []
    while max_items is None or len(items) < max_items:
        try:
            items.append(pull_queue.get_nowait())
        except queue.Empty:
            break
    return items


def get_blocking(pull_queue: MAXPullQueue[_T]) -> _T:  # noqa: UP047
    """Return the next item, spinning (with a short sleep that backs off to 1 ms) until one arrives.

    Example::

        >>> import queue
        >>> q = queue.Queue(); q.put("x")
        >>> get_blocking(q)
        'x'
    """
    delay = 0.0
    while True:
        try:
            return pull_queue.get_nowait()
        except queue.Empty:
            time.sleep(delay)
            delay = min(0.001, delay + 0.0001)
