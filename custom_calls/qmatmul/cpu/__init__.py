"""GGUF Q8_0 / Q4_0 products on the CPU: the Python side of ``custom_calls/cpu/qgemv.cc``.

XLA's CPU backend decodes a packed weight into a float copy before every product
(4-8 bytes moved per weight); LLM decode at batch 1 is bound by memory, so these
kernels read the 8- or 4-bit blocks in place. They round each row of ``x`` to
int16 per 32 values (a float32 scale each) and take integer dot products with
AVX-512 VNNI: one accumulator per row of ``x`` up to 4 rows (decode of a few
sequences), a blocked product beyond (batched decode, prefill). Results differ from float products by that 16-bit
rounding, at most 2^-16 of a block's largest ``|x|`` per value (`qgemv.cc`
says how). Built and registered by `custom_calls.cpu`.

Example:
    >>> import numpy as np
    >>> from custom_calls.qmatmul import cpu
    >>> if cpu.available():
    ...     y = cpu.q4_0_matmul(np.ones((1, 32), np.float32), np.zeros((3, 18), np.uint8))
    ...     print(y.shape)
    (1, 3)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from custom_calls.cpu import available, build, unavailable_reason

__all__ = [
    "FEW_ROWS",
    "available",
    "build",
    "f32_matmul",
    "q4_0_matmul",
    "q4_k_matmul",
    "q8_0_matmul",
    "unavailable_reason",
]


def _call(target: str, x: Any, *weights: Any, n: int) -> jax.Array:
    x = jnp.asarray(x, jnp.float32)
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    # Under vmap the kernel runs once per batch element (the weights stay 2-D).
    out = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows.shape[0], n), jnp.float32), vmap_method="sequential")(
        rows, *weights
    )
    return out.reshape(*lead, n)


def q8_0_matmul(x: Any, values: Any, scales: Any) -> jax.Array:
    """``x @ W.T`` for ``x float32 [..., K]`` and Q8_0 ``W``: int8 ``values [N, K]``, float16 ``scales [N, K / 32]``."""
    if not available():
        raise RuntimeError(f"CPU quantized kernels unavailable: {unavailable_reason()}")
    return _call(
        "maxfx_q8_0_matmul", x, jnp.asarray(values, jnp.int8), jnp.asarray(scales, jnp.float16), n=int(values.shape[0])
    )


def q4_0_matmul(x: Any, packed: Any) -> jax.Array:
    """``x @ W.T`` for ``x float32 [..., K]`` and ``W`` as GGUF Q4_0 rows ``uint8 [N, K / 32 * 18]``."""
    if not available():
        raise RuntimeError(f"CPU quantized kernels unavailable: {unavailable_reason()}")
    return _call("maxfx_q4_0_matmul", x, jnp.asarray(packed, jnp.uint8), n=int(packed.shape[0]))


def q4_k_matmul(x: Any, packed: Any) -> jax.Array:
    """``x @ W.T`` for ``x float32 [..., K]`` and ``W`` as GGUF Q4_K rows ``uint8 [N, K / 256 * 144]``."""
    if not available():
        raise RuntimeError(f"CPU quantized kernels unavailable: {unavailable_reason()}")
    return _call("maxfx_q4_k_matmul", x, jnp.asarray(packed, jnp.uint8), n=int(packed.shape[0]))


# Rows of x up to which `f32_matmul` is used (decode); beyond, XLA's GEMM.
FEW_ROWS = 16


def f32_matmul(x: Any, w: Any) -> jax.Array:
    """``x @ w.T`` for ``x float32 [..., K]`` and ``w float32 [N, K]`` (a few rows of x: decode).

    Differentiable: the backward pass is XLA's float products.
    """
    if not available():
        raise RuntimeError(f"CPU kernels unavailable: {unavailable_reason()}")
    return _f32_matmul(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32))


@jax.custom_vjp
def _f32_matmul(x, w):
    return _call("maxfx_f32_matmul", x, w, n=int(w.shape[0]))


def _f32_fwd(x, w):
    return _f32_matmul(x, w), (x, w)


def _f32_bwd(res, dy):
    x, w = res
    hi = jax.lax.Precision.HIGHEST
    dx = jnp.matmul(dy, w, precision=hi)
    dw = jnp.matmul(dy.reshape(-1, dy.shape[-1]).T, x.reshape(-1, x.shape[-1]), precision=hi)
    return dx, dw


_f32_matmul.defvjp(_f32_fwd, _f32_bwd)
