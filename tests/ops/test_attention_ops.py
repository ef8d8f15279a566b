"""Attention and paged KV-cache registry ops against loop-based numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
from tests.ops.harness import run_op

CPU = DeviceRef.CPU()


# ─── numpy references (one sequence at a time, one head at a time) ────────


def np_alibi_slopes(n):
    p = 2 ** int(np.floor(np.log2(n)))
    base = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    return np.array(base + [2.0 ** (-4.0 * (2 * i + 1) / p) for i in range(n - p)])


def np_attend(q, k, v, q_pos, n_keys, mask="causal", scale=1.0, window=-1, sink=None):
    """q [Sq, H, D] at positions q_pos; k/v [Sk, Hkv, *] at positions 0..Sk-1, the first n_keys visible."""
    sq, h, _ = q.shape
    group = h // k.shape[1]
    out = np.zeros((sq, h, v.shape[2]))
    slopes = np_alibi_slopes(h)
    for hi in range(h):
        kh, vh = k[:, hi // group].astype(np.float64), v[:, hi // group].astype(np.float64)
        for i in range(sq):
            logits, values = [], []
            for j in range(min(n_keys, k.shape[0])):
                p = q_pos[i]
                ok = mask == "null" or j <= p
                if mask == "sliding_window":
                    ok = ok and j > p - window
                if mask == "chunked":
                    ok = ok and j // window == p // window
                if ok:
                    s = float(q[i, hi].astype(np.float64) @ kh[j]) * scale
                    if mask == "causal_alibi":
                        s += slopes[hi] * (j - p)
                    logits.append(s)
                    values.append(vh[j])
            if sink is not None:
                logits.append(float(sink[hi]))
                values.append(np.zeros(v.shape[2]))
            if logits:
                w = np.exp(np.array(logits) - max(logits))
                out[i, hi] = (w[:, None] * np.array(values)).sum(0) / w.sum()
    return out


def np_rope(x, pos, freqs, interleaved):
    """x [T, H, D]; freqs [L, D] with (cos, sin) pairs."""
    out = np.array(x, np.float64)
    d = x.shape[-1]
    for t in range(x.shape[0]):
        for i in range(d // 2):
            c, s = freqs[pos[t], 2 * i], freqs[pos[t], 2 * i + 1]
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
            out[t, :, a] = x[t, :, a] * c - x[t, :, b] * s
            out[t, :, b] = x[t, :, a] * s + x[t, :, b] * c
    return out


def freqs_table(n_pos, d, theta=10000.0):
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = np.arange(n_pos)[:, None] * inv[None, :]
    return np.stack([np.cos(ang), np.sin(ang)], -1).reshape(n_pos, d).astype(np.float32)


# ─── padded attention ─────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "mask,window",
    [("causal", -1), ("null", -1), ("sliding_window", 3), ("chunked", 4), ("causal_alibi", -1)],
)
def test_attention_padded_masks_gqa_offsets(rng, mask, window):
    b, sq, sk, h, hkv, d = 2, 5, 9, 4, 2, 8
    q = rng.normal(size=(b, sq, h, d)).astype(np.float32)
    k = rng.normal(size=(b, sk, hkv, d)).astype(np.float32)
    v = rng.normal(size=(b, sk, hkv, 6)).astype(np.float32)
    q_off = np.array([4, 1], np.uint32)
    kv_len = np.array([9, 6], np.uint32)
    out = run_op(
        lambda q, k, v, o, n: ops.attention(q, k, v, mask=mask, scale=0.3, window=window, q_offset=o, kv_length=n),
        q,
        k,
        v,
        q_off,
        kv_len,
    )
    for bi in range(b):
        want = np_attend(q[bi], k[bi], v[bi], q_off[bi] + np.arange(sq), kv_len[bi], mask, 0.3, window)
        np.testing.assert_allclose(out[bi], want, rtol=1e-5, atol=1e-5)


def test_attention_defaults_sink_and_bfloat16(rng):
    q = rng.normal(size=(1, 4, 2, 8)).astype(np.float32)
    k = rng.normal(size=(1, 4, 2, 8)).astype(np.float32)
    v = rng.normal(size=(1, 4, 2, 8)).astype(np.float32)
    sink = np.array([0.5, -1.0], np.float32)
    out = run_op(lambda q, k, v, s: ops.attention(q, k, v, scale=0.5, sink_weights=s), q, k, v, sink)
    np.testing.assert_allclose(
        out[0], np_attend(q[0], k[0], v[0], np.arange(4), 4, "causal", 0.5, sink=sink), rtol=1e-5, atol=1e-6
    )
    import ml_dtypes

    bf = [a.astype(ml_dtypes.bfloat16) for a in (q, k, v)]
    out = run_op(lambda q, k, v: ops.attention(q, k, v, mask="null", scale=0.5), *bf)
    assert out.dtype == ml_dtypes.bfloat16
    want = np_attend(*(a[0].astype(np.float32) for a in bf), np.arange(4), 4, "null", 0.5)
    np.testing.assert_allclose(out[0].astype(np.float32), want, rtol=2e-2, atol=2e-2)


def test_attention_errors():
    with Graph(
        "e",
        input_types=[
            TensorType(DType.float32, [1, 4, 3, 8]),
            TensorType(DType.float32, [1, 4, 2, 8]),
            TensorType(DType.float32, [1, 4, 2, 4]),
        ],
    ) as g:
        q, k, v = (x.tensor for x in g.inputs)
        with pytest.raises(
            ValueError, match=r"attention: query heads \(3\) must be a multiple of key/value heads \(2\)"
        ):
            ops.attention(q, k, k, scale=1.0)
        with pytest.raises(ValueError, match="attention: mask must be one of"):
            ops.attention(k, k, k, mask="diagonal", scale=1.0)
        with pytest.raises(ValueError, match="attention: mask 'sliding_window' needs a positive window size"):
            ops.attention(k, k, k, mask="sliding_window", scale=1.0)
        with pytest.raises(ValueError, match="attention: query and key head dims differ: 8 vs 4"):
            ops.attention(k, v, v, scale=1.0)


# ─── ragged attention ─────────────────────────────────────────────────────


@pytest.mark.parametrize("mask", ["causal", "null", "sliding_window"])
def test_ragged_attention(rng, mask):
    offs = np.array([0, 3, 3, 8, 10], np.uint32)  # includes an empty sequence
    t, h, hkv, d = 12, 4, 1, 4  # rows 10, 11 are padding
    q, k, v = (rng.normal(size=(t, n, d)).astype(np.float32) for n in (h, hkv, hkv))
    out = run_op(lambda q, k, v, o: ops.ragged_attention(q, k, v, o, mask=mask, scale=0.7, window=2), q, k, v, offs)
    for b in range(4):
        s, e = offs[b], offs[b + 1]
        want = np_attend(q[s:e], k[s:e], v[s:e], np.arange(e - s), e - s, mask, 0.7, 2)
        np.testing.assert_allclose(out[s:e], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out[10:], 0)


def test_ragged_attention_separate_kv_rows_and_starts(rng):
    q_offs, kv_offs = np.array([0, 2, 5], np.uint32), np.array([0, 4, 6], np.uint32)
    q = rng.normal(size=(5, 2, 4)).astype(np.float32)
    k, v = (rng.normal(size=(6, 2, 4)).astype(np.float32) for _ in range(2))
    q_start, kv_start = np.array([3, 1], np.uint32), np.array([0, 0], np.uint32)
    out = run_op(
        lambda q, k, v, a, b, c, d: ops.ragged_attention(
            q, k, v, a, kv_row_offsets=b, q_start=c, kv_start=d, scale=0.5
        ),
        q,
        k,
        v,
        q_offs,
        kv_offs,
        q_start,
        kv_start,
    )
    for b in range(2):
        qs, qe, ks, ke = q_offs[b], q_offs[b + 1], kv_offs[b], kv_offs[b + 1]
        want = np_attend(q[qs:qe], k[ks:ke], v[ks:ke], q_start[b] + np.arange(qe - qs), ke - ks, "causal", 0.5)
        np.testing.assert_allclose(out[qs:qe], want, rtol=1e-5, atol=1e-5)


# ─── paged cache ──────────────────────────────────────────────────────────

N_PAGES, LAYERS, PAGE, HKV, D = 7, 2, 4, 2, 4


def _paged_graph(build, extra_types):
    types = [BufferType(DType.float32, [N_PAGES, 2, LAYERS, PAGE, HKV, D], CPU)] + extra_types
    with Graph("paged", input_types=types) as g:
        outs = build(g.inputs[0].buffer, *[x.tensor for x in g.inputs[1:]])
        g.output(*outs)
    return InferenceSession().load(g)


def _np_slot(lookup, b, pos):
    return lookup[b, pos // PAGE], pos % PAGE


def test_kv_cache_store_and_gather(rng):
    from maxfx.driver import Tensor

    pool = rng.normal(size=(N_PAGES, 2, LAYERS, PAGE, HKV, D)).astype(np.float32)
    lookup = np.array([[3, 0, 5], [6, 2, 1]], np.uint32)
    cache_len = np.array([2, 5], np.uint32)
    offs = np.array([0, 3, 7], np.uint32)
    x = rng.normal(size=(8, HKV, D)).astype(np.float32)  # row 7 is padding: not written
    types = [
        TensorType(DType.float32, [8, HKV, D]),
        TensorType(DType.uint32, [2, 3]),
        TensorType(DType.uint32, []),
        TensorType(DType.uint32, [3]),
        TensorType(DType.uint32, [2]),
    ]

    def build(blocks, x, lookup, layer, offs, cl):
        zero = ops.constant(0, DType.uint32, CPU)
        ops.kv_cache_store(blocks, x, lookup, layer, offs, cl, zero, kv_index=1)
        return [ops.kv_cache_gather(blocks, lookup, layer, offs, cl, zero, n_rows=x.shape[0], kv_index=1)]

    model = _paged_graph(build, types)
    t = Tensor.from_numpy(pool.copy())
    (got,) = model.execute(t, x, lookup, np.uint32(1), offs, cache_len)
    want = pool.copy()
    for b in range(2):
        for i in range(offs[b + 1] - offs[b]):
            page, slot = _np_slot(lookup, b, cache_len[b] + i)
            want[page, 1, 1, slot] = x[offs[b] + i]
    np.testing.assert_array_equal(t.to_numpy(), want)
    np.testing.assert_array_equal(got.to_numpy()[:7], x[:7])
    np.testing.assert_array_equal(got.to_numpy()[7], 0)


def test_kv_cache_store_drops_rows_past_the_lookup_table(rng):
    from maxfx.driver import Tensor

    pool = np.zeros((N_PAGES, 2, LAYERS, PAGE, HKV, D), np.float32)
    lookup = np.array([[4]], np.uint32)  # one page: positions 0..3
    x = rng.normal(size=(3, HKV, D)).astype(np.float32)

    def build(blocks, x, lookup, offs, cl):
        zero = ops.constant(0, DType.uint32, CPU)
        ops.kv_cache_store(blocks, x, lookup, zero, offs, cl, zero)
        return [ops.buffer_load(blocks)]

    types = [
        TensorType(DType.float32, [3, HKV, D]),
        TensorType(DType.uint32, [1, 1]),
        TensorType(DType.uint32, [2]),
        TensorType(DType.uint32, [1]),
    ]
    t = Tensor.from_numpy(pool.copy())
    _paged_graph(build, types).execute(t, x, lookup, np.array([0, 3], np.uint32), np.array([2], np.uint32))
    want = pool.copy()
    want[4, 0, 0, 2:4] = x[:2]
    np.testing.assert_array_equal(t.to_numpy(), want)


@pytest.mark.parametrize("mask,window", [("causal", -1), ("sliding_window", 3)])
def test_paged_attention(rng, mask, window):
    pool = rng.normal(size=(N_PAGES, 2, LAYERS, PAGE, HKV, D)).astype(np.float32)
    lookup = np.array([[3, 0, 5], [6, 2, 1]], np.uint32)
    cache_len = np.array([6, 1], np.uint32)
    offs = np.array([0, 2, 5], np.uint32)
    q = rng.normal(size=(5, 4, D)).astype(np.float32)
    types = [
        TensorType(DType.float32, [5, 4, D]),
        TensorType(DType.uint32, [2, 3]),
        TensorType(DType.uint32, [3]),
        TensorType(DType.uint32, [2]),
    ]

    def build(blocks, q, lookup, offs, cl):
        layer = ops.constant(1, DType.uint32, CPU)
        return [ops.paged_attention(q, blocks, lookup, layer, offs, cl, mask=mask, scale=0.4, window=window)]

    from maxfx.driver import Tensor

    (out,) = _paged_graph(build, types).execute(Tensor.from_numpy(pool), q, lookup, offs, cache_len)
    for b in range(2):
        n = int(cache_len[b] + offs[b + 1] - offs[b])
        rows = [_np_slot(lookup, b, p) for p in range(n)]
        k = np.stack([pool[pg, 0, 1, s] for pg, s in rows])
        v = np.stack([pool[pg, 1, 1, s] for pg, s in rows])
        want = np_attend(
            q[offs[b] : offs[b + 1]], k, v, cache_len[b] + np.arange(offs[b + 1] - offs[b]), n, mask, 0.4, window
        )
        np.testing.assert_allclose(out.to_numpy()[offs[b] : offs[b + 1]], want, rtol=1e-5, atol=1e-5)


def test_paged_attention_errors():
    types = [
        BufferType(DType.float32, [2, 1, 1, 4, 2, 4]),
        TensorType(DType.float32, [3, 4, 4]),
        TensorType(DType.uint32, [1, 2]),
        TensorType(DType.uint32, [2]),
        TensorType(DType.uint32, [1]),
    ]
    with Graph("e", input_types=types) as g:
        blocks, q, lookup, offs, cl = g.inputs[0].buffer, *(x.tensor for x in g.inputs[1:])
        layer = ops.constant(0, DType.uint32, CPU)
        with pytest.raises(ValueError, match="paged_attention: a cache with kv_dim 1 holds no values; pass v_dim"):
            ops.paged_attention(q, blocks, lookup, layer, offs, cl, scale=1.0)
        with pytest.raises(ValueError, match="paged_attention: lookup_table must be a rank-2 integer tensor"):
            ops.paged_attention(q, blocks, offs, layer, offs, cl, scale=1.0, v_dim=2)
        with pytest.raises(ValueError, match="kv_cache_store: blocks must be a buffer"):
            ops.kv_cache_store(ops.buffer_load(blocks), q, lookup, layer, offs, cl, layer)
        with pytest.raises(ValueError, match=r"kv_cache_store: rows must be \[n, n_kv_heads, head_dim\]"):
            ops.kv_cache_store(blocks, q, lookup, layer, offs, cl, layer)


# ─── rope ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_ragged_positions_from_offsets(rng, interleaved):
    x = rng.normal(size=(6, 3, 8)).astype(np.float32)
    freqs = freqs_table(32, 8)
    offs, start = np.array([0, 4, 5], np.uint32), np.array([7, 2], np.uint32)
    out = run_op(lambda x, f, o, s: ops.rope_ragged(x, f, o, s, interleaved=interleaved), x, freqs, offs, start)
    pos = np.array([7, 8, 9, 10, 2, 0])  # the padding row is at position 0
    np.testing.assert_allclose(out, np_rope(x, pos, freqs, interleaved), rtol=1e-5, atol=1e-5)


def test_rope_ragged_position_ids_and_mrope(rng):
    x = rng.normal(size=(3, 2, 8)).astype(np.float32)
    freqs = freqs_table(16, 8)
    offs, start = np.array([0, 3], np.uint32), np.array([0], np.uint32)
    pid = np.array([5, 1, 9], np.int64)
    out = run_op(lambda x, f, o, s, p: ops.rope_ragged(x, f, o, s, position_ids=p), x, freqs, offs, start, pid)
    np.testing.assert_allclose(out, np_rope(x, pid, freqs, True), rtol=1e-5, atol=1e-5)
    pids = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    out = run_op(
        lambda x, f, o, s, p: ops.rope_ragged(x, f, o, s, position_ids=p, mrope_section=[3, 1]),
        x,
        freqs,
        offs,
        start,
        pids,
    )
    # frequencies 0..2 use axis 0, frequency 3 uses axis 1: build the mixed table row by row
    want = np.zeros_like(x, dtype=np.float64)
    for t in range(3):
        f_mix = np.concatenate([freqs[pids[0, t], :6], freqs[pids[1, t], 6:]])[None]
        want[t] = np_rope(x[t : t + 1], [0], f_mix, True)[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


# ─── paged_cache_attention (the generation engine's; no front) ────────────


@pytest.mark.parametrize("mask, window", [("causal", -1), ("sliding_window", 5)])
@pytest.mark.parametrize("t", [1, 3])  # a decode step (the paged decode kernel) and a prefill chunk (pages gathered)
def test_paged_cache_attention_matches_numpy(rng, mask, window, t):
    import jax.numpy as jnp  # noqa: PLC0415

    from lowering.context import bind  # noqa: PLC0415
    from lowering.ops.attention import paged_cache_attention_p  # noqa: PLC0415
    from maxfx.experimental._tensor import Tensor  # noqa: PLC0415

    pages, ps, hkv, d = 9, 16, 2, 8
    kp, vp = (rng.standard_normal((pages, ps, hkv, d)).astype(np.float32) for _ in range(2))
    q = rng.standard_normal((2, t, 4, d)).astype(np.float32)
    table = np.array([[4, 1, 7], [2, 8, 0]], np.int32)  # each row's pages in order
    first = np.array([19, 3], np.int32)  # row 0 crosses a page boundary
    wrap = lambda x: Tensor.from_dlpack(jnp.asarray(x))  # noqa: E731
    out = bind(
        paged_cache_attention_p, *map(wrap, (q, kp, vp, table, first)), mask=mask, scale=0.4, window=window
    ).to_numpy()
    assert out.shape == (2, t, 4, d)
    for b in range(2):
        k, v = kp[table[b]].reshape(-1, hkv, d), vp[table[b]].reshape(-1, hkv, d)
        want = np_attend(q[b], k, v, first[b] + np.arange(t), k.shape[0], mask, 0.4, window)
        np.testing.assert_allclose(out[b], want, rtol=1e-5, atol=1e-5)


def test_paged_cache_attention_errors(rng):
    from lowering.context import bind  # noqa: PLC0415
    from lowering.ops._rules import OpError  # noqa: PLC0415
    from lowering.ops.attention import paged_cache_attention_p  # noqa: PLC0415
    from maxfx.experimental._tensor import Tensor  # noqa: PLC0415

    q, kp = Tensor(np.zeros((2, 1, 4, 8), np.float32)), Tensor(np.zeros((3, 16, 2, 8), np.float32))
    table, first = Tensor(np.zeros((2, 2), np.int32)), Tensor(np.zeros(2, np.int32))
    with pytest.raises(OpError, match="mask must be 'causal' or 'sliding_window'"):
        bind(paged_cache_attention_p, q, kp, kp, table, first, mask="null", scale=1.0, window=-1)
    with pytest.raises(OpError, match="pages and query batch sizes"):
        bind(
            paged_cache_attention_p,
            q,
            kp,
            kp,
            Tensor(np.zeros((3, 2), np.int32)),
            first,
            mask="causal",
            scale=1.0,
            window=-1,
        )
