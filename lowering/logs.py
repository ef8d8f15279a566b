"""maxfx's loggers: XLA compiles, executable-cache hits and misses, kernel fallbacks.

maxfx logs through the standard `logging` module under ``"maxfx"``:

* ``maxfx.compile`` (INFO): each XLA compile, what it was and how long it took;
* ``maxfx.cache`` (DEBUG): each in-memory executable-cache hit and miss (by the
  kind of program: ``block``, ``piece``, ``eager``, ``op``); INFO for a
  persistent (disk) cache hit, DEBUG for a disk miss, WARNING for a JAX
  compile-cache entry that fails its key or hash check (it is recompiled);
* ``maxfx.kernels`` (INFO): a Pallas kernel that falls back to the jnp
  reference, and why (DEBUG: which path each kernel call takes).

Nothing is printed unless the application configures logging: ``"maxfx"``
carries a `logging.NullHandler`, and every record but that one is below WARNING.

Example:
    >>> import logging
    >>> logging.basicConfig(level=logging.WARNING)  # doctest: +SKIP
    >>> logging.getLogger("maxfx").setLevel(logging.DEBUG)  # doctest: +SKIP
    >>> # ... run a graph: "maxfx.compile: compiled block 'mlp' in 0.041 s", then cache hits
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from lowering import persistent_cache

__all__ = ["CACHE_LOG", "COMPILE_LOG", "compiling"]

logging.getLogger("maxfx").addHandler(logging.NullHandler())
COMPILE_LOG = logging.getLogger("maxfx.compile")
CACHE_LOG = logging.getLogger("maxfx.cache")


@contextmanager
def compiling(what: str, name: str) -> Iterator[None]:
    """Bracket a compile: apply the environment's persistent cache before the process's first one
    (`lowering.persistent_cache.configure`), then log ``compiled <what> '<name>' in <seconds> s`` on ``maxfx.compile``.

    Example:
        >>> with compiling("block", "mlp"):
        ...     pass  # lower and compile here
    """
    persistent_cache.configure()
    start = time.perf_counter()
    yield
    COMPILE_LOG.info("compiled %s %r in %.3f s", what, name, time.perf_counter() - start)
