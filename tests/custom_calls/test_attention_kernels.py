"""Attention: jnp reference vs a numpy oracle, Pallas kernels (interpret mode) vs the reference.

CPU tiers (PALLAS_NOTES.md §9): the reference (`custom_calls.attention.reference`)
against an independent float64 numpy oracle; the Pallas kernels run in
interpret mode against the reference (forward, custom-VJP gradients vs
``jax.grad`` of the reference, ragged, decode, paged); the Triton lowering of
every kernel is checked by exporting for CUDA from the CPU. Interpret-mode
compiles dominate the cost, so this module turns on JAX's persistent
compilation cache (``.jax_cache/`` in the repo, git-ignored) and keeps shapes
tiny. ``@pytest.mark.gpu`` tests run the compiled kernels
(``JAX_PLATFORMS= pytest -m gpu tests/custom_calls/test_attention_kernels.py``).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from custom_calls import attention as ca
from custom_calls.attention import reference as ref
from tests.custom_calls._util import HAS_GPU, cuda_module, quiet_triton, uses_pallas  # noqa: F401 - quiet_triton: autouse fixture

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _compile_cache():
    """Persistent XLA cache for the interpret-mode kernels (cold ~6x slower than warm)."""
    from jax._src import compilation_cache as cc

    keys = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    old = {k: getattr(jax.config, k) for k in keys}
    jax.config.update(keys[0], str(ROOT / ".jax_cache" / "kernels"))
    jax.config.update(keys[1], 0.0)
    jax.config.update(keys[2], 0)
    cc.reset_cache()
    yield
    for k, v in old.items():
        jax.config.update(k, v)
    cc.reset_cache()


# ─── numpy oracle ─────────────────────────────────────────────────────────


def np_attention(q, k, v, *, causal=False, window=None, scale=None, q_len=None, kv_len=None, q_pos0=None):
    """float64 loops over batch and head: ``q [B, Sq, Hq, D]``, ``k/v [B, Sk, Hkv, D]``; ``window`` = (left, right)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros(q.shape)
    for bi in range(b):
        ql = sq if q_len is None else q_len[bi]
        kl = sk if kv_len is None else kv_len[bi]
        p0 = 0 if q_pos0 is None else q_pos0[bi]
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(ql):
                pos = p0 + i
                js = [
                    j
                    for j in range(kl)
                    if (not causal or j <= pos) and (window is None or pos - window[0] <= j <= pos + window[1])
                ]
                if not js:
                    continue
                s = np.array([q[bi, i, h] @ k[bi, j, kh] for j in js]) * scale
                p = np.exp(s - s.max())
                out[bi, i, h] = (p / p.sum()) @ v[bi, js, kh]
    return out


def _rand(rng, shape, dtype=np.float32):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32), dtype)


def _err(got, want) -> float:
    if np.size(want) == 0:
        return 0.0 if np.size(got) == 0 else float("inf")
    return float(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max())


# ─── reference vs numpy ───────────────────────────────────────────────────

REF_CASES = [
    dict(),
    dict(causal=True),
    dict(local_window_size=(3, 2)),
    dict(causal=True, local_window_size=4),
    dict(causal=True, q_offset=3, sk=9),
    dict(kv_lens=[5, 9], q_lens=[7, 2], sk=9),
]


@pytest.mark.parametrize("case", REF_CASES, ids=[str(c) for c in REF_CASES])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_reference_matches_numpy(rng, case, heads):
    case = dict(case)
    sk = case.pop("sk", 7)
    q, k, v = _rand(rng, (2, 7, heads[0], 8)), _rand(rng, (2, sk, heads[1], 8)), _rand(rng, (2, sk, heads[1], 8))
    got = ref.attention(q, k, v, **case)
    causal = case.get("causal", False)
    want = np_attention(
        q,
        k,
        v,
        causal=causal,
        window=ref.window_pair(case.get("local_window_size"), causal),
        q_len=case.get("q_lens"),
        kv_len=case.get("kv_lens"),
        q_pos0=[case.get("q_offset", 0)] * 2,
    )
    assert got.shape == q.shape and _err(got, want) < 1e-5


@pytest.mark.parametrize(
    "kw", [dict(), dict(is_causal=True), dict(local_window_size=(2, 1)), dict(is_causal=True, local_window_size=(3, 0))]
)
def test_reference_matches_jax_nn(rng, kw):
    q, k, v = _rand(rng, (2, 9, 4, 16)), _rand(rng, (2, 9, 2, 16)), _rand(rng, (2, 9, 2, 16))
    want = jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw)
    got = ref.attention(
        q, k, v, causal=kw.get("is_causal", False), local_window_size=kw.get("local_window_size"), scale=None
    )
    assert _err(got, want) < 1e-5


def test_reference_ragged_and_decode_match_numpy(rng):
    # ragged: 3 sequences, kv longer than q (a cached prefix), one empty sequence
    qo, ko = np.array([0, 3, 3, 8]), np.array([0, 5, 7, 13])
    q, k, v = _rand(rng, (9, 4, 8)), _rand(rng, (13, 2, 8)), _rand(rng, (13, 2, 8))
    got = np.asarray(ref.ragged_attention(q, k, v, qo, kv_row_offsets=ko, causal=True))
    for b in range(3):
        ql, kl = qo[b + 1] - qo[b], ko[b + 1] - ko[b]
        want = np_attention(
            q[None, qo[b] : qo[b + 1]],
            k[None, ko[b] : ko[b + 1]],
            v[None, ko[b] : ko[b + 1]],
            causal=True,
            q_pos0=[kl - ql],
        )
        assert _err(got[qo[b] : qo[b + 1]], want[0]) < 1e-5
    assert not got[8:].any()  # row 8 belongs to no sequence
    # decode: 2 new tokens against caches of different lengths
    qd, kc, vc = _rand(rng, (2, 2, 4, 8)), _rand(rng, (2, 11, 2, 8)), _rand(rng, (2, 11, 2, 8))
    lens = np.array([4, 11])
    want = np_attention(qd, kc, vc, causal=True, kv_len=lens, q_pos0=lens - 2)
    assert _err(ref.decode_attention(qd, kc, vc, lens), want) < 1e-5
    want_w = np_attention(qd, kc, vc, causal=True, kv_len=lens, q_pos0=lens - 2, window=(2, 0))
    assert _err(ref.decode_attention(qd, kc, vc, lens, local_window_size=(2, 0)), want_w) < 1e-5
    # paged: the same caches cut into pages of 4 and scattered through a pool
    pool_k, pool_v = np.zeros((9, 4, 2, 8), np.float32), np.zeros((9, 4, 2, 8), np.float32)
    table = np.array([[5, 1, 7], [2, 8, 0]])
    kp = np.pad(np.asarray(kc), ((0, 0), (0, 1), (0, 0), (0, 0)))
    vp = np.pad(np.asarray(vc), ((0, 0), (0, 1), (0, 0), (0, 0)))
    for b in range(2):
        for j in range(3):
            pool_k[table[b, j]], pool_v[table[b, j]] = kp[b, 4 * j : 4 * j + 4], vp[b, 4 * j : 4 * j + 4]
    assert _err(ref.paged_decode_attention(qd, pool_k, pool_v, table, lens), want) < 1e-5


def test_reference_rows_without_keys_are_zero_with_zero_gradients(rng):
    """Rows past ``q_lens`` see no key: zeros, lse -inf, and gradients that are
    jax.nn.dot_product_attention's over the valid rows alone (no NaN leaks in)."""
    q, k, v = _rand(rng, (2, 7, 4, 8)), _rand(rng, (2, 9, 2, 8)), _rand(rng, (2, 9, 2, 8))
    w = _rand(rng, (2, 7, 4, 8))
    q_lens = np.array([3, 7])

    def loss(q, k, v):
        return jnp.sum(ref.attention(q, k, v, q_lens=q_lens) * w)

    o, lse = ref.attention_with_lse(q, k, v, q_lens=q_lens)
    assert not np.asarray(o[0, 3:]).any() and np.isneginf(np.asarray(lse[0, :, 3:])).all()
    assert np.isfinite(np.asarray(lse[0, :, :3])).all()
    grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    for b, n in enumerate(q_lens):
        wb = w[b : b + 1, :n]
        want = jax.grad(
            lambda q, k, v, wb=wb: jnp.sum(jax.nn.dot_product_attention(q, k, v, implementation="xla") * wb),
            argnums=(0, 1, 2),
        )(q[b : b + 1, :n], k[b : b + 1], v[b : b + 1])
        assert _err(grads[0][b : b + 1, :n], want[0]) < 1e-5 and not np.asarray(grads[0][b, n:]).any()
        assert _err(grads[1][b : b + 1], want[1]) < 1e-5 and _err(grads[2][b : b + 1], want[2]) < 1e-5


def test_reference_errors_name_the_parameter():
    z = np.zeros((1, 4, 3, 8), np.float32)
    with pytest.raises(ValueError, match="n_heads .* multiple of n_kv_heads"):
        ref.attention(z, np.zeros((1, 4, 2, 8), np.float32), np.zeros((1, 4, 2, 8), np.float32))
    with pytest.raises(ValueError, match="local_window_size"):
        ref.attention(z, z, z, local_window_size="wide")
    with pytest.raises(ValueError, match="head_dim"):
        ref.attention(z, np.zeros((1, 4, 3, 4), np.float32), np.zeros((1, 4, 3, 4), np.float32))


# ─── flash attention kernels (interpret mode) ─────────────────────────────

from custom_calls.attention import pallas_decode as pd  # noqa: E402
from custom_calls.attention import pallas_flash as pf  # noqa: E402

# Small tiles so that tiny sequences span several tiles (block skipping, edge tiles, masks).
CFG = pf.FlashConfig(block_q=32, block_k=16, num_warps=4, num_stages=2, block_q_bwd=16, block_k_bwd=32)
TOL = {"float32": 2e-5, "bfloat16": 3e-2, "float16": 4e-3}

FWD_CASES = [
    # (B, Sq, Sk, Hq, Hkv, D, dtype, kwargs)
    (2, 64, 64, 4, 4, 32, "float32", {}),
    (1, 50, 70, 4, 1, 24, "float32", dict(causal=True)),  # uneven S, non-power-of-2 head_dim, MQA
    (2, 45, 45, 2, 2, 32, "float32", dict(local_window_size=(7, 3))),
    (1, 64, 64, 4, 2, 32, "float32", dict(causal=True, local_window_size=(20, 0))),
    (2, 40, 48, 4, 2, 32, "float32", dict(causal=True, q_lens=[33, 40], kv_lens=[48, 21], q_offset=8)),
    (1, 64, 64, 4, 2, 64, "bfloat16", dict(causal=True)),
    (2, 40, 40, 2, 1, 32, "float16", {}),
]


def _case_id(c):
    b, sq, sk, hq, hkv, d, dt, kw = c
    return f"B{b}-Sq{sq}-Sk{sk}-H{hq}/{hkv}-D{d}-{dt}-" + ",".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("case", FWD_CASES, ids=[_case_id(c) for c in FWD_CASES])
def test_flash_forward_matches_reference(rng, case):
    b, sq, sk, hq, hkv, d, dt, kw = case
    q, k, v = _rand(rng, (b, sq, hq, d), dt), _rand(rng, (b, sk, hkv, d), dt), _rand(rng, (b, sk, hkv, d), dt)
    o, lse = pf.flash_attention(q, k, v, config=CFG, interpret=True, return_lse=True, **kw)
    o_ref, lse_ref = ref.attention_with_lse(q, k, v, **kw)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert _err(o, o_ref) < TOL[dt]
    fin = np.isfinite(np.asarray(lse_ref))
    assert np.array_equal(np.isfinite(np.asarray(lse)), fin)
    assert _err(np.asarray(lse)[fin], np.asarray(lse_ref)[fin]) < 1e-4


GRAD_CASES = [
    (1, 50, 50, 4, 2, 24, "float32", dict(causal=True)),
    (2, 45, 45, 2, 2, 32, "float32", dict(local_window_size=(7, 3))),
    (2, 64, 64, 4, 2, 32, "float32", {}),
    (1, 64, 64, 4, 1, 32, "bfloat16", dict(causal=True)),
    # whole tiles ("even"): the masked loops apply only the causal/window mask, no row or key bounds
    (1, 64, 64, 4, 2, 32, "float32", dict(causal=True, local_window_size=(20, 0))),
    (1, 64, 64, 2, 2, 32, "float32", dict(local_window_size=(7, 3))),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[_case_id(c) for c in GRAD_CASES])
def test_flash_gradients_match_reference(rng, case):
    b, sq, sk, hq, hkv, d, dt, kw = case
    q, k, v = _rand(rng, (b, sq, hq, d), dt), _rand(rng, (b, sk, hkv, d), dt), _rand(rng, (b, sk, hkv, d), dt)
    do = _rand(rng, (b, sq, hq, d), dt)
    o, vjp = jax.vjp(lambda *a: pf.flash_attention(*a, config=CFG, interpret=True, **kw), q, k, v)
    o_ref, vjp_ref = jax.vjp(lambda *a: ref.attention(*a, **kw), q, k, v)
    assert _err(o, o_ref) < TOL[dt]
    for name, g, g_ref in zip("qkv", vjp(do), vjp_ref(do)):
        assert g.dtype == jnp.dtype(dt) and g.shape == g_ref.shape
        scale = max(float(np.abs(np.asarray(g_ref, np.float32)).max()), 1.0)
        assert _err(g, g_ref) / scale < (1e-5 if dt == "float32" else 3e-2), name


def test_inputs_shorter_than_one_tile(rng):
    """40 rows in all, default tiles of 64: whole-array blocks must still hold one tile (regression)."""
    q, k = _rand(rng, (1, 40, 4, 32)), _rand(rng, (1, 40, 2, 32))
    g = jax.grad(lambda q, k: pf.flash_attention(q, k, k, causal=True, interpret=True).sum(), argnums=(0, 1))(q, k)
    g_ref = jax.grad(lambda q, k: ref.attention(q, k, k, causal=True).sum(), argnums=(0, 1))(q, k)
    assert all(_err(a, b) < 1e-5 for a, b in zip(g, g_ref))
    lens = np.array([33], np.int32)
    assert (
        _err(pd.decode_attention(q[:, :1], k, k, lens, interpret=True), ref.decode_attention(q[:, :1], k, k, lens))
        < 1e-5
    )


MASKS = [{}, dict(causal=True), dict(local_window_size=(5, 2)), dict(causal=True, local_window_size=(9, 0))]


@pytest.mark.slow
@pytest.mark.parametrize("dt", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kw", MASKS, ids=[str(m) for m in MASKS])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_flash_grid_slow(rng, dt, kw, heads):
    """The full dtype x mask x head-ratio grid at an uneven length (forward; gradients for float32)."""
    q, k, v = (
        _rand(rng, (2, 40, heads[0], 32), dt),
        _rand(rng, (2, 40, heads[1], 32), dt),
        _rand(rng, (2, 40, heads[1], 32), dt),
    )
    o, vjp = jax.vjp(lambda *a: pf.flash_attention(*a, config=CFG, interpret=True, **kw), q, k, v)
    o_ref, vjp_ref = jax.vjp(lambda *a: ref.attention(*a, **kw), q, k, v)
    assert _err(o, o_ref) < TOL[dt]
    if dt == "float32":
        do = _rand(rng, o.shape)
        for g, g_ref in zip(vjp(do), vjp_ref(do)):
            assert _err(g, g_ref) < 1e-4


def test_flash_ragged_forward_and_gradients(rng):
    # 4 sequences (one empty), keys longer than queries (cached prefix), GQA, causal
    qo, ko = np.array([0, 5, 5, 37, 50]), np.array([0, 9, 12, 44, 63])
    q, k, v = _rand(rng, (52, 4, 32)), _rand(rng, (63, 2, 32)), _rand(rng, (63, 2, 32))
    do = _rand(rng, (52, 4, 32))
    kw = dict(kv_row_offsets=ko, causal=True)
    o, vjp = jax.vjp(lambda *a: pf.flash_attention_ragged(*a, qo, config=CFG, interpret=True, **kw), q, k, v)
    o_ref, vjp_ref = jax.vjp(lambda *a: ref.ragged_attention(*a, qo, **kw), q, k, v)
    assert _err(o, o_ref) < 2e-5 and not np.asarray(o)[50:].any()
    for g, g_ref in zip(vjp(do), vjp_ref(do)):
        assert _err(g, g_ref) < 1e-4


# ─── Triton lowering, checked on CPU ──────────────────────────────────────


def _lowers_for_cuda(f, *args) -> int:
    """Export ``f`` for CUDA from the CPU (abstract H100); returns the number of Triton custom calls."""
    from jax.experimental.pallas import triton as pltriton

    return cuda_module(jax.jit(f), *args).count(pltriton.CUSTOM_CALL_TARGET_NAME)


LOWER_FLASH = [
    # (S, Hq, Hkv, D, dtype, kwargs, config)
    (4096, 16, 16, 128, jnp.bfloat16, dict(causal=True), None),  # the benchmark shape, default H100 blocks
    (1000, 8, 2, 64, jnp.float16, dict(local_window_size=(128, 16)), None),
    (300, 4, 1, 80, jnp.float32, dict(causal=True, local_window_size=(64, 0)), None),
    (512, 4, 4, 256, jnp.bfloat16, {}, None),
    (512, 8, 2, 128, jnp.bfloat16, dict(causal=True), pf.FlashConfig(64, 64, 4, 3, 32, 32, 4, 2)),
]


@pytest.mark.parametrize(
    "case", LOWER_FLASH, ids=[f"S{c[0]}-H{c[1]}/{c[2]}-D{c[3]}-{jnp.dtype(c[4]).name}" for c in LOWER_FLASH]
)
def test_flash_triton_lowering(case):
    s, hq, hkv, d, dt, kw, cfg = case
    q, kv = jax.ShapeDtypeStruct((2, s, hq, d), dt), jax.ShapeDtypeStruct((2, s, hkv, d), dt)
    fwd = lambda q, k, v: pf.flash_attention(q, k, v, config=cfg, **kw)  # noqa: E731
    assert _lowers_for_cuda(fwd, q, kv, kv) == 1
    grad = jax.grad(lambda q, k, v: fwd(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))
    assert _lowers_for_cuda(grad, q, kv, kv) == 3  # forward, dK/dV, dQ


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 128, 192, 256])
def test_default_tiles_fit_h100_shared_memory(head_dim, dtype):
    """The K/V tiles the loop stages stream must fit an H100 block's 227 KiB.

    On the first H100 run, float32 at head_dim 80 (padded to 128) with the bf16
    tiles (2 stages x K and V x 128 x 128) asked for exactly 262144 bytes and
    was refused; 2-byte dtypes keep the tuned tiles.
    """
    cfg = pf.default_config(head_dim, dtype)
    dp, itemsize = max(16, 1 << (head_dim - 1).bit_length()), jnp.dtype(dtype).itemsize
    assert cfg.num_stages * 2 * cfg.block_k * dp * itemsize <= 227 * 1024
    assert cfg.num_stages_bwd * 2 * max(cfg.block_q_bwd, cfg.block_k_bwd) * dp * itemsize <= 227 * 1024
    if itemsize == 2:
        assert cfg == pf.default_config(head_dim)
    if head_dim == 80 and dtype == jnp.float32:
        assert cfg.block_k == 64


def test_flash_ragged_triton_lowering():
    q, kv = jax.ShapeDtypeStruct((700, 8, 128), jnp.bfloat16), jax.ShapeDtypeStruct((900, 2, 128), jnp.bfloat16)
    off = jax.ShapeDtypeStruct((5,), jnp.int32)
    f = lambda q, k, v, qo, ko: pf.flash_attention_ragged(  # noqa: E731
        q, k, v, qo, kv_row_offsets=ko, causal=True, max_seq_len=512, max_kv_len=512
    )
    assert _lowers_for_cuda(f, q, kv, kv, off, off) == 1
    g = jax.grad(lambda q, k, v, qo, ko: f(q, k, v, qo, ko).astype(jnp.float32).sum(), argnums=(0, 1, 2))
    assert _lowers_for_cuda(g, q, kv, kv, off, off) == 3


# ─── decode kernels (interpret mode) ──────────────────────────────────────

DECODE_CASES = [
    # (B, Sq, Hq, Hkv, D, T, kv_lens, dtype, kwargs, config)
    (2, 1, 8, 2, 64, 300, [17, 300], "float32", {}, pd.DecodeConfig(block_k=32, num_splits=3)),
    (3, 3, 4, 4, 40, 100, [3, 50, 100], "float32", dict(local_window_size=(20, 0)), pd.DecodeConfig(block_k=16)),
    (2, 2, 4, 1, 32, 64, [0, 37], "float32", dict(causal=False), pd.DecodeConfig(block_k=16, num_splits=2)),
    (2, 1, 16, 2, 64, 200, [130, 7], "bfloat16", {}, pd.DecodeConfig(block_k=32, num_splits=4)),
]


def _paged(rng, k, v, page):
    """Scatter dense caches ``[B, T, H, D]`` into a shuffled pool of pages; returns (k_pages, v_pages, block_table)."""
    b, t = k.shape[:2]
    n = -(-t // page)
    pool = b * n + 3
    table = rng.permutation(pool)[: b * n].reshape(b, n).astype(np.int32)
    pad = ((0, 0), (0, n * page - t), (0, 0), (0, 0))
    kk, vv = np.pad(np.asarray(k, np.float32), pad), np.pad(np.asarray(v, np.float32), pad)
    kp = np.full((pool, page) + k.shape[2:], np.nan, np.float32)  # unused pages are poison
    vp = kp.copy()
    for bi in range(b):
        for j in range(n):
            kp[table[bi, j]], vp[table[bi, j]] = kk[bi, j * page : (j + 1) * page], vv[bi, j * page : (j + 1) * page]
    return jnp.asarray(kp, k.dtype), jnp.asarray(vp, k.dtype), table


@pytest.mark.parametrize(
    "case", DECODE_CASES, ids=[f"B{c[0]}-Sq{c[1]}-H{c[2]}/{c[3]}-D{c[4]}-T{c[5]}-{c[7]}" for c in DECODE_CASES]
)
def test_decode_kernel_matches_reference(rng, case):
    b, sq, hq, hkv, d, t, lens, dt, kw, cfg = case
    q, k, v = _rand(rng, (b, sq, hq, d), dt), _rand(rng, (b, t, hkv, d), dt), _rand(rng, (b, t, hkv, d), dt)
    lens = np.array(lens, np.int32)
    want = ref.decode_attention(q, k, v, lens, **kw)
    got = pd.decode_attention(q, k, v, lens, config=cfg, interpret=True, **kw)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert _err(got, want) < TOL[dt]
    page = 16 if d != 40 else 32  # page 32 with 16-key tiles: two tiles per page
    kp, vp, table = _paged(rng, k, v, page)
    got_p = pd.paged_decode_attention(q, kp, vp, table, lens, config=cfg, interpret=True, **kw)
    assert _err(got_p, want) < TOL[dt]
    pool, layer = _pool(rng, kp, vp)
    got_pool = pd.paged_decode_attention_pool(q, pool, layer, table, lens, config=cfg, interpret=True, **kw)
    assert _err(got_pool, want) < TOL[dt]


def _pool(rng, kp, vp, layers: int = 3, layer: int = 1):
    """``[P, 2, layers, page, H, D]`` holding ``kp``/``vp`` at ``layer`` and random values in the other layers."""
    noise = rng.standard_normal((kp.shape[0], 2, layers, *kp.shape[1:])).astype(np.float32)
    pool = jnp.asarray(noise, kp.dtype).at[:, 0, layer].set(kp).at[:, 1, layer].set(vp)
    return pool, layer


def test_pool_decode_gradients_reach_only_the_layer_read(rng):
    b, sq, hq, hkv, d, t, lens, _, kw, cfg = DECODE_CASES[0]
    q, k, v = _rand(rng, (b, sq, hq, d)), _rand(rng, (b, t, hkv, d)), _rand(rng, (b, t, hkv, d))
    kp, vp, table = _paged(rng, k, v, 16)
    pool, layer = _pool(rng, jnp.nan_to_num(kp), jnp.nan_to_num(vp))
    lens = np.array(lens, np.int32)
    got = jax.grad(
        lambda q, p: pd.paged_decode_attention_pool(q, p, layer, table, lens, config=cfg, interpret=True).sum(),
        argnums=(0, 1),
    )(q, pool)
    gk, gv = jax.grad(lambda k, v: ref.decode_attention(q, k, v, lens).sum(), argnums=(0, 1))(k, v)
    assert _err(got[0], jax.grad(lambda q: ref.decode_attention(q, k, v, lens).sum())(q)) < 1e-5
    g_layer = np.asarray(got[1])[:, :, layer]  # [P, 2, page, H, D] → back to dense [B, T, H, D] through the table
    dense = lambda x: x[table].reshape(b, -1, hkv, d)[:, :t]  # noqa: E731
    assert _err(dense(g_layer[:, 0]), gk) < 1e-5 and _err(dense(g_layer[:, 1]), gv) < 1e-5
    assert not np.delete(np.asarray(got[1]), layer, axis=2).any()


def test_decode_gradients_use_the_reference(rng):
    b, sq, hq, hkv, d, t, lens, _, kw, cfg = DECODE_CASES[0]
    q, k, v = _rand(rng, (b, sq, hq, d)), _rand(rng, (b, t, hkv, d)), _rand(rng, (b, t, hkv, d))
    lens = np.array(lens, np.int32)
    got = jax.grad(lambda *a: pd.decode_attention(*a, lens, config=cfg, interpret=True).sum(), argnums=(0, 1, 2))(
        q, k, v
    )
    want = jax.grad(lambda *a: ref.decode_attention(*a, lens).sum(), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        assert _err(g, w) < 1e-5


def test_decode_triton_lowering():
    s = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    dense = lambda q, k, v, n: pd.decode_attention(q, k, v, n)  # noqa: E731
    assert (
        _lowers_for_cuda(
            dense, s((8, 1, 32, 128), bf), s((8, 8192, 8, 128), bf), s((8, 8192, 8, 128), bf), s((8,), jnp.int32)
        )
        == 1
    )
    win = lambda q, k, v, n: pd.decode_attention(q, k, v, n, local_window_size=(100, 0))  # noqa: E731
    f32 = jnp.float32
    assert (
        _lowers_for_cuda(
            win, s((2, 3, 8, 80), f32), s((2, 1000, 2, 80), f32), s((2, 1000, 2, 80), f32), s((2,), jnp.int32)
        )
        == 1
    )
    paged = lambda q, k, v, bt, n: pd.paged_decode_attention(q, k, v, bt, n)  # noqa: E731
    in_pool = lambda q, p, i, bt, n: pd.paged_decode_attention_pool(q, p, i, bt, n)  # noqa: E731
    for page, dt in ((128, bf), (16, jnp.float16)):
        pool = s((600, page, 8, 128), dt)
        assert (
            _lowers_for_cuda(paged, s((4, 1, 32, 128), dt), pool, pool, s((4, 64), jnp.int32), s((4,), jnp.int32)) == 1
        )
        layers = s((600, 2, 4, page, 8, 128), dt)
        args = (s((4, 1, 32, 128), dt), layers, s((), jnp.int32), s((4, 64), jnp.int32), s((4,), jnp.int32))
        assert _lowers_for_cuda(in_pool, *args) == 1


# ─── dispatch ─────────────────────────────────────────────────────────────

from custom_calls.attention import dispatch  # noqa: E402


def test_dispatch_reference_without_env(monkeypatch, rng):
    monkeypatch.delenv(dispatch.ENV_INTERPRET, raising=False)
    q, kv = _rand(rng, (1, 8, 2, 16)), _rand(rng, (1, 8, 2, 16))
    if not HAS_GPU:
        assert dispatch.kernel_mode() is None
        assert not uses_pallas(lambda a: ca.flash_attention(a, kv, kv, causal=True), q)
        assert not uses_pallas(lambda a: ca.decode_attention(a[:, :1], kv, kv, jnp.array([5])), q)
    assert _err(ca.flash_attention(q, kv, kv, causal=True), ref.attention(q, kv, kv, causal=True)) < 1e-6


def test_dispatch_env_forces_interpreted_kernels(monkeypatch, rng):
    """The public functions under MAXFX_PALLAS_INTERPRET=1 reuse the shapes compiled above (no new compiles)."""
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    assert dispatch.kernel_mode() == "interpret" and dispatch.kernel_mode("reference") is None
    # flash: the first grad case, through the public API (default config → different tiles, same results)
    b, sq, sk, hq, hkv, d, dt, kw = GRAD_CASES[2]
    q, k, v = _rand(rng, (b, sq, hq, d)), _rand(rng, (b, sk, hkv, d)), _rand(rng, (b, sk, hkv, d))
    f = lambda *a: ca.flash_attention(*a, config=CFG)  # noqa: E731
    assert uses_pallas(f, q, k, v)
    assert _err(f(q, k, v), ref.attention(q, k, v)) < 2e-5
    # ragged: whole rows through the public API
    qo = np.array([0, 20, 64])
    o = ca.flash_attention_ragged(q[0], k[0], v[0], qo, causal=True, config=CFG)
    assert _err(o, ref.ragged_attention(q[0], k[0], v[0], qo, causal=True)) < 2e-5
    # decode and paged
    b, sq, hq, hkv, d, t, lens, dt, kw, cfg = DECODE_CASES[3]
    qd, kc, vc = _rand(rng, (b, sq, hq, d), dt), _rand(rng, (b, t, hkv, d), dt), _rand(rng, (b, t, hkv, d), dt)
    lens = np.array(lens, np.int32)
    want = ref.decode_attention(qd, kc, vc, lens)
    assert uses_pallas(lambda a: ca.decode_attention(a, kc, vc, lens, config=cfg), qd)
    assert _err(ca.decode_attention(qd, kc, vc, lens, config=cfg), want) < TOL[dt]
    kp, vp, table = _paged(rng, kc, vc, 16)
    assert _err(ca.paged_decode_attention(qd, kp, vp, table, lens, config=cfg), want) < TOL[dt]


def test_dispatch_fallbacks_warn_once(monkeypatch, rng):
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    dispatch.reset_warnings()
    with jax.enable_x64(True):
        q = jnp.asarray(rng.standard_normal((1, 4, 2, 8)), jnp.float64)
        with pytest.warns(UserWarning, match="flash_attention: dtype float64 has no kernel"):
            o = ca.flash_attention(q, q, q, causal=True)
        assert o.dtype == jnp.float64 and _err(o, ref.attention(q, q, q, causal=True)) < 1e-12
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ca.flash_attention(q, q, q, causal=True)  # second time: silent
    big = _rand(rng, (1, 2, 1, 288))
    with pytest.warns(UserWarning, match="head_dim 288 > 256"):
        ca.decode_attention(big, big, big, np.array([2]))
    qd, pages = _rand(rng, (1, 1, 2, 8)), _rand(rng, (3, 8, 1, 8))
    with pytest.warns(UserWarning, match="page_size 8 is not a multiple of 16"):
        o = ca.paged_decode_attention(qd, pages, pages, np.array([[2, 0]]), np.array([11]))
    assert _err(o, ref.paged_decode_attention(qd, pages, pages, np.array([[2, 0]]), np.array([11]))) < 1e-6


def test_dispatch_errors_name_the_parameter(rng):
    z = np.zeros((1, 4, 4, 8), np.float32)
    kv3 = np.zeros((1, 4, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"n_heads of q \(4\) must be a multiple of n_kv_heads \(3\)"):
        ca.flash_attention(z, kv3, kv3)
    with pytest.raises(ValueError, match="dtypes differ"):
        ca.flash_attention(z, z.astype(np.float16), z)
    with pytest.raises(ValueError, match="dtype must be floating point"):
        ca.flash_attention(z.astype(np.int32), z.astype(np.int32), z.astype(np.int32))
    with pytest.raises(ValueError, match="local_window_size"):
        ca.flash_attention(z, z, z, local_window_size=(-1, 2))
    with pytest.raises(ValueError, match=r"kv_lens: flash_attention expects int \[1\]"):
        ca.flash_attention(z, z, z, kv_lens=[1, 2])
    with pytest.raises(ValueError, match="input_row_offsets"):
        ca.flash_attention_ragged(z[0], z[0], z[0], np.array([[0, 4]]))
    with pytest.raises(ValueError, match=r"max_seq_len: 3 is smaller than the longest sequence in the offsets \(4\)"):
        ca.flash_attention_ragged(z[0], z[0], z[0], np.array([0, 4]), max_seq_len=3)
    with pytest.raises(ValueError, match=r"kv_lens: decode_attention expects int \[1\]"):
        ca.decode_attention(z[:, :1], z, z, np.array([1, 2]))
    with pytest.raises(ValueError, match="block_table"):
        ca.paged_decode_attention(z[:, :1], z, z, np.array([0, 1]), np.array([3]))
    pool = np.zeros((3, 2, 2, 16, 4, 8), np.float32)
    with pytest.raises(ValueError, match=r"pool: expected \[num_pages, 2 \(K, V\), num_layers"):
        ca.paged_decode_attention_pool(z[:, :1], pool[:, :1], 0, np.array([[0]]), np.array([3]))
    with pytest.raises(ValueError, match="layer: paged_decode_attention_pool expects an integer scalar"):
        ca.paged_decode_attention_pool(z[:, :1], pool, 0.5, np.array([[0]]), np.array([3]))
    with pytest.raises(ValueError, match=r"head_dim of q \(8\) and k \(4\) differ"):
        ca.paged_decode_attention_pool(z[:, :1], pool[..., :4], 0, np.array([[0]]), np.array([3]))
    with pytest.raises(ValueError, match="impl"):
        ca.flash_attention(z, z, z, impl="cudnn")
    with pytest.raises(ValueError, match="block_q: must be a power of two"):
        pf.FlashConfig(block_q=48)
    with pytest.raises(ValueError, match="page_size: the paged decode kernel needs a multiple of 16"):
        pd.paged_decode_attention(z[:, :1], z, z, np.array([[0]]), np.array([3]), interpret=True)


# ─── benchmark script smoke run ───────────────────────────────────────────


def _bench_quick(tmp_path, *extra):
    from tests.bench import kernels

    out = tmp_path / "k.json"
    res = kernels.main(["--quick", "--out", str(out), *extra])
    data = json.loads(out.read_text())
    assert data["quick"] and res["prefill"] and res["decode"]
    pre = data["prefill"][0]
    assert not pre["errors"] and pre["fwd"]["pallas_default"]["us"] > 0 and pre["fwd_rel_err_vs_xla"] < 1e-2
    dec = data["decode"][0]
    assert (
        not dec["errors"] and dec["impls"]["pallas_paged"]["GBps"] > 0 and dec["impls"]["pallas_paged_pool"]["GBps"] > 0
    )
    assert max(dec["rel_errs_vs_xla"].values()) < 1e-2 and {"pallas_paged", "pallas_paged_pool"} <= set(
        dec["rel_errs_vs_xla"]
    )
    return pre


def test_benchmark_quick_forward_and_decode(tmp_path):
    _bench_quick(tmp_path, "--no-bwd")


@pytest.mark.slow
def test_benchmark_quick_with_backward(tmp_path):
    pre = _bench_quick(tmp_path)
    assert max(pre["grad_rel_err_vs_xla"]) < 1e-2 and "pallas_default" in pre["fwd_bwd"]


# ─── GPU (compiled Triton kernels) ────────────────────────────────────────

GPU_FLASH = [
    (2, 256, 256, 8, 2, 128, "bfloat16", dict(causal=True)),
    (1, 300, 300, 4, 4, 64, "float16", dict(local_window_size=(64, 0), causal=True)),
    (2, 200, 330, 4, 1, 80, "float32", {}),
]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("case", GPU_FLASH, ids=[_case_id(c) for c in GPU_FLASH])
def test_gpu_flash_forward_and_gradients(case):
    b, sq, sk, hq, hkv, d, dt, kw = case
    with jax.default_device(jax.devices("gpu")[0]):
        ks = jax.random.split(jax.random.key(0), 4)
        q = jax.random.normal(ks[0], (b, sq, hq, d), dt)
        k, v = (jax.random.normal(x, (b, sk, hkv, d), dt) for x in ks[1:3])
        do = jax.random.normal(ks[3], (b, sq, hq, d), dt)
        o, vjp = jax.vjp(jax.jit(lambda *a: pf.flash_attention(*a, **kw)), q, k, v)
        o_ref, vjp_ref = jax.vjp(lambda *a: ref.attention(*(x.astype(jnp.float32) for x in a), **kw), q, k, v)
        assert _err(o, o_ref) < TOL[dt] * 2
        for g, g_ref in zip(vjp(do), vjp_ref(do.astype(jnp.float32))):
            scale = max(float(jnp.abs(g_ref).max()), 1.0)
            assert _err(g, g_ref) / scale < (1e-4 if dt == "float32" else 3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_gpu_decode_paged_and_dispatch(rng):
    dev = jax.devices("gpu")[0]
    with jax.default_device(dev):
        b, hq, hkv, d, t = 3, 32, 8, 128, 1000
        q, k, v = (
            _rand(rng, (b, 1, hq, d), "bfloat16"),
            _rand(rng, (b, t, hkv, d), "bfloat16"),
            _rand(rng, (b, t, hkv, d), "bfloat16"),
        )
        lens = jnp.array([1, 517, 1000], jnp.int32)
        want = ref.decode_attention(q, k, v, lens)
        assert _err(jax.jit(pd.decode_attention)(q, k, v, lens), want) < 2e-2
        kp, vp, table = _paged(rng, k, v, 128)
        assert _err(jax.jit(pd.paged_decode_attention)(q, kp, vp, table, lens), want) < 2e-2
        pool, layer = _pool(rng, kp, vp)
        assert _err(jax.jit(pd.paged_decode_attention_pool)(q, pool, layer, table, lens), want) < 2e-2
        f = jax.jit(lambda *a: ca.flash_attention(*a, causal=True))
        qq = jax.device_put(q.reshape(b, 1, hq, d).repeat(64, axis=1), dev)
        assert "triton" in f.lower(qq, k[:, :64], v[:, :64]).as_text()
        assert _err(f(qq, k[:, :64], v[:, :64]), ref.attention(qq, k[:, :64], v[:, :64], causal=True)) < 2e-2
