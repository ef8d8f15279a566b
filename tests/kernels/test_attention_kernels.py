"""Attention: jnp reference vs a numpy oracle, Pallas kernels (interpret mode) vs the reference.

CPU tiers (PALLAS_NOTES.md §9): the reference (`custom_calls.attention.reference`)
against an independent float64 numpy oracle; the Pallas kernels run in
interpret mode against the reference (forward, custom-VJP gradients vs
``jax.grad`` of the reference, ragged, decode, paged); the Triton lowering of
every kernel is checked by exporting for CUDA from the CPU. Interpret-mode
compiles dominate the cost, so this module turns on JAX's persistent
compilation cache (``.jax_cache/`` in the repo, git-ignored) and keeps shapes
tiny. ``@pytest.mark.gpu`` tests run the compiled kernels
(``JAX_PLATFORMS= pytest -m gpu tests/kernels/test_attention_kernels.py``).
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

ROOT = Path(__file__).resolve().parents[2]


def _has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


HAS_GPU = _has_gpu()


@pytest.fixture(scope="module", autouse=True)
def _compile_cache():
    """Persistent XLA cache for the interpret-mode kernels (cold ~6x slower than warm)."""
    from jax._src import compilation_cache as cc

    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")
    old = {k: getattr(jax.config, k) for k in keys}
    jax.config.update(keys[0], str(ROOT / ".jax_cache" / "kernels"))
    jax.config.update(keys[1], 0.0)
    jax.config.update(keys[2], 0)
    cc.reset_cache()
    yield
    for k, v in old.items():
        jax.config.update(k, v)
    cc.reset_cache()


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Triton backend is deprecated.*")
        yield


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
                    j for j in range(kl)
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
        q, k, v, causal=causal, window=ref.window_pair(case.get("local_window_size"), causal),
        q_len=case.get("q_lens"), kv_len=case.get("kv_lens"), q_pos0=[case.get("q_offset", 0)] * 2,
    )
    assert got.shape == q.shape and _err(got, want) < 1e-5


@pytest.mark.parametrize("kw", [dict(), dict(is_causal=True), dict(local_window_size=(2, 1)), dict(is_causal=True, local_window_size=(3, 0))])
def test_reference_matches_jax_nn(rng, kw):
    q, k, v = _rand(rng, (2, 9, 4, 16)), _rand(rng, (2, 9, 2, 16)), _rand(rng, (2, 9, 2, 16))
    want = jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw)
    got = ref.attention(q, k, v, causal=kw.get("is_causal", False), local_window_size=kw.get("local_window_size"), scale=None)
    assert _err(got, want) < 1e-5


def test_reference_ragged_and_decode_match_numpy(rng):
    # ragged: 3 sequences, kv longer than q (a cached prefix), one empty sequence
    qo, ko = np.array([0, 3, 3, 8]), np.array([0, 5, 7, 13])
    q, k, v = _rand(rng, (9, 4, 8)), _rand(rng, (13, 2, 8)), _rand(rng, (13, 2, 8))
    got = np.asarray(ref.ragged_attention(q, k, v, qo, kv_row_offsets=ko, causal=True))
    for b in range(3):
        ql, kl = qo[b + 1] - qo[b], ko[b + 1] - ko[b]
        want = np_attention(q[None, qo[b]:qo[b + 1]], k[None, ko[b]:ko[b + 1]], v[None, ko[b]:ko[b + 1]], causal=True, q_pos0=[kl - ql])
        assert _err(got[qo[b]:qo[b + 1]], want[0]) < 1e-5
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
            pool_k[table[b, j]], pool_v[table[b, j]] = kp[b, 4 * j:4 * j + 4], vp[b, 4 * j:4 * j + 4]
    assert _err(ref.paged_decode_attention(qd, pool_k, pool_v, table, lens), want) < 1e-5


def test_reference_errors_name_the_parameter():
    z = np.zeros((1, 4, 3, 8), np.float32)
    with pytest.raises(ValueError, match="n_heads .* multiple of n_kv_heads"):
        ref.attention(z, np.zeros((1, 4, 2, 8), np.float32), np.zeros((1, 4, 2, 8), np.float32))
    with pytest.raises(ValueError, match="local_window_size"):
        ref.attention(z, z, z, local_window_size="wide")
    with pytest.raises(ValueError, match="head_dim"):
        ref.attention(z, np.zeros((1, 4, 3, 4), np.float32), np.zeros((1, 4, 3, 4), np.float32))
