"""Flash attention (FlashAttention-2 style) as Triton-backend Pallas kernels, with a custom VJP.

All entry points work on a *packed* token layout: ``q [Tq, Hq, D]``, ``k``/``v``
``[Tk, Hkv, D]`` plus a per-sequence table ``seq int32 [5, B]`` = (q start,
q length, kv start, kv length, position of the first query). The dense
``[B, S, H, D]`` layout is the special case ``start = b * S`` (a free reshape),
ragged batches pass their row offsets. Query ``r`` of sequence ``b`` sits at
position ``pos0[b] + r``; key ``j`` at position ``j``.

Forward (`flash_attention` / `flash_attention_packed`): grid
``(q tiles, B, Hq)``; each program keeps its ``block_q`` query rows and loops
over ``block_k`` KV tiles with an online softmax in base 2 (float32 ``m``,
``l``, accumulator; ``scale·log2 e`` folded into the scores). Only the KV tiles
that hold a visible key are visited (causal / sliding-window block skipping),
split in three loops so that the tiles visible to every query of the block
run without any mask. GQA: program ``(·, ·, h)`` reads KV head ``h // G``.
Residual: the base-2 logsumexp per query row (``+inf`` for rows that see no
key, which makes their probabilities exactly 0 in the backward pass).

Backward (FlashAttention-2): ``delta = rowsum(o · do)`` in XLA, then

* dK/dV kernel, grid ``(kv tiles, B, Hkv)``: keeps one KV tile, loops over the
  ``G`` query heads of its group and their visible query tiles, computing in
  the transposed orientation ``sT = k qᵀ`` (no transposes in registers);
  GQA gradients are summed inside the kernel, nothing per query head is stored.
* dQ kernel, grid ``(q tiles, B, Hq)``: the forward's loop structure.

Dtypes: float32, bfloat16, float16 in; float32 accumulation; 16-bit inputs
multiply 16-bit tiles on the tensor cores, float32 uses full-precision dots.
head_dim: any size ≤ 256; non-powers of two are masked up to the next power.

Example:
    >>> import numpy as np
    >>> from custom_calls.attention import pallas_flash as pf
    >>> q = np.ones((1, 40, 4, 32), np.float32); kv = np.ones((1, 40, 2, 32), np.float32)
    >>> pf.flash_attention(q, kv, kv, causal=True, interpret=True).shape
    (1, 40, 4, 32)
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from custom_calls._pallas import pl, pltriton
from custom_calls.attention import _tiles as t_
from custom_calls.attention.reference import _max_len, ragged_seq_table, window_pair

__all__ = [
    "FlashConfig",
    "default_config",
    "SUPPORTED_DTYPES",
    "MAX_HEAD_DIM",
    "flash_attention",
    "flash_attention_packed",
    "flash_attention_ragged",
    "dense_seq_table",
]

SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
MAX_HEAD_DIM = 256


@dataclasses.dataclass(frozen=True)
class FlashConfig:
    """Block sizes (powers of two ≥ 16) and Triton launch parameters.

    ``block_q``/``block_k``: forward tiles. ``block_q_bwd``/``block_k_bwd``:
    tiles of both backward kernels. Blocks larger than the (power-of-two
    rounded) sequence are shrunk to it.
    """

    block_q: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    block_q_bwd: int = 64
    block_k_bwd: int = 64
    num_warps_bwd: int = 4
    num_stages_bwd: int = 2

    def __post_init__(self):
        for f in ("block_q", "block_k", "block_q_bwd", "block_k_bwd"):
            v = getattr(self, f)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{f}: must be a power of two >= 16, got {v}")


# Shared memory one H100 block may use (227 KiB), less room for Triton's layout scratch.
_SMEM_BUDGET = 200 * 1024


def default_config(head_dim: int, dtype=jnp.bfloat16) -> FlashConfig:
    """H100 starting points (PALLAS_NOTES §6.1/§8.2; re-tune with tests/bench/kernels.py).

    The K/V tiles a loop stage keeps in shared memory (``stages × 2 × block_k ×
    head_dim`` elements) must fit a block's 227 KiB: 4-byte dtypes get smaller
    KV tiles (float32 at head_dim 128 with the bf16 tiles asked for 256 KiB on
    the first H100 run).

    Example:
        >>> default_config(128).block_k, default_config(128, jnp.float32).block_k
        (128, 64)
    """
    if head_dim <= 64:
        cfg = FlashConfig(128, 64, 4, 3, 64, 64, 4, 2)
    elif head_dim <= 128:
        cfg = FlashConfig(128, 128, 8, 2, 64, 64, 8, 2)
    else:
        cfg = FlashConfig(64, 32, 8, 2, 32, 32, 8, 1)
    return _fit_shared_memory(cfg, max(16, t_.next_pow2(head_dim)), jnp.dtype(dtype).itemsize)


def _fit_shared_memory(cfg: FlashConfig, dp: int, itemsize: int) -> FlashConfig:
    """Halve the tiles streamed through shared memory until their pipeline stages fit `_SMEM_BUDGET`."""
    bk = cfg.block_k
    while bk > 16 and cfg.num_stages * 2 * bk * dp * itemsize > _SMEM_BUDGET:
        bk //= 2
    # Backward kernels stream one operand pair (q and dO, or k and v) per stage.
    bq_b, bk_b = cfg.block_q_bwd, cfg.block_k_bwd
    while max(bq_b, bk_b) > 16 and cfg.num_stages_bwd * 2 * max(bq_b, bk_b) * dp * itemsize > _SMEM_BUDGET:
        bq_b, bk_b = max(16, bq_b // 2), max(16, bk_b // 2)
    return dataclasses.replace(cfg, block_k=bk, block_q_bwd=bq_b, block_k_bwd=bk_b)


@dataclasses.dataclass(frozen=True)
class _HeadSpec:
    """Static mask, scale and head_dim fields of a kernel launch (flash and decode specs extend it)."""

    causal: bool
    window: tuple[int, int] | None
    scale: float
    d: int
    dp: int  # head_dim padded to a power of two >= 16 (the loaded tile width)


def _head_fields(d: int, causal, local_window_size, scale) -> dict:
    """The `_HeadSpec` fields of user arguments (validates ``local_window_size``)."""
    return dict(
        causal=bool(causal),
        window=window_pair(local_window_size, causal),
        scale=float(1.0 / math.sqrt(d) if scale is None else scale),
        d=d,
        dp=max(16, t_.next_pow2(d)),
    )


@dataclasses.dataclass(frozen=True)
class _Spec(_HeadSpec):
    """Everything static about one kernel launch (hashable: custom_vjp nondiff arg)."""

    group: int
    even: bool  # every sequence fills whole tiles: no row masks
    max_q: int
    max_k: int
    cfg: FlashConfig
    interpret: bool

    def blocks(self, bwd: bool) -> tuple[int, int]:
        bq = self.cfg.block_q_bwd if bwd else self.cfg.block_q
        bk = self.cfg.block_k_bwd if bwd else self.cfg.block_k
        return min(bq, max(16, t_.next_pow2(self.max_q))), min(bk, max(16, t_.next_pow2(self.max_k)))


def _prec(dtype):
    return lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _seq(seq_ref, b):
    return tuple(seq_ref[j, b] for j in range(5))


# ─── forward ──────────────────────────────────────────────────────────────


def _q_tile(spec: _Spec):
    """This program's query tile; causal grids run the (longest) last tiles first for a shorter tail."""
    i = pl.program_id(0)
    if spec.causal:
        return pl.num_programs(0) - 1 - i
    return i


@dataclasses.dataclass(frozen=True)
class _QRows:
    """This program's query tile, loaded: ``n`` rows from ``start`` (``row_ok`` masks those past the sequence),
    at positions ``qpos``, against the keys ``k_start .. k_start + k_len`` in tiles of ``bk`` (``tiles``: the
    `_tiles.kv_tile_range` it sees)."""

    start: object
    n: int
    row_ok: object
    q: object
    qpos: object
    k_start: object
    k_len: object
    bk: int
    tiles: tuple
    prec: object


def _over_q_rows(spec: _Spec, seq_ref, q_ref, backward: bool, body) -> None:
    """``body(rows)`` (`_QRows`) for this program's query tile of its sequence, if the tile holds any row."""
    bq, bk = spec.blocks(backward)
    q_start, q_len, k_start, k_len, pos0 = _seq(seq_ref, pl.program_id(1))
    r0 = _q_tile(spec) * bq

    @pl.when(r0 < q_len)
    def _():
        rows = r0 + jnp.arange(bq)
        row_ok = None if spec.even else rows < q_len
        q = t_.load_rows(q_ref, q_start + r0, bq, spec.d, spec.dp, row_ok)
        tiles = t_.kv_tile_range(pos0 + r0, pos0 + r0 + bq - 1, k_len, bk, spec.causal, spec.window)
        body(_QRows(q_start + r0, bq, row_ok, q, pos0 + rows, k_start, k_len, bk, tiles, _prec(q.dtype)))


def _fwd_kernel(seq_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, spec: _Spec):
    def body(r: _QRows):
        def step(masked: bool):
            def loop(t, carry):
                _, v, s = _kv_tile(spec, r, k_ref, v_ref, t, masked)
                return t_.softmax_step(carry, s, v, masked=masked, precision=r.prec)

            return loop

        carry = _tile_loops(*r.tiles, step, t_.softmax_init(r.n, spec.dp))
        o, lse = t_.softmax_finish(carry, jnp.inf)
        t_.store_rows(o_ref, r.start, o.astype(o_ref.dtype), spec.d, spec.dp, r.row_ok)
        t_.store_vec(lse_ref, r.start, lse, r.row_ok)

    _over_q_rows(spec, seq_ref, q_ref, False, body)


def _kv_tile(spec: _Spec, r: _QRows, k_ref, v_ref, t, masked: bool):
    """K/V tile ``t`` of a sequence and the base-2 scores of the query rows ``r`` against it.

    ``masked``: rows past ``k_len`` read zeros and invisible keys score ``-inf``
    (with ``spec.even`` every tile lies inside ``k_len``: only the causal/window
    mask applies, which keeps the diagonal loop's registers down on GPU).
    """
    bk = r.bk
    kpos = t * bk + jnp.arange(bk)
    key_ok = (kpos < r.k_len) if masked and not spec.even else None
    k = t_.load_rows(k_ref, r.k_start + t * bk, bk, spec.d, spec.dp, key_ok)
    v = t_.load_rows(v_ref, r.k_start + t * bk, bk, spec.d, spec.dp, key_ok)
    s = t_.dot(r.q, k, trans_b=True, precision=r.prec) * (spec.scale * t_.LOG2E)
    if masked:
        s = t_.mask_scores(s, r.qpos, kpos, spec.causal, spec.window, key_ok)
    return k, v, s


def _tile_loops(lo, a, cc, hi, step, carry):
    """``step(masked)`` bodies over the tiles of a `_tiles.kv_tile_range` / `q_tile_range`: only ``[a, cc)`` unmasked.

    A range whose bounds are the same Python int (e.g. the leading masked
    tiles of a KV range without a sliding window) emits no loop at all, which
    saves its code and registers on GPU.
    """
    for start, stop, masked in ((lo, a, True), (a, cc, False), (cc, hi, True)):
        if not (isinstance(start, int) and isinstance(stop, int) and start == stop):
            carry = lax.fori_loop(start, stop, step(masked), carry)
    return carry


def _block_rows(q, k, bq: int, bk: int) -> tuple[int, int]:
    """Row extent of the whole-array blocks: at least one tile, so every tile slice is in-bounds at trace
    time (interpret mode pads the block; on GPU a block is only a base pointer and rows past the array
    are masked)."""
    return max(q.shape[0], bq), max(k.shape[0], bk)


def _fwd_call(q, k, v, seq, spec: _Spec):
    hq = q.shape[1]
    nb = seq.shape[1]
    bq, bk = spec.blocks(False)
    tq, tk = _block_rows(q, k, bq, bk)
    g, dp = spec.group, spec.dp
    grid = (t_.cdiv(spec.max_q, bq), nb, hq)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, spec=spec),
        out_shape=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((hq, q.shape[0]), jnp.float32)),
        grid=grid,
        in_specs=[
            pl.BlockSpec(seq.shape, lambda i, b, h: (0, 0)),
            pl.BlockSpec((tq, None, dp), lambda i, b, h: (0, h, 0)),
            pl.BlockSpec((tk, None, dp), lambda i, b, h: (0, h // g, 0)),
            pl.BlockSpec((tk, None, dp), lambda i, b, h: (0, h // g, 0)),
        ],
        out_specs=(
            pl.BlockSpec((tq, None, dp), lambda i, b, h: (0, h, 0)),
            pl.BlockSpec((None, tq), lambda i, b, h: (h, 0)),
        ),
        compiler_params=pltriton.CompilerParams(num_warps=spec.cfg.num_warps, num_stages=spec.cfg.num_stages),
        interpret=spec.interpret,
        name="flash_attention_fwd",
    )(seq, q, k, v)


# ─── backward ─────────────────────────────────────────────────────────────


def _dkdv_kernel(seq_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *, spec: _Spec):
    bq, bk = spec.blocks(True)
    j, b = pl.program_id(0), pl.program_id(1)
    q_start, q_len, k_start, k_len, pos0 = _seq(seq_ref, b)
    k0 = j * bk
    c = spec.scale * t_.LOG2E

    @pl.when(k0 < k_len)
    def _():
        kpos = k0 + jnp.arange(bk)
        key_ok = None if spec.even else kpos < k_len
        k = t_.load_rows(k_ref, k_start + k0, bk, spec.d, spec.dp, key_ok)
        v = t_.load_rows(v_ref, k_start + k0, bk, spec.d, spec.dp, key_ok)
        prec = _prec(k.dtype)
        lo, a, cc, hi = t_.q_tile_range(k0, k0 + bk - 1, pos0, q_len, bq, spec.causal, spec.window, k0 + bk <= k_len)

        def step(masked: bool, g):
            def body(t, carry):
                dk, dv = carry
                rows = t * bq + jnp.arange(bq)
                row_ok = (rows < q_len) if masked and not spec.even else None
                q = t_.load_rows(q_ref, q_start + t * bq, bq, spec.d, spec.dp, row_ok, head=g)
                do = t_.load_rows(do_ref, q_start + t * bq, bq, spec.d, spec.dp, row_ok, head=g)
                lse = t_.load_vec(lse_ref, q_start + t * bq, bq, row_ok, other=jnp.inf, head=g)
                delta = t_.load_vec(delta_ref, q_start + t * bq, bq, row_ok, head=g)
                st = t_.dot(k, q, trans_b=True, precision=prec) * c  # [bk, bq]
                if masked:
                    st = t_.mask_scores(st, pos0 + rows, kpos, spec.causal, spec.window, transposed=True)
                pt = jnp.exp2(st - lse[None, :])
                dv = dv + t_.dot(pt.astype(do.dtype), do, trans_b=False, precision=prec)
                dpt = t_.dot(v, do, trans_b=True, precision=prec)
                dst = pt * (dpt - delta[None, :])
                dk = dk + t_.dot(dst.astype(q.dtype), q, trans_b=False, precision=prec)
                return dk, dv

            return body

        def head(g, carry):
            return _tile_loops(lo, a, cc, hi, lambda masked: step(masked, g), carry)

        zeros = jnp.zeros((bk, spec.dp), jnp.float32)
        dk, dv = lax.fori_loop(0, spec.group, head, (zeros, zeros))
        t_.store_rows(dk_ref, k_start + k0, (dk * spec.scale).astype(dk_ref.dtype), spec.d, spec.dp, key_ok)
        t_.store_rows(dv_ref, k_start + k0, dv.astype(dv_ref.dtype), spec.d, spec.dp, key_ok)


def _dq_kernel(seq_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, spec: _Spec):
    def body(r: _QRows):
        do = t_.load_rows(do_ref, r.start, r.n, spec.d, spec.dp, r.row_ok)
        lse = t_.load_vec(lse_ref, r.start, r.n, r.row_ok, other=jnp.inf)
        delta = t_.load_vec(delta_ref, r.start, r.n, r.row_ok)

        def step(masked: bool):
            def loop(t, dq):
                k, v, s = _kv_tile(spec, r, k_ref, v_ref, t, masked)
                p = jnp.exp2(s - lse[:, None])
                dp_ = t_.dot(do, v, trans_b=True, precision=r.prec)
                ds = p * (dp_ - delta[:, None])
                return dq + t_.dot(ds.astype(k.dtype), k, trans_b=False, precision=r.prec)

            return loop

        dq = _tile_loops(*r.tiles, step, jnp.zeros((r.n, spec.dp), jnp.float32))
        t_.store_rows(dq_ref, r.start, (dq * spec.scale).astype(dq_ref.dtype), spec.d, spec.dp, r.row_ok)

    _over_q_rows(spec, seq_ref, q_ref, True, body)


def _bwd_calls(q, k, v, seq, o, lse, do, spec: _Spec):
    hq, hkv = q.shape[1], k.shape[1]
    nb = seq.shape[1]
    g, dp = spec.group, spec.dp
    bq, bk = spec.blocks(True)
    tq, tk = _block_rows(q, k, bq, bk)
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1).T  # [Hq, Tq]
    params = pltriton.CompilerParams(num_warps=spec.cfg.num_warps_bwd, num_stages=spec.cfg.num_stages_bwd)
    seq_spec = pl.BlockSpec(seq.shape, lambda *_: (0, 0))
    # Rows outside every sequence are never written: start from zeros unless every row is covered.
    zero_init = not spec.even
    dkdv_kernel = functools.partial(_dkdv_kernel, spec=spec)
    dq_kernel = functools.partial(_dq_kernel, spec=spec)
    aliases_kv, aliases_q = {}, {}
    if zero_init:
        dkdv_kernel = _drop_aliased(dkdv_kernel, 2)
        dq_kernel = _drop_aliased(dq_kernel, 1)
        aliases_kv = {7: 0, 8: 1}
        aliases_q = {7: 0}
    dk, dv = pl.pallas_call(
        dkdv_kernel,
        out_shape=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        grid=(t_.cdiv(spec.max_k, bk), nb, hkv),
        in_specs=[
            seq_spec,
            pl.BlockSpec((tq, g, dp), lambda j, b, h: (0, h, 0)),
            pl.BlockSpec((tk, None, dp), lambda j, b, h: (0, h, 0)),
            pl.BlockSpec((tk, None, dp), lambda j, b, h: (0, h, 0)),
            pl.BlockSpec((tq, g, dp), lambda j, b, h: (0, h, 0)),
            pl.BlockSpec((g, tq), lambda j, b, h: (h, 0)),
            pl.BlockSpec((g, tq), lambda j, b, h: (h, 0)),
        ]
        + ([pl.BlockSpec((tk, None, dp), lambda j, b, h: (0, h, 0))] * 2 if zero_init else []),
        out_specs=(
            pl.BlockSpec((tk, None, dp), lambda j, b, h: (0, h, 0)),
            pl.BlockSpec((tk, None, dp), lambda j, b, h: (0, h, 0)),
        ),
        compiler_params=params,
        interpret=spec.interpret,
        input_output_aliases=aliases_kv,
        name="flash_attention_dkdv",
    )(seq, q, k, v, do, lse, delta, *((jnp.zeros_like(k), jnp.zeros_like(v)) if zero_init else ()))
    dq = pl.pallas_call(
        dq_kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(t_.cdiv(spec.max_q, bq), nb, hq),
        in_specs=[
            seq_spec,
            pl.BlockSpec((tq, None, dp), lambda i, b, h: (0, h, 0)),
            pl.BlockSpec((tk, None, dp), lambda i, b, h: (0, h // g, 0)),
            pl.BlockSpec((tk, None, dp), lambda i, b, h: (0, h // g, 0)),
            pl.BlockSpec((tq, None, dp), lambda i, b, h: (0, h, 0)),
            pl.BlockSpec((None, tq), lambda i, b, h: (h, 0)),
            pl.BlockSpec((None, tq), lambda i, b, h: (h, 0)),
        ]
        + ([pl.BlockSpec((tq, None, dp), lambda i, b, h: (0, h, 0))] if zero_init else []),
        out_specs=pl.BlockSpec((tq, None, dp), lambda i, b, h: (0, h, 0)),
        compiler_params=params,
        interpret=spec.interpret,
        input_output_aliases=aliases_q,
        name="flash_attention_dq",
    )(seq, q, k, v, do, lse, delta, *((jnp.zeros_like(q),) if zero_init else ()))
    return dq, dk, dv


def _drop_aliased(kernel, n_aliased: int):
    """``kernel`` ignoring the ``n_aliased`` zero-filled input refs that alias its outputs."""

    def wrapped(*refs):
        n_out = n_aliased
        ins, outs = refs[: -(2 * n_out)], refs[-n_out:]
        return kernel(*ins, *outs)

    return wrapped


# ─── custom VJP over the packed layout ────────────────────────────────────


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flash(q, k, v, seq, spec):
    return _fwd_call(q, k, v, seq, spec)


def _flash_fwd(q, k, v, seq, spec):
    o, lse = _fwd_call(q, k, v, seq, spec)
    return (o, lse), (q, k, v, seq, o, lse)


def _flash_bwd(spec, res, cts):
    q, k, v, seq, o, lse = res
    do, _ = cts  # the logsumexp output is not differentiated
    dq, dk, dv = _bwd_calls(q, k, v, seq, o, lse, do.astype(o.dtype), spec)
    return dq, dk, dv, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def dense_seq_table(b: int, sq: int, sk: int, q_lens=None, kv_lens=None, q_offset=0):
    """The ``seq [5, B]`` table of a dense ``[B, S, H, D]`` batch flattened to ``[B*S, H, D]``."""
    ar = jnp.arange(b, dtype=jnp.int32)
    ql = jnp.full((b,), sq, jnp.int32) if q_lens is None else jnp.minimum(jnp.asarray(q_lens, jnp.int32).reshape(b), sq)
    kl = (
        jnp.full((b,), sk, jnp.int32)
        if kv_lens is None
        else jnp.minimum(jnp.asarray(kv_lens, jnp.int32).reshape(b), sk)
    )
    pos0 = jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), (b,))
    return jnp.stack([ar * sq, ql, ar * sk, kl, pos0])


def check_inputs(fn: str, q, k, v, rank: int) -> None:
    """Raise ``ValueError`` (naming the parameter) for inputs no attention path accepts."""
    if q.ndim != rank or k.ndim != rank or v.ndim != rank:
        raise ValueError(f"{fn}: q, k, v must be rank {rank}, got q{list(q.shape)}, k{list(k.shape)}, v{list(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"{fn}: k{list(k.shape)} and v{list(v.shape)} must have the same shape")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{fn}: head_dim of q ({q.shape[-1]}) and k ({k.shape[-1]}) differ")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        raise ValueError(f"{fn}: n_heads of q ({q.shape[-2]}) must be a multiple of n_kv_heads ({k.shape[-2]})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{fn}: q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not jnp.issubdtype(q.dtype, jnp.floating):
        raise ValueError(f"{fn}: dtype must be floating point, got {q.dtype}")


def unsupported_reason(q) -> str | None:
    """Why the kernels cannot run these (valid) inputs, or None."""
    if q.dtype not in SUPPORTED_DTYPES:
        return f"dtype {q.dtype} has no kernel (float32, bfloat16, float16)"
    if q.shape[-1] > MAX_HEAD_DIM:
        return f"head_dim {q.shape[-1]} > {MAX_HEAD_DIM}"
    return None


def _make_spec(q, k, *, causal, local_window_size, scale, even, max_q, max_k, config, interpret):
    d = q.shape[-1]
    return _Spec(
        **_head_fields(d, causal, local_window_size, scale),
        group=q.shape[-2] // k.shape[-2],
        even=even,
        max_q=max(int(max_q), 1),
        max_k=max(int(max_k), 1),
        cfg=config or default_config(d, q.dtype),
        interpret=bool(interpret),
    )


def flash_attention_packed(
    q,
    k,
    v,
    seq,
    *,
    causal=False,
    local_window_size=None,
    scale=None,
    max_q_len,
    max_kv_len,
    even=False,
    config: FlashConfig | None = None,
    interpret=False,
    return_lse=False,
):
    """Flash attention on the packed layout (module docstring); differentiable in q, k, v.

    Args:
        q: ``[Tq, Hq, D]``; k, v: ``[Tk, Hkv, D]`` (same dtype).
        seq: ``int32 [5, B]`` (`dense_seq_table` / `ragged_seq_table`).
        max_q_len, max_kv_len: static upper bounds of the lengths in ``seq``.
        even: promise that every sequence has ``max_q_len``/``max_kv_len``
            rows, multiples of the blocks (skips the row masks).
        return_lse: also return the natural-log logsumexp ``float32 [Hq, Tq]``
            (``-inf`` for rows that see no key).

    Rows of ``q`` not covered by any sequence are left unwritten (undefined).
    """
    check_inputs("flash_attention", q, k, v, 3)
    why = unsupported_reason(q)
    if why:
        raise ValueError(f"flash_attention kernel: {why}")
    spec = _make_spec(
        q,
        k,
        causal=causal,
        local_window_size=local_window_size,
        scale=scale,
        even=even,
        max_q=max_q_len,
        max_k=max_kv_len,
        config=config,
        interpret=interpret,
    )
    o, lse2 = _flash(q, k, v, jnp.asarray(seq, jnp.int32), spec)
    if return_lse:
        return o, jnp.where(jnp.isposinf(lse2), -jnp.inf, lse2 / t_.LOG2E)
    return o


def flash_attention(
    q,
    k,
    v,
    *,
    causal=False,
    local_window_size=None,
    scale=None,
    q_lens=None,
    kv_lens=None,
    q_offset=0,
    config: FlashConfig | None = None,
    interpret=False,
    return_lse=False,
):
    """Flash attention on ``[B, S, H, D]`` (``jax.nn.dot_product_attention`` layout).

    Same semantics as `reference.attention` (masks, ``q_offset``, lengths);
    query rows past ``q_lens`` come out as zeros. With ``return_lse`` also
    returns the natural-log logsumexp ``float32 [B, Hq, Sq]``.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    check_inputs("flash_attention", q, k, v, 4)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"flash_attention: batch of q ({q.shape[0]}) and k ({k.shape[0]}) differ")
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    cfg = config or default_config(d, q.dtype)
    probe = _make_spec(
        q,
        k,
        causal=causal,
        local_window_size=local_window_size,
        scale=scale,
        even=False,
        max_q=sq,
        max_k=sk,
        config=cfg,
        interpret=interpret,
    )
    bq, bk = probe.blocks(False)
    bqb, bkb = probe.blocks(True)
    even = q_lens is None and kv_lens is None and sq % max(bq, bqb) == 0 and sk % max(bk, bkb) == 0
    seq = dense_seq_table(b, sq, sk, q_lens, kv_lens, q_offset)
    out = flash_attention_packed(
        q.reshape(b * sq, hq, d),
        k.reshape(b * sk, hkv, d),
        v.reshape(b * sk, hkv, d),
        seq,
        causal=causal,
        local_window_size=local_window_size,
        scale=scale,
        max_q_len=sq,
        max_kv_len=sk,
        even=even,
        config=cfg,
        interpret=interpret,
        return_lse=return_lse,
    )
    o, lse = out if return_lse else (out, None)
    o = o.reshape(b, sq, hq, d)
    if q_lens is not None:  # rows past a sequence's length are never written
        valid = jnp.arange(sq)[None, :] < jnp.asarray(q_lens, jnp.int32).reshape(b, 1)
        o = jnp.where(valid[:, :, None, None], o, 0).astype(o.dtype)
    if not return_lse:
        return o
    lse = lse.reshape(hq, b, sq).transpose(1, 0, 2)
    if q_lens is not None:
        lse = jnp.where(valid[:, None, :], lse, -jnp.inf)
    return o, lse


def flash_attention_ragged(
    q,
    k,
    v,
    input_row_offsets,
    *,
    kv_row_offsets=None,
    causal=False,
    local_window_size=None,
    scale=None,
    max_seq_len=None,
    max_kv_len=None,
    config: FlashConfig | None = None,
    interpret=False,
):
    """Flash attention over ragged batches (same semantics as `reference.ragged_attention`).

    ``q [total_q, Hq, D]``, ``k/v [total_kv, Hkv, D]``, ``input_row_offsets``
    (and ``kv_row_offsets``) ``int [B+1]``. ``max_seq_len``/``max_kv_len``
    size the grid: computed from concrete offsets, else the totals (correct
    but launches idle programs). Rows outside ``[off[0], off[-1])`` are zero.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    check_inputs("flash_attention_ragged", q, k, v, 3)
    lq = _max_len(input_row_offsets, q.shape[0], max_seq_len)
    lk = lq if kv_row_offsets is None else _max_len(kv_row_offsets, k.shape[0], max_kv_len, "max_kv_len")
    seq = ragged_seq_table(input_row_offsets, kv_row_offsets)
    o = flash_attention_packed(
        q,
        k,
        v,
        seq,
        causal=causal,
        local_window_size=local_window_size,
        scale=scale,
        max_q_len=lq,
        max_kv_len=lk,
        config=config,
        interpret=interpret,
    )
    qo = jnp.asarray(input_row_offsets, jnp.int32)
    t = jnp.arange(q.shape[0])
    return jnp.where(((t >= qo[0]) & (t < qo[-1]))[:, None, None], o, 0).astype(o.dtype)
