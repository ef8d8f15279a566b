"""The generic Triton-style Pallas dequant-matmul kernel shared by every packed format.

``y[M, N] = x[M, K] @ dequant(W)[N, K]^T`` where ``W`` is held in a *prepared*
(repacked, see `PreparedWeight`) structure-of-arrays layout. The kernel never
writes the dequantized matrix anywhere: each program streams its ``bn`` weight
rows chunk by chunk (``CHUNK = 256`` elements of K), decodes the chunk in
registers into ``parts`` float32 tiles ``[bn, part_width]`` (each format's
``decode`` function), and accumulates in float32:

- ``mode="dot"``: ``acc[bm, bn] += x_tile @ w_tile^T`` (``jnp.dot`` → ``tl.dot``,
  tensor cores), with ``swap=True`` computing ``acc[bn, bm] += w_tile @ x_tile^T``
  instead (the decoded weight becomes the register "A" operand). Used for
  M ≥ 2: decode rows are padded to ``bm = 16`` (Triton's minimum dot tile),
  prefill uses 64/128-row tiles.
- ``mode="fma"`` (M = 1): no dot; ``acc[bn, W] += w * x`` elementwise and one row
  reduction at the end. Cheapest ALU path for a bandwidth-bound GEMV.

Grid ``(Mp/bm, Np/bn, splits)``. With ``splits > 1`` each program covers
``n_chunks/splits`` chunks and writes float32 partials ``[splits, Mp, Np]`` that
XLA sums (split-K for decode shapes with few output tiles). Programs never
accumulate into a shared block (that would race on GPU).

Triton rules honoured (``shared/design/PALLAS_NOTES.md`` §2): every loaded or
computed tensor has power-of-two dims; weights are sliced on the *ref*
(``ref[:, pl.ds(...)]``), never as values; no ``concatenate``; arrays are
padded by the prepare step / wrapper so no load is out of bounds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from custom_calls._pallas import pl, pltriton

CHUNK = 256  # K elements decoded per loop step (one K-quant super-block)
N_ALIGN = 128  # prepared weights have N padded to a multiple of this (largest bn)

__all__ = [
    "CHUNK",
    "N_ALIGN",
    "Format",
    "KernelConfig",
    "PreparedWeight",
    "default_config",
    "matmul_checked",
    "matmul_prepared",
]


@dataclasses.dataclass(frozen=True)
class Format:
    """How a prepared weight is decoded inside the kernel.

    Attributes:
        name: e.g. ``"Q4_0"``.
        parts: tiles per chunk; ``parts * part_width == CHUNK``.
        part_width: K width of one decoded tile (a power of two).
        load: ``load(refs, t) -> tuple`` of the raw tiles of chunk ``t`` (a
            traced int32); ``refs`` are the plane refs in `PreparedWeight.planes`
            order. Loads of several chunks are issued before any is decoded.
        dequant: ``dequant(loaded, bn) -> [parts x float32 [bn, part_width]]``.
        row_scale: the last plane is a ``float32 [Np, 1]`` per-output-row scale
            applied to the accumulator at the end (int8 per channel), not by
            ``decode``.
    """

    name: str
    parts: int
    part_width: int
    load: Callable
    dequant: Callable
    row_scale: bool = False

    def decode(self, refs, t, bn):
        return self.dequant(self.load(refs, t), bn)


@jax.tree_util.register_pytree_node_class
class PreparedWeight:
    """A weight repacked once into the kernel's layout (a pytree: jit/vmap-safe).

    Attributes:
        fmt: the `Format` name (``"Q4_0"``, ``"Q8_0"``, ``"Q4_K"``, ``"Q5_K"``, ``"Q6_K"``,
            ``"GPTQ"``, ``"INT8"``).
        planes: the arrays the kernel reads, each ``[Np, cols]`` with
            ``Np = round_up(N, 128)``; see each format's ``prepare`` for the
            exact planes.
        n, k: the logical output rows and reduction length.
        kp: K padded to a multiple of ``CHUNK`` (padding rows have zero scale).
        meta: static extras (e.g. GPTQ group size).
    """

    def __init__(self, fmt: str, planes: Sequence[jax.Array], n: int, k: int, kp: int, meta: tuple = ()):
        self.fmt, self.planes, self.n, self.k, self.kp, self.meta = fmt, tuple(planes), n, k, kp, meta

    def tree_flatten(self):
        return self.planes, (self.fmt, self.n, self.k, self.kp, self.meta)

    @classmethod
    def tree_unflatten(cls, aux, planes):
        fmt, n, k, kp, meta = aux
        return cls(fmt, planes, n, k, kp, meta)

    @property
    def np_(self) -> int:
        return self.planes[0].shape[0]

    @property
    def nbytes(self) -> int:
        return sum(p.size * p.dtype.itemsize for p in self.planes)

    def __repr__(self) -> str:
        planes = ", ".join(f"{p.dtype}{list(p.shape)}" for p in self.planes)
        return f"PreparedWeight({self.fmt}, n={self.n}, k={self.k}, planes=[{planes}])"


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tiling of one kernel launch.

    ``bm`` rows of x per program (1 with ``mode="fma"``, else ≥ 16), ``bn``
    weight rows per program (power of two ≤ 128), ``splits`` K splits,
    ``unroll`` chunks per loop iteration (their loads are all issued before
    any decode: more bytes in flight per program), Triton
    ``num_warps``/``num_stages``. ``splits`` and ``unroll`` are lowered to
    divisors of the chunk count when they do not divide it.
    """

    bm: int = 16
    bn: int = 64
    mode: str = "dot"  # "dot" | "fma"
    swap: bool = False
    splits: int = 1
    unroll: int = 1
    num_warps: int = 4
    num_stages: int = 3


def default_config(m: int, n_chunks: int, np_: int) -> KernelConfig:
    """Heuristic tiling by M: H100 starting points, not yet timed on a GPU (``tests/bench/qmatmul_kernels.py`` sweeps
    the alternatives; ``make sm90-report`` checks they compile for sm_90a, see docs/pages/kernels.md).
    """
    if m == 1:
        return KernelConfig(bm=1, bn=16, mode="fma", splits=4, unroll=2, num_warps=4, num_stages=3)
    if m <= 16:
        return KernelConfig(bm=16, bn=32, mode="dot", swap=True, splits=4, unroll=2, num_warps=4, num_stages=3)
    if m <= 64:
        return KernelConfig(bm=64, bn=64, mode="dot", num_warps=4, num_stages=3)
    return KernelConfig(bm=128, bn=128, mode="dot", swap=True, num_warps=8, num_stages=2)


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


def _kernel(x_ref, *refs, fmt: Format, cfg: KernelConfig, chunks_per_split: int, cdt, precision):
    o_ref = refs[-1]
    plane_refs = refs[:-1]
    bn, w_, u_ = cfg.bn, fmt.part_width, cfg.unroll
    t0 = pl.program_id(2) * chunks_per_split
    dims = (((1,), (1,)), ((), ()))

    def body(i, acc):
        ts = [t0 + i * u_ + u for u in range(u_)]
        loaded = [fmt.load(plane_refs, t) for t in ts]  # issue every load first
        xs = [[x_ref[:, pl.ds(t * CHUNK + p * w_, w_)] for p in range(fmt.parts)] for t in ts]
        for u in range(u_):
            for p, w in enumerate(fmt.dequant(loaded[u], bn)):
                if cfg.mode == "fma":  # M = 1: elementwise, reduced once at the end
                    acc = acc + w * xs[u][p].astype(jnp.float32)
                elif cfg.swap:
                    acc = acc + lax.dot_general(
                        w.astype(cdt),
                        xs[u][p].astype(cdt),
                        dims,
                        precision=precision,
                        preferred_element_type=jnp.float32,
                    )
                else:
                    acc = acc + lax.dot_general(
                        xs[u][p].astype(cdt),
                        w.astype(cdt),
                        dims,
                        precision=precision,
                        preferred_element_type=jnp.float32,
                    )
        return acc

    if cfg.mode == "fma":
        acc = lax.fori_loop(0, chunks_per_split // u_, body, jnp.zeros((bn, w_), jnp.float32))
        col = jnp.sum(acc, axis=1, keepdims=True)  # [bn, 1]
        if fmt.row_scale:
            col = col * plane_refs[-1][...]
        o_ref[...] = col.T.astype(o_ref.dtype)
        return
    shape = (bn, cfg.bm) if cfg.swap else (cfg.bm, bn)
    acc = lax.fori_loop(0, chunks_per_split // u_, body, jnp.zeros(shape, jnp.float32))
    if fmt.row_scale:
        sc = plane_refs[-1][...]  # [bn, 1]
        acc = acc * sc if cfg.swap else acc * sc.T
    o_ref[...] = (acc.T if cfg.swap else acc).astype(o_ref.dtype)


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, at_most) + 1) if n % d == 0)


def matmul_prepared(
    fmt: Format,
    x: jax.Array,
    w: PreparedWeight,
    cfg: KernelConfig | None = None,
    *,
    interpret: bool = False,
) -> jax.Array:
    """``x [M, K] @ dequant(w)^T`` → ``[M, N]`` in ``x``'s dtype with the Pallas kernel.

    ``x`` must be float32, bfloat16 or float16 (16-bit activations multiply
    16-bit decoded tiles; float32 uses full-precision (IEEE) dots). No checks
    beyond that: the public wrappers in ``pallas_gguf``/``pallas_gptq`` validate.
    """
    m, k = x.shape
    if k != w.k:
        raise ValueError(f"{fmt.name} kernel: x has K={k}, the weight K={w.k}")
    np_, kp = w.np_, w.kp
    n_chunks = kp // CHUNK
    cfg = cfg or default_config(m, n_chunks, np_)
    if cfg.mode == "fma" and (cfg.bm != 1 or m != 1):
        raise ValueError(f"KernelConfig(mode='fma') needs M = 1 and bm = 1, got M={m}, bm={cfg.bm}")
    if np_ % cfg.bn:
        raise ValueError(f"config {cfg} does not tile Np={np_}")
    splits = _largest_divisor(n_chunks, cfg.splits)
    cfg = dataclasses.replace(cfg, splits=splits, unroll=_largest_divisor(n_chunks // splits, cfg.unroll))
    mp = _round_up(m, cfg.bm)
    if mp != m or kp != k:
        x = jnp.pad(x, ((0, mp - m), (0, kp - k)))
    if x.dtype == jnp.float32:
        cdt, precision = jnp.float32, lax.Precision.HIGHEST
    else:
        cdt, precision = x.dtype, None
    cps = n_chunks // cfg.splits
    split = cfg.splits > 1
    out_dtype = jnp.float32 if split else x.dtype
    grid = (mp // cfg.bm, np_ // cfg.bn, cfg.splits)
    in_specs = [pl.BlockSpec((cfg.bm, kp), lambda i, j, s: (i, 0))]
    in_specs += [pl.BlockSpec((cfg.bn, p.shape[1]), lambda i, j, s: (j, 0)) for p in w.planes]
    if split:
        out_shape = jax.ShapeDtypeStruct((cfg.splits, mp, np_), out_dtype)
        out_spec = pl.BlockSpec((None, cfg.bm, cfg.bn), lambda i, j, s: (s, i, j))
    else:
        out_shape = jax.ShapeDtypeStruct((mp, np_), out_dtype)
        out_spec = pl.BlockSpec((cfg.bm, cfg.bn), lambda i, j, s: (i, j))
    kernel = functools.partial(_kernel, fmt=fmt, cfg=cfg, chunks_per_split=cps, cdt=cdt, precision=precision)
    y = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_spec,
        compiler_params=pltriton.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=interpret,
        name=f"qmatmul_{fmt.name.lower()}",
    )(x, *w.planes)
    if split:
        y = y.sum(axis=0).astype(x.dtype)
    return y[:m, : w.n]


def matmul_checked(
    fmt: Format,
    lhs,
    w: PreparedWeight,
    cfg: KernelConfig | None,
    *,
    interpret: bool,
    what: str,
    weight: str = "the weight",
) -> jax.Array:
    """`matmul_prepared` on ``lhs [..., K]`` → ``[..., N]``, after the checks the public wrappers share.

    ``what`` names the kernel and ``weight`` the weight argument in the messages.

    Raises:
        ValueError: ``lhs`` not float32/bfloat16/float16, or its K not the weight's.
    """
    lhs = jnp.asarray(lhs)
    if lhs.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        raise ValueError(f"lhs: dtype must be float32, bfloat16 or float16 for the {what} kernel, got {lhs.dtype}")
    if lhs.ndim == 0 or lhs.shape[-1] != w.k:
        raise ValueError(f"lhs: {what} qmatmul lhs {list(lhs.shape)} does not match {weight} (K = {w.k})")
    y = matmul_prepared(fmt, lhs.reshape(-1, w.k), w, cfg, interpret=interpret)
    return y.reshape(lhs.shape[:-1] + (w.n,))
