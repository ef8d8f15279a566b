"""Where compiled programs persist across processes: JAX's cache and maxfx's folder in it.

`enable_persistent_cache(path)` turns both levels on (see `lowering.compile` for
what each stores). ``MAXFX_COMPILATION_CACHE_DIR`` names a path to enable the
same way, applied by `configure` just before the process's first maxfx compile,
never at import: importing maxfx leaves the user's ``jax.config`` as it was.

Example:
    >>> from lowering import persistent_cache
    >>> persistent_cache.configure() is None  # nothing enabled, no environment variable
    True
"""

from __future__ import annotations

import os
import tempfile
import threading
import warnings
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

__all__ = ["CACHE_DIR_ENV", "configure", "disk_dir", "enable_persistent_cache", "enable_from_environment"]

CACHE_DIR_ENV = "MAXFX_COMPILATION_CACHE_DIR"

_disk_dir: Path | None = None
_environment_applied = False
_lock = threading.Lock()


def disk_dir() -> Path | None:
    """The maxfx level's folder (``<path>/maxfx``) when a cache is enabled, else None."""
    return _disk_dir


def enable_persistent_cache(path: str | os.PathLike) -> None:
    """Keep compiled programs in ``path`` across processes (see `lowering.compile`).

    Raises:
        OSError: ``path`` (or its ``maxfx`` subfolder) is not a directory that
            can be created and written; the message names the path. Nothing is
            enabled then.

    Example:
        >>> enable_persistent_cache("/tmp/maxfx-cache")  # doctest: +SKIP
    """
    global _disk_dir
    path = os.fspath(path)
    folder = _usable_cache_dir(path)
    jax.config.update("jax_compilation_cache_dir", path)
    # Cache every program: the default thresholds skip compiles under 1 s, i.e. most of them.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    compilation_cache.reset_cache()  # JAX decides once per process whether to use its cache; decide again
    _disk_dir = folder


def _usable_cache_dir(path: str) -> Path:
    """Create ``path/maxfx`` and prove it writable; returns it, or raises an OSError naming ``path``."""
    folder = Path(path) / "maxfx"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise type(e)(e.errno, f"compile cache directory {path!r} is not a writable directory ({e.strerror})") from e
    return folder


def enable_from_environment() -> None:
    """Enable the cache named by ``MAXFX_COMPILATION_CACHE_DIR``; a bad path warns once and leaves it off."""
    path = os.environ.get(CACHE_DIR_ENV)
    if not path:
        return
    try:
        enable_persistent_cache(path)
    except OSError as e:
        warnings.warn(f"{CACHE_DIR_ENV}={path!r}: {e.strerror}; the compile cache is disabled for this process", RuntimeWarning, stacklevel=2)


def configure() -> Path | None:
    """Apply the environment variable once per process (the first call), then return `disk_dir`.

    Every maxfx compile calls this first (`lowering.logs.compiling`, `lowering.compile`).
    """
    global _environment_applied
    if not _environment_applied:
        with _lock:
            if not _environment_applied:
                enable_from_environment()
                _environment_applied = True
    return _disk_dir
