"""custom_calls.qmatmul reference: bit-exact GGUF decoding vs ``gguf.quants``, GPTQ vs numpy.

Also holds the test-data builders (random valid GGUF blocks, AutoGPTQ packing)
that tests/ops/test_quantized.py reuses.
"""

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from custom_calls import qmatmul as cq

ENCODINGS = ["Q4_0", "Q4_K", "Q5_K", "Q6_K"]  # the ones MAX's QuantizationEncoding has
ALL_ENCODINGS = ENCODINGS + ["Q8_0"]  # custom_calls also decodes Q8_0
# Byte offsets of each encoding's float16 fields (super-block scales).
_F16_FIELDS = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(
    rng: np.random.Generator, encoding: str, rows: int, blocks_per_row: int, *, raw: bool = False
) -> np.ndarray:
    """``uint8 [rows, blocks_per_row * block_bytes]`` of valid blocks.

    Any byte pattern is a valid block except non-finite f16 scales, so the
    scale fields get small finite values unless ``raw``.
    """
    _, nbytes = cq.block_shape(encoding)
    data = rng.integers(0, 256, size=(rows * blocks_per_row, nbytes), dtype=np.uint8)
    if not raw:
        for off in _F16_FIELDS[encoding]:
            scale = rng.uniform(-0.05, 0.05, size=len(data)).astype(np.float16)
            data[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, blocks_per_row * nbytes)


def gguf_dequant(encoding: str, data: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(data, getattr(gguf.GGMLQuantizationType, encoding))


def cpu_kernel_atol(x: np.ndarray, dense: np.ndarray) -> float:
    """How far a Q4_0 / Q8_0 product on the CPU kernels may be from the float product ``x @ dense.T``.

    The kernels (custom_calls/cpu/qgemv.cc) round each activation to int16 per
    32 values, off by at most half a step (max|x| / 65534); plus float32 summation.
    """
    return float(np.abs(x).max() / 65534 * np.abs(dense).sum(axis=1).max() + 1e-5)


def pack_int4_rows(q: np.ndarray) -> np.ndarray:
    """AutoGPTQ packing along rows: ``[K, N]`` values 0..15 → ``int32 [K/8, N]``."""
    k, n = q.shape
    words = np.zeros((k // 8, n), np.uint32)
    for i in range(8):
        words |= q[i::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def random_gptq(rng: np.random.Generator, k: int, n: int, group_size: int, *, act_order: bool = False):
    """Random symmetric GPTQ tensors: ``(qweight, scales, g_idx, W)`` with ``W[k] = (q[k]-8)*scales[g_idx[k]]``."""
    q = rng.integers(0, 16, size=(k, n))
    scales = rng.uniform(0.001, 0.02, size=(k // group_size, n)).astype(np.float16)
    g_idx = np.arange(k) // group_size
    if act_order:
        g_idx = rng.permutation(g_idx)
    w = (q - 8).astype(np.float64) * scales.astype(np.float64)[g_idx]
    return pack_int4_rows(q), scales, g_idx.astype(np.int32), w


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


# Jitted entry points: one compile per encoding and shape instead of one per jnp op.
dequantize = jax.jit(cq.dequantize, static_argnums=0)
dequantize_blocks = jax.jit(cq.dequantize_blocks, static_argnums=0)
qmatmul = jax.jit(cq.qmatmul, static_argnums=0)
gptq_dequantize = jax.jit(cq.gptq_dequantize, static_argnames=("group_size", "zero_offset"))
gptq_qmatmul = jax.jit(cq.gptq_qmatmul, static_argnames=("group_size",))


# ─── GGUF ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("encoding", ALL_ENCODINGS)
def test_dequantize_is_bit_exact_with_gguf(rng, encoding):
    data = random_blocks(rng, encoding, 6, 3)
    want = gguf_dequant(encoding, data)
    np.testing.assert_array_equal(_bits(dequantize(encoding, data)), _bits(want))
    if encoding == "Q4_K":  # eager (op-by-op) dispatch agrees with the jitted program
        np.testing.assert_array_equal(_bits(cq.dequantize(encoding, data)), _bits(want))
    elems, nbytes = cq.block_shape(encoding)
    blocks = dequantize_blocks(encoding, data.reshape(6, 3, nbytes))
    np.testing.assert_array_equal(_bits(blocks).reshape(6, 3 * elems), _bits(want))


@pytest.mark.parametrize("encoding", ALL_ENCODINGS)
def test_dequantize_any_bytes(rng, encoding):
    """Every byte pattern, subnormal/huge scales included, decodes like gguf (NaN where gguf has NaN)."""
    data = random_blocks(rng, encoding, 64, 4, raw=True)
    with np.errstate(all="ignore"):
        want = gguf_dequant(encoding, data)
    got = np.asarray(dequantize(encoding, data))
    finite = np.isfinite(want)
    np.testing.assert_array_equal(_bits(got[finite]), _bits(want[finite]))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("encoding, bound", [("Q4_0", 0.5), ("Q8_0", 0.03)])
def test_roundtrip_with_gguf_quantize(rng, encoding, bound):
    w = rng.standard_normal((8, 64)).astype(np.float32)
    packed = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, encoding))
    got = np.asarray(dequantize(encoding, packed))
    np.testing.assert_array_equal(_bits(got), _bits(gguf_dequant(encoding, packed)))
    assert np.abs(got - w).max() < bound  # 4-bit / 8-bit error bound for N(0, 1) data


@pytest.mark.parametrize("encoding", ALL_ENCODINGS)
def test_qmatmul_matches_numpy(rng, encoding):
    w = random_blocks(rng, encoding, 5, 2)
    k = gguf_dequant(encoding, w).shape[1]
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    dense = gguf_dequant(encoding, w).astype(np.float64)
    got = qmatmul(encoding, x, w)  # Q4_0 / Q8_0 with few rows: the CPU kernels, 16-bit activations
    assert got.shape == (2, 3, 5) and got.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(got), x.astype(np.float64) @ dense.T, rtol=1e-5, atol=cpu_kernel_atol(x, dense)
    )


def test_qmatmul_transforms(rng):
    """jit, vmap over lhs, and grad w.r.t. lhs (= sum of the dequantized rows)."""
    w = random_blocks(rng, "Q4_K", 4, 1)
    deq = gguf_dequant("Q4_K", w)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    f = jax.jit(lambda a: cq.qmatmul("Q4_K", a, w))
    # The CPU kernel rounds x to int16 per 32 values (cpu_kernel_atol); under vmap it runs per row.
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(x)), x @ deq.T, rtol=1e-5, atol=cpu_kernel_atol(x, deq))
    g = jax.grad(lambda a: cq.qmatmul("Q4_K", a, w).sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(deq.sum(0), x.shape), rtol=1e-6)
    bf = qmatmul("Q4_K", x.astype(jnp.bfloat16), w)
    assert bf.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(bf, np.float64), x @ deq.T, rtol=3e-2, atol=3e-2)


def test_reference_errors(rng):
    with pytest.raises(ValueError, match="unsupported GGUF encoding 'Q2_K'"):
        cq.dequantize("Q2_K", np.zeros((1, 84), np.uint8))
    with pytest.raises(ValueError, match="multiple of 144 bytes"):
        cq.dequantize("Q4_K", np.zeros((1, 100), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        cq.dequantize("Q4_0", np.zeros((1, 18), np.int8))
    with pytest.raises(ValueError, match=r"does not match rhs \[3, 18\] \(K = 32\)"):
        cq.qmatmul("Q4_0", np.zeros((2, 64), np.float32), np.zeros((3, 18), np.uint8))
    with pytest.raises(ValueError, match="blocks must be uint8"):
        cq.dequantize_blocks("Q6_K", np.zeros((2, 200), np.uint8))


# ─── GPTQ ─────────────────────────────────────────────────────────────────


def test_gptq_unpack_and_dequantize_with_zeros(rng):
    k, n, gs = 64, 16, 32
    q = rng.integers(0, 16, size=(k, n))
    np.testing.assert_array_equal(np.asarray(jax.jit(cq.gptq_unpack_int4)(pack_int4_rows(q))), q)
    scales = rng.uniform(0.01, 0.1, size=(k // gs, n)).astype(np.float16)
    zeros = rng.integers(1, 16, size=(k // gs, n))
    # AutoGPTQ v1 stores zero - 1, packed 8 per int32 along N.
    qzeros = pack_int4_rows((zeros - 1).T).T.copy()
    g_idx = rng.permutation(np.arange(k) // gs)
    want = (q - zeros[g_idx]) * scales.astype(np.float64)[g_idx]
    got = gptq_dequantize(pack_int4_rows(q), scales, qzeros, g_idx, group_size=gs)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    v2 = gptq_dequantize(
        pack_int4_rows(q), scales, pack_int4_rows(zeros.T).T.copy(), g_idx, group_size=gs, zero_offset=0
    )
    np.testing.assert_allclose(np.asarray(v2), want, rtol=1e-6)
    sym = gptq_dequantize(pack_int4_rows(q), scales, group_size=gs)
    np.testing.assert_allclose(np.asarray(sym), (q - 8) * scales.astype(np.float64)[np.arange(k) // gs], rtol=1e-6)


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_packed_qmatmul(rng, act_order):
    k, n, gs = 256, 24, 64
    qweight, scales, g_idx, w = random_gptq(rng, k, n, gs, act_order=act_order)
    packed = cq.gptq_pack(qweight, scales)
    assert packed.shape == (k // 2 + 2 * k // gs, n) and packed.dtype == np.uint8
    assert cq.gptq_packed_k(packed.shape[0], gs) == k
    x = rng.standard_normal((3, k)).astype(np.float32)
    perm = np.argsort(g_idx, kind="stable").astype(np.int32) if act_order else None
    lhs = x[:, perm] if act_order else x
    got = gptq_qmatmul(jnp.asarray(lhs, jnp.bfloat16), packed, perm, group_size=gs)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float64), x.astype(np.float64) @ w, rtol=2e-2, atol=2e-2)
    exact = gptq_qmatmul(lhs, packed, perm, group_size=gs)
    np.testing.assert_allclose(np.asarray(exact), x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    if not act_order:
        unpacked = gptq_dequantize(qweight, scales, group_size=gs)
        from_packed = jax.jit(cq.gptq_dequantize_packed, static_argnames=("group_size",))(packed, group_size=gs)
        np.testing.assert_array_equal(np.asarray(from_packed), np.asarray(unpacked))


def test_gptq_errors():
    with pytest.raises(ValueError, match="not K/2 \\+ 2\\*K/128"):
        cq.gptq_packed_k(100, 128)
    with pytest.raises(ValueError, match="gptq_pack: expected qweight"):
        cq.gptq_pack(np.zeros((4, 8), np.int32), np.zeros((2, 4), np.float16))
    with pytest.raises(ValueError, match="packed weight must be a uint8 matrix"):
        cq.gptq_dequantize_packed(np.zeros((66,), np.uint8), group_size=128)


# ─── int8 per output channel ──────────────────────────────────────────────


def test_int8_per_channel(rng):
    q = rng.integers(-128, 128, size=(6, 40)).astype(np.int8)
    scale = rng.uniform(0.001, 0.02, size=6).astype(np.float32)
    want = q.astype(np.float32) * scale[:, None]
    np.testing.assert_array_equal(np.asarray(cq.int8_dequantize(q, scale)), want)
    x = rng.standard_normal((2, 3, 40)).astype(np.float32)
    got = jax.jit(cq.int8_qmatmul)(x, q, scale)
    assert got.shape == (2, 3, 6) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), x.astype(np.float64) @ want.astype(np.float64).T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="weight must be an int8 matrix"):
        cq.int8_dequantize(q.astype(np.int16), scale)
    with pytest.raises(ValueError, match="scale must be a float vector"):
        cq.int8_dequantize(q, scale[:5])
    with pytest.raises(ValueError, match="does not match weight"):
        cq.int8_qmatmul(x[..., :32], q, scale)
