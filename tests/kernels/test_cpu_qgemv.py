"""The C++ CPU kernels for Q8_0 / Q4_0 products (custom_calls/cpu/qgemv.cc) against gguf's own dequantizer and numpy."""

import os
import subprocess
import sys

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from custom_calls.qmatmul import cpu, dispatch

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu" or not cpu.available(), reason="CPU kernels need a CPU backend and a C++ compiler")


def _weights(rng, n, k, qname):
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, qname))
    dense = gguf.quants.dequantize(packed, getattr(gguf.GGMLQuantizationType, qname)).astype(np.float64)
    return packed, dense


def _split_q8(packed, n, k):
    blocks = packed.reshape(n, k // 32, 34)
    return blocks[..., 2:].copy().view(np.int8).reshape(n, k), blocks[..., :2].copy().view(np.float16).reshape(n, k // 32)


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("n,k", [(130, 96), (7, 32), (1536, 576)])
def test_q8_0_kernel_matches_gguf_dequantize(rng, rows, n, k):
    packed, dense = _weights(rng, n, k, "Q8_0")
    values, scales = _split_q8(packed, n, k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    out = np.asarray(cpu.q8_0_matmul(x, values, scales))
    np.testing.assert_allclose(out, x.astype(np.float64) @ dense.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("n,k", [(130, 96), (3, 32), (576, 1536)])
def test_q4_0_kernel_matches_gguf_dequantize(rng, rows, n, k):
    packed, dense = _weights(rng, n, k, "Q4_0")
    x = rng.standard_normal((1, rows, k)).astype(np.float32)  # leading dims flatten into the kernel's rows
    out = np.asarray(cpu.q4_0_matmul(x, packed))
    np.testing.assert_allclose(out, x.astype(np.float64) @ dense.T, rtol=1e-5, atol=1e-4)


def test_dispatch_uses_the_kernel_for_few_rows_and_the_reference_for_many(rng, caplog):
    packed, dense = _weights(rng, 64, 64, "Q4_0")
    for rows in (2, 40):  # 40 > MAX_ROWS: the reference
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        with caplog.at_level("DEBUG", logger="maxfx.kernels"):
            out = np.asarray(jax.jit(lambda x, w: dispatch.qmatmul("Q4_0", x, w))(x, packed))
        np.testing.assert_allclose(out, x.astype(np.float64) @ dense.T, rtol=1e-5, atol=1e-4)
    assert "qmatmul: CPU kernel (Q4_0)" in caplog.text


def test_gradient_through_the_q8_0_kernel(rng):
    packed, dense = _weights(rng, 48, 64, "Q8_0")
    values, scales = _split_q8(packed, 48, 64)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    g = rng.standard_normal((1, 48))

    def loss(x):
        return jnp.sum(dispatch.q8_0_matmul(x, values, scales) * g)

    np.testing.assert_allclose(jax.grad(loss)(x), g @ dense, rtol=1e-5, atol=1e-5)


def test_without_a_compiler_the_reference_runs(tmp_path):
    code = (
        "import numpy as np, gguf\n"
        "from custom_calls.qmatmul import cpu, dispatch\n"
        "assert not cpu.available(), 'built without a compiler?'\n"
        "assert 'no C++ compiler' in cpu.unavailable_reason(), cpu.unavailable_reason()\n"
        "w = np.ones((4, 64), np.float32)\n"
        "p = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)\n"
        "print(np.asarray(dispatch.qmatmul('Q4_0', np.ones((1, 64), np.float32), p)).tolist())\n"
    )
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([[64.0] * 4])
