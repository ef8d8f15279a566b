"""Running the pipelines' coroutines from synchronous code, also inside a running event loop (Jupyter)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["run_sync"]


def run_sync[T](make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(make())``; when this thread already runs an event loop (a notebook cell,
    async code), the coroutine runs on a fresh loop in a worker thread instead.

    Example:
        >>> async def two():
        ...     return 2
        >>> run_sync(two)
        2
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
