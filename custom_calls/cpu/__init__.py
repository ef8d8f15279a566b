"""maxfx's CPU kernels (C++ behind ``jax.ffi``), built with the machine's C++ compiler.

Two kernels where XLA's CPU backend is slow for LLM generation:

- ``qgemv.cc``: GGUF Q8_0 / Q4_0 products (decode and prefill), reading the 8- or
  4-bit blocks in place (`custom_calls.qmatmul.cpu` is their Python side);
- ``decode_attention.cc``: one query per row against a paged KV pool through a
  page table, or a dense ``[B, L, Hkv, D]`` cache as one page a row
  (`custom_calls.attention.cpu`).

They run on XLA's own CPU thread pool (``parallel.h``).

Building: ``python -m custom_calls.cpu`` (the install step, ``make venv``)
compiles the sources with ``$CXX`` (default ``c++``), ``-O3 -march=native`` (``$MAXFX_CPU_MARCH`` overrides native),
into
one library in ``_build/`` beside this file; a first use builds it too when it is
missing (a file lock keeps parallel processes from racing). No compiler, or a
failed build: `available` is False, the reason is logged on ``maxfx.kernels``
and the callers use their jnp references.

Example:
    >>> from custom_calls import cpu
    >>> cpu.available() in (True, False)
    True
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jax

from custom_calls._target import exporting

__all__ = [
    "ENV_ENABLE",
    "ENV_MARCH",
    "available",
    "build",
    "callable_here",
    "qgemv_is_fast",
    "qgemv_path",
    "unavailable_reason",
    "use_amx",
]

_HERE = Path(__file__).parent
_SOURCES = (_HERE / "qgemv.cc", _HERE / "decode_attention.cc")
_HEADERS = (_HERE / "parallel.h", _HERE / "simd.h")
_BUILD_DIR = _HERE / "_build"
# FFI target name -> the library's handler symbol.
_TARGETS = {
    "maxfx_q8_0_matmul": "MaxfxQ8_0Matmul",
    "maxfx_q4_0_matmul": "MaxfxQ4_0Matmul",
    "maxfx_q4_k_matmul": "MaxfxQ4_KMatmul",
    "maxfx_f32_matmul": "MaxfxF32Matmul",
    "maxfx_paged_decode_attention": "MaxfxPagedDecodeAttention",
}
_LOG = logging.getLogger("maxfx.kernels")
# The -march the library is built for (default: native). Another value builds a
# second library beside the first, e.g. x86-64-v3 (the AVX2 path) or x86-64-v2
# (the scalar loops) to run the portable code paths.
ENV_MARCH = "MAXFX_CPU_MARCH"
# "0" keeps traced programs off the kernels (the jnp references, float products
# throughout); read when a program is traced, so set it before the first run
# (programs already compiled keep what they were traced with).
ENV_ENABLE = "MAXFX_CPU_KERNELS"
_state: dict[str, Any] = {}


def _flags() -> list[str]:
    return [
        "-O3",
        f"-march={os.environ.get(ENV_MARCH) or 'native'}",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-isystem",
        jax.ffi.include_dir(),
        "-I",
        str(_HERE),
    ]


def _library_path(compiler: str) -> Path:
    """The library's file name holds a hash of what it is built from, so a change rebuilds it."""
    key = hashlib.sha256()
    for part in (
        *(f.read_bytes() for f in (*_SOURCES, *_HEADERS)),
        compiler.encode(),
        " ".join(_flags()).encode(),
        jax.__version__.encode(),
        platform.machine().encode(),
    ):
        key.update(part)
    return _BUILD_DIR / f"libmaxfx_cpu-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Compile the kernels (once; later calls return the built file).

    Raises:
        RuntimeError: no C++ compiler, or the compiler failed (its message included).
    """
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler ({compiler!r} not found; set CXX)")
    target = _library_path(compiler)
    if target.exists():
        return target
    _BUILD_DIR.mkdir(exist_ok=True)
    with open(_BUILD_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same file
        if target.exists():
            return target
        fd, tmp = tempfile.mkstemp(dir=_BUILD_DIR, suffix=".so")
        os.close(fd)
        cmd = [compiler, *_flags(), *map(str, _SOURCES), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"building the CPU kernels failed ({' '.join(cmd)}):\n{done.stderr[-4000:]}")
        os.replace(tmp, target)
    return target


def _load() -> bool:
    if "ok" in _state:
        return _state["ok"]
    try:
        lib = ctypes.cdll.LoadLibrary(str(build()))
        for name, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    except (RuntimeError, OSError, AttributeError) as e:
        _state.update(ok=False, reason=str(e))
        _LOG.warning("CPU kernels unavailable, using the jnp references: %s", e)
        return False
    _state.update(ok=True, reason=None, lib=lib)
    return True


def available() -> bool:
    """Whether the kernels are built and registered (builds them on first call)."""
    return _load()


def qgemv_is_fast() -> bool:
    """Whether the quantized products were built with their AVX-512 VNNI path.

    Without it they run a portable scalar loop with the same numbers, slower than
    XLA's dequantize-then-dot, so the dispatch then prefers XLA.

    Example:
        >>> from custom_calls import cpu
        >>> cpu.qgemv_is_fast() in (True, False)
        True
    """
    return _load() and bool(_state["lib"].MaxfxQgemvIsFast())


_PATHS = {3: "amx", 2: "avx512-vnni", 1: "avx2", 0: "scalar"}


def qgemv_path() -> str | None:
    """The instruction set batched quantized products run on: "amx" (Intel AMX,
    Sapphire Rapids and later), "avx512-vnni", "avx2" or "scalar"; None unbuilt.

    Example:
        >>> from custom_calls import cpu
        >>> cpu.qgemv_path() in ("amx", "avx512-vnni", "avx2", "scalar", None)
        True
    """
    return _PATHS[_state["lib"].MaxfxQgemvPath()] if _load() else None


def use_amx(on: bool) -> bool:
    """Switches the AMX path of the quantized products on or off (benchmarks time
    it beside the AVX-512 one in one process); returns whether it was on.

    Example:
        >>> from custom_calls import cpu
        >>> was = cpu.use_amx(False); _ = cpu.use_amx(was)
    """
    return _load() and bool(_state["lib"].MaxfxQgemvUseAmx(int(bool(on))))


def unavailable_reason() -> str | None:
    """Why `available` is False (None when it is True or was not asked yet)."""
    return _state.get("reason")


def callable_here() -> bool:
    """Whether the program being traced may call the kernels: a CPU backend, not an
    export (an artifact must run where the library is not built), not switched
    off (``MAXFX_CPU_KERNELS=0``), and the library built.

    Example:
        >>> from custom_calls import cpu
        >>> cpu.callable_here() in (True, False)
        True
    """
    if jax.default_backend() != "cpu" or exporting() or os.environ.get(ENV_ENABLE, "") == "0":
        return False
    if not available():
        _LOG.debug("CPU kernels unavailable (%s); jnp reference", unavailable_reason())
        return False
    return True
