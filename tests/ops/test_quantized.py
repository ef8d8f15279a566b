"""ops.dequantize / ops.qmatmul in graphs: bit-exact vs gguf, qmatmul vs dequantize + numpy matmul."""

import gguf
import jax
import numpy as np
import pytest

from custom_calls.qmatmul import gptq_pack
from maxfx.dtype import DType
from maxfx.graph import Graph, TensorType, ops
from maxfx.graph.quantization import QuantizationConfig, QuantizationEncoding
from tests.custom_calls.test_qmatmul_reference import (
    ENCODINGS,
    cpu_kernel_atol,
    gguf_dequant,
    random_blocks,
    random_gptq,
)
from tests.ops.harness import rand, run_op

QE = QuantizationEncoding


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_dequantize_bit_exact(rng, encoding):
    enc = QE[encoding]
    w = random_blocks(rng, encoding, 6, 2)
    want = gguf_dequant(encoding, w)
    got2, got3 = run_op(lambda a, b: (ops.dequantize(enc, a), ops.dequantize(enc, b)), w, w.reshape(2, 3, -1))
    assert got2.dtype == np.float32 and got2.shape == want.shape
    np.testing.assert_array_equal(got2.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(got3.view(np.uint32), want.reshape(2, 3, -1).view(np.uint32))


def test_dequantize_symbolic_rows(rng):
    for rows in (1, 5):
        w = random_blocks(rng, "Q6_K", rows, 1)
        got = run_op(lambda a: ops.dequantize(QE.Q6_K, a), w, symbolic=[["rows", None]])
        np.testing.assert_array_equal(got.view(np.uint32), gguf_dequant("Q6_K", w).view(np.uint32))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_qmatmul_gguf_matches_dequantize_matmul(rng, encoding):
    w = random_blocks(rng, encoding, 7, 1 if encoding != "Q4_0" else 4)
    deq = gguf_dequant(encoding, w).astype(np.float64)
    x = rand(rng, [2, 3, deq.shape[1]], low=-1, high=1)
    got = run_op(lambda a, b: ops.qmatmul(QE[encoding], None, a, b), x, w)
    assert got.shape == (2, 3, 7) and got.dtype == np.float32
    np.testing.assert_allclose(got, x @ deq.T, rtol=1e-5, atol=cpu_kernel_atol(x, deq))


def test_qmatmul_dtypes_and_symbolic_batch(rng):
    w = random_blocks(rng, "Q4_0", 5, 2)
    deq = gguf_dequant("Q4_0", w).astype(np.float64)
    xb = rand(rng, [3, 64], DType.bfloat16, low=-1, high=1)
    got = run_op(lambda a, b: ops.qmatmul("Q4_0", None, a, b), xb, w)
    assert got.dtype == xb.dtype
    np.testing.assert_allclose(got.astype(np.float64), xb.astype(np.float64) @ deq.T, rtol=3e-2, atol=3e-2)
    for batch in (1, 4):
        x = rand(rng, [batch, 64], np.float64)
        got = run_op(lambda a, b: ops.qmatmul(QE.Q4_0, None, a, b), x, w, symbolic=[["batch", None], None])
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, x @ deq.T, rtol=1e-6, atol=1e-6)
    # A 1-D lhs gives a vector.
    v = rand(rng, [64])
    np.testing.assert_allclose(
        run_op(lambda a, b: ops.qmatmul(QE.Q4_0, None, a, b), v, w), v @ deq.T, rtol=1e-5, atol=cpu_kernel_atol(v, deq)
    )


def test_qmatmul_q4_0_from_real_weights(rng):
    """Quantize a float weight with gguf, multiply: close to the float product."""
    wf = rng.standard_normal((16, 128)).astype(np.float32)
    packed = gguf.quants.quantize(wf, gguf.GGMLQuantizationType.Q4_0)
    x = rand(rng, [4, 128], low=-1, high=1)
    got = run_op(lambda a, b: ops.qmatmul(QE.Q4_0, None, a, b), x, packed)
    deq = gguf_dequant("Q4_0", packed).astype(np.float64)
    np.testing.assert_allclose(got, x @ deq.T, rtol=1e-5, atol=cpu_kernel_atol(x, deq))
    assert np.abs(got - x @ wf.T).max() < 0.15 * np.abs(x @ wf.T).max()


@pytest.mark.parametrize("desc_act", [False, True])
def test_qmatmul_gptq(rng, desc_act):
    k, n, gs = 256, 16, 128
    qweight, scales, g_idx, w = random_gptq(rng, k, n, gs, act_order=desc_act)
    packed = gptq_pack(qweight, scales)
    config = QuantizationConfig(quant_method="gptq", bits=4, group_size=gs, desc_act=desc_act, sym=True)
    x = rand(rng, [2, 3, k], DType.bfloat16, low=-1, high=1)
    want = x.astype(np.float64) @ w
    if desc_act:
        # As MAX's GPTQLinear does: gather the activations by perm_idx, pass perm_idx too.
        perm = np.argsort(g_idx, kind="stable").astype(np.int32)
        got = run_op(lambda a, b, p: ops.qmatmul(QE.GPTQ, config, ops.gather(a, p, axis=2), b, p), x, packed, perm)
    else:
        got = run_op(lambda a, b: ops.qmatmul(QE.GPTQ, config, a, b), x, packed)
    assert got.dtype == x.dtype and got.shape == (2, 3, n)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=2e-2)


def test_quantized_ops_under_jit_and_grad(rng):
    w = random_blocks(rng, "Q4_K", 3, 1)
    deq = gguf_dequant("Q4_K", w)
    x = rand(rng, [2, 256], low=-1, high=1)
    got = jax.jit(lambda a, b: ops.qmatmul(QE.Q4_K, None, a, b))(x, w)
    # On a CPU the product runs the C++ kernel, which rounds x to int16 per 32 values.
    np.testing.assert_allclose(np.asarray(got), x @ deq.T, rtol=1e-5, atol=cpu_kernel_atol(x, deq))
    grad = jax.grad(lambda a: ops.qmatmul(QE.Q4_K, None, a, w).sum())(x)
    np.testing.assert_allclose(np.asarray(grad), np.broadcast_to(deq.sum(0), x.shape), rtol=1e-5)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda b: ops.dequantize(QE.Q4_K, b))(w)).view(np.uint32), deq.view(np.uint32)
    )


def test_quantized_errors():
    gptq = QuantizationConfig(quant_method="gptq", bits=4, group_size=128, desc_act=False, sym=True)
    types = [
        TensorType(DType.float32, [2, 256]),
        TensorType(DType.uint8, [3, 144]),
        TensorType(DType.uint8, [3, 100]),
        TensorType(DType.int8, [3, 144]),
        TensorType(DType.uint8, [2, 3, 144]),
        TensorType(DType.uint8, [3, "bytes"]),
        TensorType(DType.int32, [2, 256]),
        TensorType(DType.uint8, [132, 8]),
        TensorType(DType.uint8, [3, 36]),
    ]
    with Graph("quant_err", input_types=types) as g:
        x, w, w_bad, w_i8, w3, w_sym, xi, wg, w36 = g.inputs
        # as in MAX, a GGUF qmatmul builds whatever the byte width ([..., N]); the blocks are checked at compile time
        assert ops.qmatmul(QE.Q4_K, None, x, w_bad).type.shape == [2, 3]
        assert ops.qmatmul(QE.Q4_0, None, x, w36).type.shape == [2, 3]
        with pytest.raises(
            TypeError, match=r"qmatmul: rhs must be uint8 bytes packed as QuantizationEncoding.Q4_K, got int8\[3, 144\]"
        ):
            ops.qmatmul(QE.Q4_K, None, x, w_i8)
        with pytest.raises(ValueError, match=r"qmatmul: rhs .* must be a rank-2 matrix"):
            ops.qmatmul(QE.Q4_K, None, x, w3)
        with pytest.raises(ValueError, match=r"qmatmul: unsupported quantization encoding 'Q8_0'"):
            ops.qmatmul("Q8_0", None, x, w)
        with pytest.raises(ValueError, match=r"qmatmul: lhs must be a float tensor"):
            ops.qmatmul(QE.Q4_K, None, xi, w)
        with pytest.raises(ValueError, match=r"qmatmul: GPTQ needs a QuantizationConfig"):
            ops.qmatmul(QE.GPTQ, None, x, wg)
        with pytest.raises(ValueError, match=r"qmatmul: unsupported GPTQ config .*sym=False"):
            ops.qmatmul(QE.GPTQ, QuantizationConfig("gptq", 4, 128, sym=False), x, wg)
        with pytest.raises(ValueError, match=r"qmatmul: .*bits=4"):
            ops.qmatmul(QE.GPTQ, QuantizationConfig("gptq", 8, 128, sym=True), x, wg)
        with pytest.raises(ValueError, match=r"qmatmul: .*not K/2 \+ 2\*K/128"):
            ops.qmatmul(QE.GPTQ, gptq, x, w)
        with pytest.raises(
            ValueError,
            match=r"qmatmul: QuantizationEncoding.GPTQ with desc_act=True takes the packed weight and perm_idx",
        ):
            ops.qmatmul(QE.GPTQ, QuantizationConfig("gptq", 4, 128, desc_act=True, sym=True), x, wg)
        assert ops.qmatmul(QE.GPTQ, gptq, x, wg).type.shape == [2, 8]
        with pytest.raises(
            ValueError,
            match=(
                r"dequantize: last dimension \(100\) not divisible by block size \(144\) of "
                r"QuantizationEncoding.Q4_K: uint8\[3, 100\]"
            ),
        ):
            ops.dequantize(QE.Q4_K, w_bad)
        with pytest.raises(
            TypeError, match=r"dequantize: dequantize only supported with static last dimension; uint8\[3, bytes\]"
        ):
            ops.dequantize(QE.Q4_K, w_sym)
        with pytest.raises(ValueError, match=r"dequantize: .*GPTQ.* use ops.qmatmul"):
            ops.dequantize(QE.GPTQ, w)
        with pytest.raises(ValueError, match=r"dequantize: unsupported quantization encoding 'int4'"):
            ops.dequantize("int4", w)
        with pytest.raises(
            TypeError, match=r"dequantize: quantized must be uint8 bytes packed as QuantizationEncoding.Q4_K"
        ):
            ops.dequantize(QE.Q4_K, w_i8)


def test_q8_0_matmul_op_matches_gguf_and_checks_its_operands(rng):
    import gguf  # noqa: PLC0415

    from maxfx.nn._q8 import q8_matmul, split_q8_0  # noqa: PLC0415
    from maxfx.tensor import Tensor  # noqa: PLC0415

    w = rng.standard_normal((24, 64)).astype(np.float32)
    packed = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    dense = gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q8_0).astype(np.float64)
    values, scales = split_q8_0(packed)
    for rows in (1, 20):  # the CPU kernel (few rows, when built) and the decoded product
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        out = q8_matmul(Tensor(x), Tensor(values), Tensor(scales)).to_numpy()
        np.testing.assert_allclose(out, x.astype(np.float64) @ dense.T, rtol=1e-5, atol=cpu_kernel_atol(x, dense))
    with pytest.raises(ValueError, match=r"q8_0_matmul: expected float lhs, int8 values and float16 scales"):
        ops.q8_0_matmul(Tensor(x), Tensor(values.astype(np.int32)), Tensor(scales))
    with pytest.raises(
        ValueError, match=r"q8_0_matmul: lhs \[\.\.\., K\], values \[N, K\] and scales \[N, K / 32\] do not agree"
    ):
        q8_matmul(Tensor(x[:, :32]), Tensor(values), Tensor(scales))
