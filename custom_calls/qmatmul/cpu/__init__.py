"""CPU kernels for GGUF quantized products with few rows (`qgemv.cc`), built with the machine's C++ compiler.

XLA's CPU backend decodes a packed weight into a float copy before every product
(4-8 bytes moved per weight); LLM decode at batch 1 is bound by memory, so these
kernels read the 8- or 4-bit blocks in place and decode them in registers
(`qgemv.cc` says how). They run through ``jax.ffi`` on XLA's own CPU thread pool.

Building: ``python -m custom_calls.qmatmul.cpu`` (the install step, ``make venv``)
compiles `qgemv.cc` with ``$CXX`` (default ``c++``), ``-O3 -march=native``, into
``_build/`` beside this file; a first use builds it too when it is missing (a file
lock keeps parallel processes from racing). No compiler, or a failed build: `available`
is False, the reason is logged on ``maxfx.kernels`` and the callers use the jnp
reference.

Example:
    >>> import numpy as np
    >>> from custom_calls.qmatmul import cpu
    >>> if cpu.available():
    ...     y = cpu.q4_0_matmul(np.ones((1, 32), np.float32), np.zeros((3, 18), np.uint8))
    ...     print(y.shape)
    (1, 3)
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
import jax.numpy as jnp

__all__ = ["MAX_ROWS", "available", "build", "q4_0_matmul", "q8_0_matmul", "unavailable_reason"]

MAX_ROWS = 16  # rows of x a call may have (the kernels keep one accumulator per row)

_SOURCE = Path(__file__).with_name("qgemv.cc")
_BUILD_DIR = Path(__file__).with_name("_build")
_TARGETS = {"maxfx_q8_0_matmul": "MaxfxQ8_0Matmul", "maxfx_q4_0_matmul": "MaxfxQ4_0Matmul"}
_LOG = logging.getLogger("maxfx.kernels")
_state: dict[str, Any] = {}


def _flags() -> list[str]:
    return ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-isystem", jax.ffi.include_dir()]


def _library_path(compiler: str) -> Path:
    """The library's file name holds a hash of what it is built from, so a change rebuilds it."""
    key = hashlib.sha256()
    for part in (_SOURCE.read_bytes(), compiler.encode(), " ".join(_flags()).encode(), jax.__version__.encode(), platform.machine().encode()):
        key.update(part)
    return _BUILD_DIR / f"libmaxfx_qgemv-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Compile `qgemv.cc` (once; later calls return the built file).

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
        cmd = [compiler, *_flags(), str(_SOURCE), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"building {_SOURCE.name} failed ({' '.join(cmd)}):\n{done.stderr[-4000:]}")
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
        _LOG.warning("CPU quantized kernels unavailable, using the jnp reference: %s", e)
        return False
    _state.update(ok=True, reason=None, lib=lib)
    return True


def available() -> bool:
    """Whether the kernels are built and registered (builds them on first call)."""
    return _load()


def unavailable_reason() -> str | None:
    """Why `available` is False (None when it is True or was not asked yet)."""
    return _state.get("reason")


def _call(target: str, x: Any, *weights: Any, n: int) -> jax.Array:
    x = jnp.asarray(x, jnp.float32)
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    out = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows.shape[0], n), jnp.float32))(rows, *weights)
    return out.reshape(*lead, n)


def q8_0_matmul(x: Any, values: Any, scales: Any) -> jax.Array:
    """``x @ W.T`` for ``x float32 [..., K]`` (at most `MAX_ROWS` rows) and Q8_0 ``W``: int8 ``values [N, K]``, float16 ``scales [N, K / 32]``."""
    if not _load():
        raise RuntimeError(f"CPU quantized kernels unavailable: {unavailable_reason()}")
    return _call("maxfx_q8_0_matmul", x, jnp.asarray(values, jnp.int8), jnp.asarray(scales, jnp.float16), n=int(values.shape[0]))


def q4_0_matmul(x: Any, packed: Any) -> jax.Array:
    """``x @ W.T`` for ``x float32 [..., K]`` (at most `MAX_ROWS` rows) and ``W`` as GGUF Q4_0 rows ``uint8 [N, K / 32 * 18]``."""
    if not _load():
        raise RuntimeError(f"CPU quantized kernels unavailable: {unavailable_reason()}")
    return _call("maxfx_q4_0_matmul", x, jnp.asarray(packed, jnp.uint8), n=int(packed.shape[0]))
