"""The C++ one-query attention kernel (custom_calls/cpu/decode_attention.cc) against numpy in float64."""

import jax
import numpy as np
import pytest
from jax.test_util import check_grads

from custom_calls import cpu as cpu_lib
from custom_calls._target import lowering_for
from custom_calls.attention import cpu, dispatch

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not cpu_lib.available(),
    reason="the kernel needs a CPU backend and a C++ compiler",
)


def _numpy_attention(q, k, v, lo, hi, scale):
    """float64 softmax attention of each row's one query over keys [lo, hi) (none visible: zeros)."""
    b, _, hq, _ = q.shape
    g = hq // k.shape[2]
    out = np.zeros((b, 1, hq, v.shape[3]))
    for r in range(b):
        keys = range(max(lo[r], 0), min(hi[r], k.shape[1]))
        if not keys:
            continue
        for h in range(hq):
            s = np.array([q[r, 0, h].astype(np.float64) @ k[r, j, h // g] for j in keys]) * scale
            p = np.exp(s - s.max())
            out[r, 0, h] = (p / p.sum()) @ v[r, list(keys), h // g].astype(np.float64)
    return out


def _inputs(rng, b=3, s=70, hq=6, hkv=2, d=64, dv=None):
    q = rng.standard_normal((b, 1, hq, d)).astype(np.float32)
    k = rng.standard_normal((b, s, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, s, hkv, dv or d)).astype(np.float32)
    return q, k, v


POS = np.array([5, 40, 69])


@pytest.mark.parametrize(
    "masks, lo, hi",
    [
        (dict(causal=True, q_offset=POS, kv_lens=POS + 1), [0, 0, 0], POS + 1),  # a decode step
        (
            dict(causal=True, q_offset=POS, kv_lens=np.array([3, 41, 70])),
            [0, 0, 0],
            [3, 41, 70],
        ),  # fewer valid keys than the position
        (dict(causal=False, kv_lens=np.array([0, 12, 70])), [0, 0, 0], [0, 12, 70]),  # an empty row gives zeros
        (dict(causal=True, local_window_size=(7, 0), q_offset=POS), POS - 7, POS + 1),  # sliding window
        (dict(causal=False, q_lens=np.array([1, 0, 1])), [0, 0, 0], [70, 0, 70]),  # a row without its query
    ],
)
def test_matches_numpy(rng, masks, lo, hi):
    q, k, v = _inputs(rng)
    assert cpu.applies(q, k, v, extensions=False)
    got = np.asarray(dispatch.flash_attention(q, k, v, scale=0.125, **masks))
    np.testing.assert_allclose(
        got, _numpy_attention(q, k, v, np.asarray(lo), np.asarray(hi), 0.125), rtol=1e-5, atol=1e-5
    )


def test_multi_query_and_narrower_values(rng):
    q, k, v = _inputs(rng, b=2, s=33, hq=8, hkv=1, d=32, dv=16)
    got = np.asarray(cpu.one_query_attention(q, k, v, causal=True, window=None, scale=None, q_offset=32))
    np.testing.assert_allclose(got, _numpy_attention(q, k, v, [0, 0], [33, 33], 32**-0.5), rtol=1e-5, atol=1e-5)


def test_dense_cache_is_read_in_place(rng):
    """A cache [B, L, Hkv, D] (the one layout of every attention path), written in place, compiles to no copy of the
    cache.
    """
    q, k, v = _inputs(rng, b=1, s=256)

    def step(q, k, v, row):
        k, v = k.at[0, 200].set(row), v.at[0, 200].set(row)
        return dispatch.flash_attention(q, k, v, causal=True, q_offset=200), k, v

    row = np.ones(k.shape[2:], np.float32)
    hlo = jax.jit(step, donate_argnums=(1, 2)).lower(q, k, v, row).compile().as_text()
    assert "maxfx_paged_decode_attention" in hlo
    shape = "f32[" + ",".join(str(n) for n in k.shape) + "]"
    copies = [line for line in hlo.splitlines() if ("transpose(" in line or " copy(" in line) and shape in line]
    assert not copies, f"the cache was copied into another layout: {copies}"
    k2, v2 = (np.asarray(x).copy() for x in (k, v))
    k2[0, 200], v2[0, 200] = row, row
    np.testing.assert_allclose(
        np.asarray(jax.jit(step)(q, k, v, row)[0]),
        _numpy_attention(q, k2, v2, [0], [201], 64**-0.5),
        rtol=1e-5,
        atol=1e-5,
    )


def test_gradients_match_finite_differences(rng):
    q, k, v = _inputs(rng, b=2, s=9, hq=4, hkv=2, d=8)

    def f(q, k, v):
        return dispatch.flash_attention(q, k, v, causal=True, q_offset=np.array([4, 8]))

    check_grads(f, (q.astype(np.float32), k, v), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)


def test_not_used_where_it_cannot_run(rng):
    q, k, v = _inputs(rng)
    assert not cpu.applies(q.astype(np.float16), k, v, extensions=False)  # float32 only
    assert not cpu.applies(q, k, v, extensions=True)  # ALiBi, chunks, sinks: the reference
    assert not cpu.applies(np.concatenate([q, q], 1), k, v, extensions=False)  # two queries per row
    with lowering_for(("cpu",)):  # an export: the artifact must run where the library is not built
        assert not cpu.applies(q, k, v, extensions=False)
        hlo = (
            jax.jit(lambda q, k, v: dispatch.flash_attention(q, k, v, causal=True, q_offset=POS))
            .lower(q, k, v)
            .as_text()
        )
    assert "maxfx_paged_decode_attention" not in hlo


# ─── the paged kernel (maxfx_paged_decode_attention): pages read through a table ───


def _paged(rng, b=3, pages=24, ps=16, hq=6, hkv=2, d=64, width=6):
    """A pool, each row's table of distinct random pages, and the same keys as dense [B, W * ps, Hkv, D] rows."""
    q = rng.standard_normal((b, 1, hq, d)).astype(np.float32)
    kp = rng.standard_normal((pages, ps, hkv, d)).astype(np.float32)
    vp = rng.standard_normal((pages, ps, hkv, d)).astype(np.float32)
    table = np.stack([rng.permutation(pages)[:width] for _ in range(b)]).astype(np.int32)
    dense = lambda x: x[table].reshape(b, width * ps, hkv, d)  # noqa: E731
    return q, kp, vp, table, dense(kp), dense(vp)


@pytest.mark.parametrize("window", [None, 9])
def test_paged_matches_numpy(rng, window):
    q, kp, vp, table, k, v = _paged(rng)
    lens = np.array([1, 37, 96])  # one key, mid-page, the whole table
    got = np.asarray(
        dispatch.paged_decode_attention(
            q, kp, vp, table, lens, local_window_size=None if window is None else (window - 1, 0)
        )
    )
    lo = np.zeros(3, int) if window is None else np.maximum(lens - window, 0)
    np.testing.assert_allclose(got, _numpy_attention(q, k, v, lo, lens, 64**-0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b", [1, 3, 8])  # one row (split by KV head over the threads), a few, many
def test_float16_pool_matches_numpy_on_the_rounded_values(rng, b):
    """A float16 KV pool: read as stored (the HLO has no conversion of the pool), scores and sums in float32."""
    q, kp, vp, table, _, _ = _paged(rng, b=b, hq=6, hkv=3, d=80)  # d = 80: a 64-value register pass and a 16-value tail
    kh, vh = kp.astype(np.float16), vp.astype(np.float16)
    lens = rng.integers(1, 97, b)
    got = np.asarray(dispatch.paged_decode_attention(q, kh, vh, table, lens))
    dense = lambda x: x.astype(np.float32)[table].reshape(b, -1, 3, 80)  # noqa: E731
    np.testing.assert_allclose(
        got, _numpy_attention(q, dense(kh), dense(vh), np.zeros(b, int), lens, 80**-0.5), rtol=1e-5, atol=1e-5
    )
    hlo = (
        jax.jit(lambda q, k, v: dispatch.paged_decode_attention(q, k, v, table, lens))
        .lower(q, kh, vh)
        .compile()
        .as_text()
    )
    assert "maxfx_paged_decode_attention" in hlo and "f32[24,16,3,80]" not in hlo


def test_paged_pool_is_read_in_place(rng):
    """A pool written in place and read by the kernel compiles to no copy of the pool (a reshaped pool made XLA copy
    it).
    """
    q, kp, vp, table, _, _ = _paged(rng)

    def step(kp, vp, q, row):
        kp, vp = kp.at[3, 5].set(row), vp.at[3, 5].set(row)
        return dispatch.paged_decode_attention(q, kp, vp, table, np.array([1, 37, 96])), kp, vp

    hlo = jax.jit(step, donate_argnums=(0, 1)).lower(kp, vp, q, np.ones((2, 64), np.float32)).compile().as_text()
    assert "maxfx_paged_decode_attention" in hlo
    copies = [line for line in hlo.splitlines() if " copy(" in line and "f32[24,16,2,64]" in line]
    assert not copies, f"the pool was copied: {copies}"


def test_paged_gradients_are_the_references(rng):
    q, kp, vp, table, _, _ = _paged(rng, b=2, pages=5, ps=16, hq=4, hkv=2, d=8, width=2)
    lens = np.array([7, 30])

    def f(q, kp, vp):
        return dispatch.paged_decode_attention(q, kp, vp, table, lens)

    check_grads(f, (q, kp, vp), order=1, modes=["rev"], atol=2e-2, rtol=2e-2)
