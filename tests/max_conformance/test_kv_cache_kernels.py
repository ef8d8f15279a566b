"""MAX's quantized kernels of max.nn.kernels (float8 scaled matmuls in MAX's scale layouts, NVFP4/MXFP4/MXFP8
block scaling, quantized fused QKV into the paged cache) against numpy references built with ml_dtypes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from maxfx.driver import Tensor
from maxfx.dtype import DType
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
from maxfx.nn import kernels
from maxfx.nn.float8_config import Float8InputScaleSpec as InSpec
from maxfx.nn.float8_config import Float8ScaleGranularity as G
from maxfx.nn.float8_config import Float8ScaleOrigin as O
from maxfx.nn.float8_config import Float8WeightScaleSpec as WSpec
from maxfx.nn.kv_cache import MHAKVCacheParams, PagedCacheValues
from tests.graph_run import run_graph

CPU = DeviceRef.CPU()
F8, F4, E8M0, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e8m0fnu, ml_dtypes.bfloat16
COLWISE, ROWWISE = InSpec(G.COLWISE, O.DYNAMIC, DType.float32), WSpec(G.ROWWISE, DType.float32)
BLOCK_IN, BLOCK_W = (
    InSpec(G.BLOCK, O.DYNAMIC, DType.float32, block_size=(1, 8)),
    WSpec(G.BLOCK, DType.float32, block_size=(8, 8)),
)


def run(fn, *arrays, buffers=()):
    """Build a graph over ``arrays`` (indices in ``buffers`` become buffer inputs), run it, return numpy outputs."""
    types = [
        (BufferType if i in buffers else TensorType)(DType.from_numpy(a.dtype), list(a.shape), CPU)
        for i, a in enumerate(arrays)
    ]
    tensors = [Tensor.from_numpy(a) if i in buffers else a for i, a in enumerate(arrays)]
    return run_graph(fn, *tensors, types=types), [t.to_numpy() for i, t in enumerate(tensors) if i in buffers]


def blocks_of(s, shape):
    """Scales [ceil(r/br), ceil(c/bc)] repeated to ``shape``."""
    r = np.repeat(s, -(-shape[0] // s.shape[0]), axis=0)[: shape[0]]
    return np.repeat(r, -(-shape[1] // s.shape[1]), axis=1)[:, : shape[1]]


# ─── float8 scaled matmuls (MAX's scale layouts) ──────────────────────────


def test_dynamic_scaled_matmul_per_token_and_block_layouts(rng):
    a, b = rng.normal(size=(5, 16)).astype(F8), rng.normal(size=(6, 16)).astype(F8)
    af, bf = a.astype(np.float32), b.astype(np.float32)
    sa, sb = rng.uniform(0.5, 2, (1, 5)).astype(np.float32), rng.uniform(0.5, 2, (6, 1)).astype(np.float32)
    (got,), _ = run(
        lambda *v: kernels.dynamic_scaled_matmul(*v, COLWISE, ROWWISE, out_type=DType.float32), a, b, sa, sb
    )
    np.testing.assert_allclose(got, (af * sa.T) @ (bf * sb).T, rtol=1e-5, atol=1e-4)  # [1, M] is per token, K-major

    # block scales: a_scales K-major [ceil(K/8), M padded to 8], b_scales [ceil(N/8), ceil(K/8)]
    sa_t = rng.uniform(0.5, 2, (2, 8)).astype(np.float32)
    sb = rng.uniform(0.5, 2, (1, 2)).astype(np.float32)
    (got,), _ = run(
        lambda *v: kernels.dynamic_scaled_matmul(*v, BLOCK_IN, BLOCK_W, out_type=DType.float32), a, b, sa_t, sb
    )
    ref = (af * blocks_of(sa_t.T[:5], af.shape)) @ (bf * blocks_of(sb, bf.shape)).T
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)

    with Graph(
        "e",
        input_types=[
            TensorType(DType.float8_e4m3fn, [5, 16]),
            TensorType(DType.float32, [1, 5]),
            TensorType(DType.bfloat16, [6, 1]),
        ],
    ) as g:
        x, s1, s2 = (v.tensor for v in g.inputs)
        with pytest.raises(TypeError, match="as do a and b scales dtypes"):
            kernels.dynamic_scaled_matmul(x, x, s1, s2, COLWISE, ROWWISE)
        with pytest.raises(ValueError, match="only per-token scaling is supported for a"):
            kernels.dynamic_scaled_matmul(x, x, x.cast(DType.float32)[:2, :2], s1.T, COLWISE, ROWWISE)


def test_batched_and_grouped_block_scaled_fp8(rng):
    a, b = rng.normal(size=(2, 4, 16)).astype(F8), rng.normal(size=(2, 8, 16)).astype(F8)
    sa, sb = rng.uniform(0.5, 2, (2, 2, 4)).astype(np.float32), rng.uniform(0.5, 2, (2, 1, 2)).astype(np.float32)
    (got,), _ = run(
        lambda *v: kernels.batched_dynamic_scaled_fp8_matmul(*v, BLOCK_IN, BLOCK_W, out_type=DType.float32),
        a,
        b,
        sa,
        sb,
    )
    for i in range(2):
        ai, bi = a[i].astype(np.float32), b[i].astype(np.float32)
        ref = (ai * blocks_of(sa[i].T, ai.shape)) @ (bi * blocks_of(sb[i], bi.shape)).T
        np.testing.assert_allclose(got[i], ref, rtol=1e-5, atol=1e-4)

    h, w = rng.normal(size=(5, 16)).astype(F8), rng.normal(size=(3, 8, 16)).astype(F8)
    hs, ws = rng.uniform(0.5, 2, (2, 8)).astype(np.float32), rng.uniform(0.5, 2, (3, 1, 2)).astype(np.float32)
    starts, ids, stats = np.array([0, 2, 5, 5], np.uint32), np.array([2, 0, 1], np.int32), np.array([3, 3], np.uint32)
    call = lambda *v: kernels.grouped_dynamic_scaled_fp8_matmul(*v, BLOCK_IN, BLOCK_W, out_type=DType.float32)  # noqa: E731
    (got,), _ = run(call, h, w, hs, ws, starts, ids, stats)
    hd = h.astype(np.float32) * blocks_of(hs.T[:5], (5, 16))
    wd = [w[e].astype(np.float32) * blocks_of(ws[e], (8, 16)) for e in range(3)]
    np.testing.assert_allclose(got, np.concatenate([hd[:2] @ wd[2].T, hd[2:] @ wd[0].T]), rtol=1e-5, atol=1e-4)
    # a start vector shorter than expert_ids + 1 describes fewer groups: the missing ones are empty
    (got,), _ = run(call, h, w, hs, ws, starts[:2], ids, stats)
    np.testing.assert_allclose(
        got, np.concatenate([hd[:2] @ wd[2].T, np.zeros((3, 8), np.float32)]), rtol=1e-5, atol=1e-4
    )


# ─── block-scaled formats ─────────────────────────────────────────────────


def fp4_pack_ref(v):
    """numpy: float32 [r, k] → uint8 [r, k/2] E2M1 codes (ml_dtypes rounding), low nibble first."""
    codes = v.astype(F4).view(np.uint8) & 0xF
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def fp4_unpack_ref(p):
    lo, hi = (p & 0xF).view(F4).astype(np.float32), (p >> 4).view(F4).astype(np.float32)
    return np.stack([lo, hi], -1).reshape(p.shape[0], -1)


def test_nvfp4_quantize_pack_and_matmul(rng):
    x = rng.normal(size=(6, 32)).astype(BF16)
    (q, s), _ = run(lambda v: kernels.quantize_dynamic_block_scaled(v, 0.5), x)
    assert q.dtype == np.uint8 and q.shape == (6, 16) and s.dtype == F8 and s.shape == (6, 2)
    y = x.astype(np.float32).reshape(6, 2, 16) * 0.5
    ref_s = (np.abs(y).max(-1) / 6.0).astype(F8)
    np.testing.assert_array_equal(s.astype(np.float32), ref_s.astype(np.float32))
    ref_q = fp4_pack_ref(np.clip(y / ref_s.astype(np.float32)[..., None], -6, 6).reshape(6, 32))
    np.testing.assert_array_equal(q, ref_q)

    w = rng.normal(size=(4, 32)).astype(BF16)
    (wq, ws), _ = run(lambda v: kernels.quantize_dynamic_block_scaled(v, 1.0), w)
    (s5,), _ = run(lambda v: kernels.block_scales_interleave(v, 16), ws)
    assert s5.shape == (1, 1, 32, 4, 4)
    r, c = np.meshgrid(np.arange(4), np.arange(2), indexing="ij")
    np.testing.assert_array_equal(
        s5[r // 128, c // 4, r % 32, (r % 128) // 32, c % 4].astype(np.float32), ws.astype(np.float32)
    )
    (got,), _ = run(lambda *v: kernels.dynamic_block_scaled_matmul(*v, 2.0), q, wq, s, s5)
    deq = lambda p, sc: fp4_unpack_ref(p) * np.repeat(sc.astype(np.float32), 16, axis=1)  # noqa: E731
    ref = deq(q, s) @ deq(wq, ws).T * 2.0
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=1e-2, atol=1e-2)
    exact = (
        x.astype(np.float32) @ w.astype(np.float32).T
    )  # tensor_sf 0.5 at quantization, 2.0 in the matmul: the product is restored
    assert np.linalg.norm(ref - exact) / np.linalg.norm(exact) < 0.2


def test_mx_quantize_power_of_two_scales(rng):
    x = rng.normal(size=(3, 64)).astype(BF16) * 10
    (q, s), _ = run(
        lambda v: kernels.quantize_dynamic_block_scaled(
            v, sf_vector_size=32, scales_type=DType.float8_e8m0fnu, out_type=DType.float8_e4m3fn
        ),
        x,
    )
    assert q.dtype == F8 and s.dtype == E8M0 and s.shape == (3, 2)
    amax = np.abs(x.astype(np.float32).reshape(3, 2, 32)).max(-1)
    ref_s = np.exp2(np.floor(np.log2(amax)) - 8)  # OCP MX: 2**(floor(log2 amax) - emax(e4m3))
    np.testing.assert_array_equal(s.astype(np.float32), ref_s)
    ref_q = np.clip(x.astype(np.float32).reshape(3, 2, 32) / ref_s[..., None], -448, 448).astype(F8).reshape(3, 64)
    np.testing.assert_array_equal(q.astype(np.float32), ref_q.astype(np.float32))


def test_grouped_matmul_block_scaled_nvfp4(rng):
    t, n, k, e = 5, 4, 32, 2
    hv = rng.normal(size=(t, k)).astype(F4).astype(np.float32)
    wv = rng.normal(size=(e, n, k)).astype(F4).astype(np.float32)
    hs = rng.uniform(0.5, 2, (t, k // 16)).astype(F8)
    ws = rng.uniform(0.5, 2, (e, n, k // 16)).astype(F8)

    def interleave(sc):  # numpy reference of the tcgen05 layout
        out = np.zeros((-(-sc.shape[0] // 128), -(-sc.shape[1] // 4), 32, 4, 4), np.float32)
        r, c = np.meshgrid(np.arange(sc.shape[0]), np.arange(sc.shape[1]), indexing="ij")
        out[r // 128, c // 4, r % 32, (r % 128) // 32, c % 4] = sc.astype(np.float32)
        return out.astype(sc.dtype)

    a5 = interleave(hs)
    b6 = np.stack([interleave(ws[i]) for i in range(e)])
    starts, offs, ids = np.array([0, 3, 5], np.uint32), np.zeros(e, np.uint32), np.array([1, 0], np.int32)
    scales, stats = np.array([2.0, 0.5], np.float32), np.array([3, 2], np.uint32)
    (got,), _ = run(
        kernels.grouped_matmul_block_scaled,
        fp4_pack_ref(hv),
        fp4_pack_ref(wv.reshape(e * n, k)).reshape(e, n, k // 2),
        a5,
        b6,
        starts,
        offs,
        ids,
        scales,
        stats,
    )
    hd = hv * np.repeat(hs.astype(np.float32), 16, 1)
    wd = wv * np.repeat(ws.astype(np.float32), 16, 2)
    ref = np.concatenate([hd[:3] @ wd[1].T * 0.5, hd[3:] @ wd[0].T * 2.0])
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


# ─── quantized projections into the paged cache ──────────────────────────


def test_fused_qkv_mxfp8_into_single_layer_pool(rng):
    heads, kv_heads, d, hidden, page = 2, 1, 8, 32, 4
    params = MHAKVCacheParams(
        DType.float32, head_dim=d, num_layers=1, devices=[CPU], page_size=page, n_kv_heads=kv_heads
    )
    x = rng.normal(size=(3, hidden)).astype(BF16)
    w = rng.normal(size=((heads + 2 * kv_heads) * d, hidden)).astype(F8)
    ws = np.exp2(rng.integers(-2, 2, ((heads + 2 * kv_heads) * d, 1))).astype(E8M0)
    pool = np.zeros((3, 2, kv_heads, page, d), np.float32)  # [pages, K|V, heads, page_size, head_dim]
    offsets, lengths, lookup = np.array([0, 3], np.uint32), np.array([2], np.uint32), np.array([[2, 0]], np.uint32)
    mx = np.array([3], np.uint32)

    def fn(xv, wv, wsv, blocks, off, cl, lk, mp, mc):
        kv = PagedCacheValues(blocks, cl, lk, mp, mc)
        q8, qs = kernels.quantize_dynamic_block_scaled(
            xv, sf_vector_size=32, scales_type=DType.float8_e8m0fnu, out_type=DType.float8_e4m3fn
        )
        layer = ops.constant(0, DType.uint32, CPU)
        return kernels._fused_qkv_ragged_matmul_scaled_mxfp8(
            params, q8, off, wv, kv, layer, heads, qs, kernels.block_scales_interleave(wsv, 32)
        )

    (q,), (pool_out,) = run(fn, x, w, ws, pool, offsets, lengths, lookup, mx, mx, buffers=(3,))
    # numpy: MX-quantize x, dequantize both operands, project
    xf = x.astype(np.float32).reshape(3, 1, 32)
    sx = np.exp2(np.floor(np.log2(np.abs(xf).max(-1))) - 8)
    xd = (np.clip(xf / sx[..., None], -448, 448).astype(F8).astype(np.float32) * sx[..., None]).reshape(3, hidden)
    qkv = (xd @ (w.astype(np.float32) * ws.astype(np.float32)).T).astype(BF16).astype(np.float32)
    np.testing.assert_allclose(q.astype(np.float32), qkv[:, : heads * d], rtol=1e-2, atol=1e-2)
    for i in range(3):  # token i sits at position 2 + i: page lookup[(2+i)//4], slot (2+i)%4
        pos = 2 + i
        pg, sl = lookup[0, pos // page], pos % page
        np.testing.assert_allclose(
            pool_out[pg, 0, :, sl].reshape(-1), qkv[i, heads * d : (heads + kv_heads) * d], rtol=1e-2, atol=1e-2
        )
        np.testing.assert_allclose(
            pool_out[pg, 1, :, sl].reshape(-1), qkv[i, (heads + kv_heads) * d :], rtol=1e-2, atol=1e-2
        )
    assert not pool_out[1].any()  # untouched page


def test_fused_qkv_float8_per_token_into_multi_layer_pool(rng):
    heads, kv_heads, d, hidden, page = 2, 2, 4, 16, 2
    params = MHAKVCacheParams(
        DType.float32, head_dim=d, num_layers=2, devices=[CPU], page_size=page, n_kv_heads=kv_heads
    )
    x, w = rng.normal(size=(2, hidden)).astype(F8), rng.normal(size=((heads + 2 * kv_heads) * d, hidden)).astype(F8)
    sx, sw = (
        rng.uniform(0.5, 2, (1, 2)).astype(np.float32),
        rng.uniform(0.5, 2, ((heads + 2 * kv_heads) * d, 1)).astype(np.float32),
    )
    pool = np.zeros((2, 2, 2, page, kv_heads, d), np.float32)
    offsets, lengths, lookup, mx = (
        np.array([0, 1, 2], np.uint32),
        np.array([0, 1], np.uint32),
        np.array([[0], [1]], np.uint32),
        np.array([[1, 2]], np.uint32),
    )

    def fn(xv, wv, sxv, swv, blocks, off, cl, lk, ml):
        kv = PagedCacheValues(blocks, cl, lk, ml[0, 0:1], ml[0, 1:2])
        layer = ops.constant(1, DType.uint32, CPU)
        return kernels.fused_qkv_ragged_matmul_scaled_float8(params, xv, off, wv, kv, layer, heads, sxv, swv)

    (q,), (pool_out,) = run(fn, x, w, sx, sw, pool, offsets, lengths, lookup, mx, buffers=(4,))
    qkv = ((x.astype(np.float32) * sx.T) @ (w.astype(np.float32) * sw).T).astype(BF16).astype(np.float32)
    np.testing.assert_allclose(q.astype(np.float32), qkv[:, : heads * d], rtol=1e-2, atol=1e-2)
    k_rows = qkv[:, heads * d : (heads + kv_heads) * d].reshape(2, kv_heads, d)
    np.testing.assert_allclose(pool_out[0, 0, 1, 0], k_rows[0], rtol=1e-2, atol=1e-2)  # sequence 0, position 0, layer 1
    np.testing.assert_allclose(pool_out[1, 0, 1, 1], k_rows[1], rtol=1e-2, atol=1e-2)  # sequence 1, position 1
    assert not pool_out[:, :, 0].any()  # layer 0 untouched


def test_fused_qkv_float8_device_and_dtype_errors():
    params = MHAKVCacheParams(DType.bfloat16, head_dim=4, num_layers=1, devices=[CPU], n_kv_heads=1)
    types = [
        TensorType(DType.float8_e4m3fn, [2, 8]),
        TensorType(DType.uint32, [2]),
        TensorType(DType.float8_e4m3fn, [12, 8], DeviceRef.GPU()),
        TensorType(DType.uint32, []),
        TensorType(DType.float32, [1, 1]),
    ]
    with Graph("e", input_types=types) as g:
        x, off, w, layer, s = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"same device as input \(cpu:0\), but got:\n  wqkv=gpu:0\n"):
            kernels.fused_qkv_ragged_matmul_scaled_float8(params, x, off, w, None, layer, 1, s, s)
        with pytest.raises(ValueError, match="expected layer_idx to have dtype uint32"):
            kernels.fused_qkv_ragged_matmul_scaled_float8(params, x, off, w, None, off.cast(DType.int32)[0], 1, s, s)
