"""Where compiled programs persist across processes: JAX's cache and maxfx's folder in it.

`enable_persistent_cache(path)` turns both levels on (see `lowering.compile` for
what each stores). ``MAXFX_COMPILATION_CACHE_DIR`` names a path to enable the
same way, applied by `configure` just before the process's first maxfx compile,
never at import: importing maxfx leaves the user's ``jax.config`` as it was.

Entries at both levels are written by `encode_entry` and read by `decode_entry`,
so each names its key. JAX's own files carry none: one swapped under another
key's name would load as that key's executable. Here it fails the check, is
logged as a WARNING on ``maxfx.cache``, deleted and recompiled.

Example:
    >>> from lowering import persistent_cache
    >>> persistent_cache.configure() is None  # nothing enabled, no environment variable
    True
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
import threading
import warnings
from pathlib import Path

import jax
from jax._src import compilation_cache as jax_cache  # JAX offers no public hook for the object its cache reads through
from jax._src.compilation_cache_interface import CacheInterface
from jax._src.lru_cache import LRUCache
from jax.experimental.compilation_cache import compilation_cache

__all__ = [
    "CACHE_DIR_ENV",
    "DamagedEntryError",
    "configure",
    "decode_entry",
    "disk_dir",
    "enable_persistent_cache",
    "enable_from_environment",
    "encode_entry",
]

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
    _read_jax_cache_through_keys(path)
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
        warnings.warn(
            f"{CACHE_DIR_ENV}={path!r}: {e.strerror}; the compile cache is disabled for this process",
            RuntimeWarning,
            stacklevel=2,
        )


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


# ─── entries: both levels store each payload behind a header naming its key ──

# Header: magic, format version, the entry's key, SHA-256 of the payload, payload length.
ENTRY_MAGIC = b"MAXFXCC\x00"
ENTRY_VERSION = 1
ENTRY_HEADER = struct.Struct(">8sH32s32sQ")


class DamagedEntryError(ValueError):
    """A cache entry that is not a whole, current-format entry for the key it was read for."""


def encode_entry(key: bytes, payload: bytes) -> bytes:
    """The bytes of an entry holding ``payload`` under ``key`` (32 bytes).

    Example:
        >>> entry = encode_entry(bytes(32), b"program")
        >>> decode_entry(entry, bytes(32))
        b'program'
    """
    return ENTRY_HEADER.pack(ENTRY_MAGIC, ENTRY_VERSION, key, hashlib.sha256(payload).digest(), len(payload)) + payload


def decode_entry(data: bytes, key: bytes) -> bytes:
    """The payload of entry ``data`` read for ``key``; every header field and the payload hash are checked first.

    Raises:
        DamagedEntryError: naming what does not match (a foreign, damaged, truncated or older-format entry).
    """
    if len(data) < ENTRY_HEADER.size:
        raise DamagedEntryError(f"entry is {len(data)} bytes, shorter than its {ENTRY_HEADER.size}-byte header")
    magic, version, stored_key, digest, size = ENTRY_HEADER.unpack_from(data)
    payload = data[ENTRY_HEADER.size :]
    if magic != ENTRY_MAGIC:
        raise DamagedEntryError(f"magic {magic!r}, expected {ENTRY_MAGIC!r}")
    if version != ENTRY_VERSION:
        raise DamagedEntryError(f"format version {version}, expected {ENTRY_VERSION}")
    if stored_key != key:
        raise DamagedEntryError(f"entry is for key {stored_key.hex()[:16]}..., expected {key.hex()[:16]}...")
    if size != len(payload):
        raise DamagedEntryError(f"header says {size} payload bytes, the entry has {len(payload)}")
    if hashlib.sha256(payload).digest() != digest:
        raise DamagedEntryError("payload SHA-256 does not match the header")
    return payload


# lowering.logs.CACHE_LOG; lowering.logs imports this module, so the logger is fetched by name.
_LOG = logging.getLogger("maxfx.cache")


class _KeyedJaxCache(CacheInterface):
    """JAX's file cache (``<path>/<key>-cache``) with every value stored as an entry for its key."""

    def __init__(self, files: LRUCache):
        self._files = files
        self._path = files._path

    def get(self, key: str) -> bytes | None:
        data = self._files.get(key)
        if data is None:
            return None
        try:
            return decode_entry(data, _jax_entry_key(key))
        except DamagedEntryError as e:
            path = self._path / f"{key}-cache"
            _LOG.warning("rejected JAX compile-cache entry %s (%s); recompiling it", path, e)
            try:
                path.unlink()  # LRUCache.put never replaces a file: remove this one so the rebuilt executable is stored
            except OSError:
                pass
            return None

    def put(self, key: str, value: bytes) -> None:
        self._files.put(key, encode_entry(_jax_entry_key(key), value))


def _jax_entry_key(key: str) -> bytes:
    """The 32-byte key a JAX entry's header carries: SHA-256 of JAX's key (the file name without ``-cache``)."""
    return hashlib.sha256(key.encode()).digest()


def _read_jax_cache_through_keys(path: str) -> None:
    """Make JAX's level at ``path`` read and write through `_KeyedJaxCache` (as `jax_cache._initialize_cache` would,
    wrapped).
    """
    cache: CacheInterface = _KeyedJaxCache(LRUCache(path, max_size=jax.config.jax_compilation_cache_max_size))
    if jax.config.jax_compilation_cache_check_contents:
        cache = jax_cache.VerificationCache(cache)
    with jax_cache._cache_initialized_mutex:
        jax_cache._cache = cache
        jax_cache._cache_initialized = True
