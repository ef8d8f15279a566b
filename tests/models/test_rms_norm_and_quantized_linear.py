"""RMSNorm and QuantizedLinear (maxfx.experimental.nn) against numpy references."""

import gguf
import jax
import numpy as np
import pytest

from lowering.types import DeviceRef, TensorType
from maxfx.dtype import DType
from maxfx.experimental.nn import QuantizedLinear, RMSNorm
from maxfx.experimental.tensor import Tensor
from tests.custom_calls.test_qmatmul_reference import cpu_kernel_atol


def np_rms_norm(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def test_rms_norm_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(16)).astype(np.float32)
    norm = RMSNorm(16, eps=1e-5, weight=Tensor(w))
    np.testing.assert_allclose(norm(Tensor(x)).to_numpy(), np_rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    # under jax.jit (module as a pytree) and Module.compile with a symbolic dim
    jitted = jax.jit(lambda m, t: m(t))(norm, Tensor(x))
    np.testing.assert_allclose(jitted.to_numpy(), np_rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-6)
    compiled = norm.compile(TensorType(DType.float32, ["a", 5, 16], DeviceRef.CPU()))
    np.testing.assert_allclose(compiled(Tensor(x[:2])).to_numpy(), np_rms_norm(x[:2], w, 1e-5), rtol=1e-5, atol=1e-6)


def test_rms_norm_bfloat16_keeps_dtype():
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(2, 16)
    out = RMSNorm(16, dtype=DType.bfloat16)(Tensor(x).cast(DType.bfloat16))
    assert out.dtype is DType.bfloat16
    np.testing.assert_allclose(out.cast(DType.float32).to_numpy(), np_rms_norm(x, 1.0, 1e-6), rtol=1e-2, atol=1e-2)


def test_rms_norm_bad_input():
    with pytest.raises(ValueError, match="eps must be > 0"):
        RMSNorm(4, eps=0)
    with pytest.raises(ValueError, match=r"weight must have shape \[4\]"):
        RMSNorm(4, weight=Tensor.ones([3]))
    with pytest.raises(ValueError, match="RMSNorm: input .* must end in dim 4"):
        RMSNorm(4)(Tensor.ones([2, 3]))


@pytest.mark.parametrize("qtype", ["Q4_0"])  # the gguf package quantizes Q4_0, not K-quants
def test_quantized_linear_matches_dequantized_numpy(qtype):
    rng = np.random.default_rng(1)
    k = 256
    w = rng.standard_normal((8, k)).astype(np.float32)
    gq = getattr(gguf.GGMLQuantizationType, qtype)
    packed = gguf.quants.quantize(w, gq)
    dense = gguf.quants.dequantize(packed, gq).reshape(8, k)
    x = rng.standard_normal((3, k)).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    layer = QuantizedLinear(Tensor(packed), qtype, bias=Tensor(bias))
    assert int(layer.in_dim) == k and int(layer.out_dim) == 8
    # The CPU kernel rounds x to int16 per 32 values (cpu_kernel_atol bounds it).
    np.testing.assert_allclose(
        layer(Tensor(x)).to_numpy(), x @ dense.T + bias, rtol=1e-4, atol=cpu_kernel_atol(x, dense.astype(np.float64))
    )
    np.testing.assert_array_equal(layer.dequantized_weight().to_numpy(), dense)
    assert [n for n, _ in layer.parameters] == ["weight", "bias"]
    assert layer.weight.dtype is DType.uint8  # stays packed


def test_quantized_linear_bad_input():
    with pytest.raises(ValueError, match="unsupported encoding 'Q8_0'"):
        QuantizedLinear(Tensor(np.zeros((2, 34), np.uint8)), "Q8_0")
    with pytest.raises(ValueError, match="must be a uint8 matrix"):
        QuantizedLinear(Tensor.ones([2, 18]), "Q4_0")
    with pytest.raises(ValueError, match="not whole Q4_0 blocks"):
        QuantizedLinear(Tensor(np.zeros((2, 20), np.uint8)), "Q4_0")
