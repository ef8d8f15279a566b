"""Per-call choice between the Pallas kernels and the jnp reference.

Rule (`custom_calls._dispatch`, shared with `custom_calls.attention.dispatch`):

* ``MAXFX_PALLAS_INTERPRET=1`` (any value but ``""``/``"0"``): the Pallas
  kernel in interpret mode, on any backend (how CPU tests exercise kernels).
* else, when JAX's default backend is a GPU or the program is being lowered
  for CUDA (`custom_calls._target.lowering_for`): ``lax.platform_dependent`` with
  the Pallas (Triton) kernel for ``cuda`` and the reference as the default, so a
  computation placed on the CPU of a GPU machine still lowers.
* else, on a CPU: for Q4_0, Q4_K and Q8_0 with a float32 ``lhs``, the C++ kernels of
  `custom_calls.qmatmul.cpu`, which read the blocks in place and take integer
  block dots (``lhs`` rounded to int16 per 32 values: decode and prefill);
  when they could not be built with their AVX-512 VNNI path, the reference.
* else: the reference (`custom_calls.qmatmul.reference`).

Errors and fallbacks when a kernel would be used:

* malformed operands (unknown encoding, rhs not whole blocks, K mismatch,
  non-float ``lhs``): ``ValueError`` naming the parameter, the same on every path;
* no kernel for the case (GPTQ ``group_size`` not a power of two
  ≥ 32; float64 ``lhs``; an empty ``lhs``): the reference, logged, with a
  one-time ``UserWarning`` per (function, reason) (`custom_calls._dispatch.fallback`).

Weights: the kernels read a *prepared* layout (``pallas_gguf.prepare``,
``pallas_gptq.prepare_gptq``/``prepare_int8``). For a concrete ``jax.Array``
weight the prepared form is cached (keyed by the array object, dropped when
it is garbage collected), so repacking happens once per weight. A traced
weight (inside ``jit``) is repacked in the graph on every call (one extra
elementwise pass over the packed bytes); hot paths should call
`qmatmul_prepared` with a weight prepared once at load time.

Gradients: the kernels sit in a ``jax.custom_vjp`` whose backward pass is
``dy @ dequantize(W)`` (XLA); weights get no gradient.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from custom_calls import cpu as cpu_library
from custom_calls._dispatch import ENV_INTERPRET, LOG, kernel_mode, reset_warnings, run
from custom_calls.qmatmul import cpu, pallas_gguf, pallas_gptq
from custom_calls.qmatmul import reference as ref
from custom_calls.qmatmul._pallas_core import KernelConfig, PreparedWeight

__all__ = [
    "ENV_INTERPRET",
    "kernel_mode",
    "qmatmul",
    "q8_0_matmul",
    "gptq_qmatmul",
    "int8_qmatmul",
    "qmatmul_prepared",
    "prepare",
    "clear_cache",
    "reset_warnings",
]

_cache: dict[tuple, tuple[tuple, PreparedWeight]] = {}


def clear_cache() -> None:
    """Drop every cached prepared weight (and forget which fallback warnings were shown)."""
    _cache.clear()
    reset_warnings()


def _concrete(x: Any) -> bool:
    return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)


def _cached(key: tuple, arrays: tuple, build: Callable[[], PreparedWeight]) -> PreparedWeight:
    """``build()`` once per tuple of concrete jax arrays (by identity); tracers/numpy rebuild each call."""
    live = [a for a in arrays if a is not None]
    if not live or not all(_concrete(a) for a in live):
        return build()
    full = key + tuple(id(a) for a in arrays)
    hit = _cache.get(full)
    if hit is not None and all(r() is a for r, a in zip(hit[0], live)):
        return hit[1]
    w = build()
    refs = tuple(weakref.ref(a, lambda _, k=full: _cache.pop(k, None)) for a in live)
    _cache[full] = (refs, w)
    return w


def _check_lhs(fn: str, lhs: jax.Array) -> str | None:
    """A fallback reason, or None when the kernel applies; raises for unusable dtypes."""
    if not jnp.issubdtype(lhs.dtype, jnp.floating):
        raise ValueError(f"{fn}: lhs must be a floating-point array, got {lhs.dtype}")
    if lhs.dtype == jnp.float64:
        return "float64 lhs has no kernel"
    if lhs.size == 0:
        return "empty lhs"
    return None


def _with_grad(kernel: Callable, dequant_nt: Callable) -> Callable:
    """``kernel(lhs, w, raw)`` made differentiable in ``lhs``: ``dx = dy @ dequant_nt(raw)`` (``[N, K]``)."""

    @jax.custom_vjp
    def f(lhs, w, raw):
        return kernel(lhs, w)

    def fwd(lhs, w, raw):
        return kernel(lhs, w), raw

    def bwd(raw, dy):
        wt = dequant_nt(raw)
        dx = lax.dot_general(
            dy.astype(jnp.float32), wt, (((dy.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
        return dx.astype(dy.dtype), None, None

    f.defvjp(fwd, bwd)
    return f


def _kernel(kernel: Callable, dequant_nt: Callable, w_fn: Callable) -> Callable:
    """The Pallas path for `custom_calls._dispatch.run`: ``kernel(lhs, w_fn(), interpret)`` with `_with_grad`'s
    gradient.

    Its operands are ``(lhs, raw)``: ``w_fn()`` builds the prepared weight inside
    the path that runs the kernel (the ``cuda`` branch on a GPU).
    """

    def path(x, raw, *, interpret: bool):
        return _with_grad(lambda x_, w: kernel(x_, w, interpret), dequant_nt)(x, w_fn(), raw)

    return path


def _cpu_kernel_applies(lhs: jax.Array) -> bool:
    """A non-empty float32 ``lhs`` on a CPU backend, and the kernels built with their fast path
    (`custom_calls.qmatmul.cpu`).
    """
    return lhs.dtype == jnp.float32 and lhs.size > 0 and cpu_library.callable_here() and cpu_library.qgemv_is_fast()


# Float32 weights from this many elements (64 KB) on: smaller products stay with XLA.
_F32_KERNEL_MIN_WEIGHTS = 1 << 14


def float_matmul_nt(lhs: jax.Array, rhs: jax.Array) -> jax.Array | None:
    """``lhs @ rhs.T`` on the CPU kernel (`cpu.f32_matmul`) when it applies, else None.

    It applies to float32 products with at most `cpu.FEW_ROWS` rows of ``lhs`` (a
    decode step's projections) and a 2-D ``rhs`` of 64 KB or more, on a CPU whose
    kernels were built with their fast path: there XLA runs each such product on
    one thread unless another one runs beside it.

    Example:
        >>> import jax.numpy as jnp
        >>> float_matmul_nt(jnp.ones((1, 8)), jnp.ones((4, 8))) is None  # too small: XLA's
        True
    """
    if lhs.dtype != jnp.float32 or rhs.dtype != jnp.float32 or rhs.ndim != 2 or rhs.size < _F32_KERNEL_MIN_WEIGHTS:
        return None
    if (
        lhs.size == 0
        or lhs.size // lhs.shape[-1] > cpu.FEW_ROWS
        or not (cpu_library.callable_here() and cpu_library.qgemv_is_fast())
    ):
        return None
    LOG.debug("matmul: CPU kernel (float32, %d rows)", lhs.size // lhs.shape[-1])
    return cpu.f32_matmul(lhs, rhs)


def q8_0_matmul(lhs: Any, values: Any, scales: Any) -> jax.Array:
    """``lhs @ W.T`` for Q8_0 ``W`` held split: int8 ``values [N, K]`` and float16 ``scales [N, K / 32]`` (decoded in
    float32).

    On a CPU with a float32 ``lhs``, the `custom_calls.qmatmul.cpu` kernel (reads
    the 8-bit values in place; ``lhs`` rounded to int16 per 32 values);
    elsewhere ``W`` decoded by XLA, then one float product.
    Gradients flow to ``lhs``.
    """
    lhs, values, scales = jnp.asarray(lhs), jnp.asarray(values), jnp.asarray(scales)

    def decoded(parts):
        q, d = parts
        w = q.astype(jnp.float32).reshape(*q.shape[:-1], -1, 32) * d.astype(jnp.float32)[..., None]
        return w.reshape(q.shape)

    def cpu_kernel(x, parts):
        return (
            _with_grad(lambda x_, w: cpu.q8_0_matmul(x_, *w), decoded)(x, parts, parts)
            if _cpu_kernel_applies(x)
            else None
        )

    return run(
        "q8_0_matmul",
        None,
        (lhs, (values, scales)),
        None,
        lambda x, parts: ref._matmul_nt(x, decoded(parts)),
        cpu=cpu_kernel,
    )


# GGUF rows the C++ CPU kernels read in place (Q8_0 goes through `q8_0_matmul`'s split form).
_CPU_KERNELS: dict[str, Callable] = {"Q4_0": cpu.q4_0_matmul, "Q4_K": cpu.q4_k_matmul}


def qmatmul(encoding: str, lhs: Any, rhs: Any) -> jax.Array:
    """``lhs @ dequantize(encoding, rhs).T`` (GGUF rows ``rhs uint8 [N, row_bytes]``), kernel or reference.

    Same contract as `reference.qmatmul`: ``lhs [..., K]`` → ``[..., N]`` in
    ``lhs``'s dtype, float32 accumulation. Kernels: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K.

    Raises:
        ValueError: unknown ``encoding``; ``rhs`` not a uint8 matrix of whole
            blocks; ``lhs`` K differs from rhs's or ``lhs`` is not floating.
    """
    lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
    elems, nbytes = ref.block_shape(encoding)
    if rhs.dtype != jnp.uint8 or rhs.ndim != 2 or rhs.shape[1] % nbytes:
        raise ValueError(
            f"rhs: {encoding} qmatmul needs uint8 [N, a multiple of {nbytes} bytes], got {rhs.dtype}{list(rhs.shape)}"
        )
    k = rhs.shape[1] // nbytes * elems
    if lhs.shape[-1:] != (k,):
        raise ValueError(
            f"lhs: {encoding} qmatmul lhs {list(lhs.shape)} does not match rhs {list(rhs.shape)} (K = {k})"
        )
    dequant_nt = lambda r: ref.dequantize(encoding, r)  # noqa: E731
    cpu_kernel = _CPU_KERNELS.get(encoding)

    def on_cpu(x, r):
        return (
            _with_grad(cpu_kernel, dequant_nt)(x, r, r) if cpu_kernel is not None and _cpu_kernel_applies(x) else None
        )

    return run(
        "qmatmul",
        None,
        (lhs, rhs),
        _kernel(
            lambda x, w, interp: pallas_gguf.qmatmul(encoding, x, w, interpret=interp),
            dequant_nt,
            lambda: _cached(("gguf", encoding), (rhs,), lambda: pallas_gguf.prepare(encoding, rhs)),
        ),
        lambda x, r: ref.qmatmul(encoding, x, r),
        lambda: _check_lhs("qmatmul", lhs),  # every encoding `ref.block_shape` accepts has a kernel
        cpu=on_cpu,
        cpu_label=encoding,
    )


def gptq_qmatmul(lhs: Any, packed: Any, perm_idx: Any = None, *, group_size: int) -> jax.Array:
    """``lhs @ W`` for MAX's packed GPTQ weight (``lhs`` already gathered by ``perm_idx``), kernel or reference.

    Same contract as `reference.gptq_qmatmul`. The kernel handles group sizes
    that are powers of two ≥ 32; others fall back (one-time warning).
    """
    lhs, packed = jnp.asarray(lhs), jnp.asarray(packed)
    if packed.dtype != jnp.uint8 or packed.ndim != 2:
        raise ValueError(f"packed: GPTQ packed weight must be a uint8 matrix, got {packed.dtype}{list(packed.shape)}")
    k = ref.gptq_packed_k(packed.shape[0], group_size)
    if lhs.shape[-1:] != (k,):
        raise ValueError(f"lhs: GPTQ qmatmul lhs {list(lhs.shape)} does not match the packed weight (K = {k})")
    perm = None if perm_idx is None else jnp.asarray(perm_idx)

    def why():
        reason = _check_lhs("gptq_qmatmul", lhs)
        if reason is None and not pallas_gptq.supported_group_size(group_size):
            reason = f"group_size {group_size} is not a power of two >= 32"
        return reason

    return run(
        "gptq_qmatmul",
        None,
        (lhs, (packed, perm)),
        _kernel(
            lambda x, w, interp: pallas_gptq.gptq_qmatmul(x, w, group_size=group_size, interpret=interp),
            lambda r: ref.gptq_dequantize_packed(r[0], r[1], group_size=group_size).T,
            lambda: _cached(
                ("gptq", group_size),
                (packed, perm),
                lambda: pallas_gptq.prepare_gptq(packed, perm, group_size=group_size),
            ),
        ),
        lambda x, r: ref.gptq_qmatmul(x, r[0], r[1], group_size=group_size),
        why,
    )


def int8_qmatmul(lhs: Any, weight: Any, scale: Any) -> jax.Array:
    """``lhs @ (weight * scale[:, None]).T`` for ``int8 [N, K]`` with per-output-channel ``scale [N]``."""
    lhs, weight, scale = jnp.asarray(lhs), jnp.asarray(weight), jnp.asarray(scale)
    ref._int8_check(weight, scale)
    if lhs.shape[-1:] != (weight.shape[1],):
        raise ValueError(f"lhs: int8 qmatmul lhs {list(lhs.shape)} does not match weight {list(weight.shape)}")
    return run(
        "int8_qmatmul",
        None,
        (lhs, (weight, scale)),
        _kernel(
            lambda x, w, interp: pallas_gptq.int8_qmatmul(x, w, interpret=interp),
            lambda r: ref.int8_dequantize(r[0], r[1]),
            lambda: _cached(("int8",), (weight, scale), lambda: pallas_gptq.prepare_int8(weight, scale)),
        ),
        lambda x, r: ref.int8_qmatmul(x, r[0], r[1]),
        lambda: _check_lhs("int8_qmatmul", lhs),
    )


def prepare(encoding: str, weight: Any, *extra: Any, group_size: int | None = None) -> PreparedWeight:
    """Repack a weight once for `qmatmul_prepared`.

    ``encoding``: a GGUF kernel encoding (``weight`` = raw rows), ``"GPTQ"``
    (``weight`` = packed, ``extra`` = optional ``perm_idx``, ``group_size``
    required) or ``"INT8"`` (``extra`` = ``scale``).
    """
    if encoding == "GPTQ":
        if group_size is None:
            raise ValueError("group_size: required for GPTQ")
        return pallas_gptq.prepare_gptq(weight, *extra, group_size=group_size)
    if encoding == "INT8":
        return pallas_gptq.prepare_int8(weight, *extra)
    return pallas_gguf.prepare(encoding, weight)


def qmatmul_prepared(lhs: Any, w: PreparedWeight, *, config: KernelConfig | None = None, interpret: bool | None = None):
    """``lhs @ dequant(w)^T`` on a `PreparedWeight`: always the Pallas kernel (no reference, no grad).

    ``interpret=None`` interprets unless the default backend is a GPU (or the
    env var forces it).
    """
    if interpret is None:
        interpret = kernel_mode() != "gpu"
    if w.fmt.startswith("GPTQ"):
        return pallas_gptq.gptq_qmatmul(lhs, w, group_size=w.meta[0], config=config, interpret=interpret)
    if w.fmt == "INT8":
        return pallas_gptq.int8_qmatmul(lhs, w, config=config, interpret=interpret)
    return pallas_gguf.qmatmul(w.fmt, lhs, w, config=config, interpret=interpret)
