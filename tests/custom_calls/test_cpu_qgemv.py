"""The C++ CPU kernels for Q8_0 / Q4_0 / Q4_K products (custom_calls/cpu/qgemv.cc) against gguf's own quantizer and
numpy.

The kernels quantize each row of x to int16 per 32 values (scale max|x| / 32767,
round to nearest even), then take integer block dots. The reference is that
rounding in numpy, gguf's own dequantizer on W, and a float64 product; the
kernels must also stay within the 16-bit rounding bound of the float product.
"""

import os
import platform
import subprocess
import sys

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from custom_calls import cpu as cpu_library
from custom_calls.qmatmul import cpu, dispatch
from tests.custom_calls.test_qmatmul_reference import cpu_kernel_atol, random_blocks

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not cpu.available(), reason="CPU kernels need a CPU backend and a C++ compiler"
)


def _weights(rng, n, k, qname):
    if qname == "Q4_K":  # gguf's quantizer has no Q4_K: random blocks with d and dmin sized like a quantized
        packed = random_blocks(rng, qname, n, k // 256).reshape(n, k // 256, 144)  # N(0, 1) row (values ~ -1 .. 2)
        packed[..., 0:2] = rng.uniform(5e-4, 2e-3, (n, k // 256, 1)).astype(np.float16).view(np.uint8)
        packed[..., 2:4] = rng.uniform(0, 1.6e-2, (n, k // 256, 1)).astype(np.float16).view(np.uint8)
        packed = packed.reshape(n, -1)
    else:
        w = rng.standard_normal((n, k)).astype(np.float32)
        packed = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, qname))
    dense = gguf.quants.dequantize(packed, getattr(gguf.GGMLQuantizationType, qname)).astype(np.float64)
    return packed, dense


def _reference(x, dense):
    """x rounded to int16 per 32 values as the kernels do (float32 scale), times W, in float64."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(32767) / np.where(amax > 0, amax, 1), np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv)  # round half to even, like the kernels' conversion
    xq = (q.astype(np.float64) * (amax / np.float32(32767)).astype(np.float64)).reshape(x.shape)
    return xq @ dense.T


def _check(out, x, dense):
    """Equal to the int16-activation reference up to float32 summation; within 16-bit rounding of the float product."""
    np.testing.assert_allclose(out, _reference(x, dense), rtol=1e-5, atol=1e-4)
    assert np.abs(out - x.astype(np.float64) @ dense.T).max() <= cpu_kernel_atol(x, dense)


def _split_q8(packed, n, k):
    blocks = packed.reshape(n, k // 32, 34)
    return blocks[..., 2:].copy().view(np.int8).reshape(n, k), blocks[..., :2].copy().view(np.float16).reshape(
        n, k // 32
    )


# K = 96 and 32: odd block counts; 1536 and 576 are SmolLM2's. Rows up to 4: one
# accumulator per row; 5-16: the blocked product over tiles of 16 rows; 17 and more: tiles of 32.
@pytest.mark.parametrize("rows", [1, 3, 5, 9, 16, 17, 70])
@pytest.mark.parametrize("n,k", [(130, 96), (7, 32), (1536, 576)])
def test_q8_0_kernel_matches_llama_cpp_numerics(rng, rows, n, k):
    packed, dense = _weights(rng, n, k, "Q8_0")
    values, scales = _split_q8(packed, n, k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    _check(np.asarray(cpu.q8_0_matmul(x, values, scales)), x, dense)


@pytest.mark.parametrize("rows", [1, 5, 16, 33, 64])
@pytest.mark.parametrize("n,k", [(130, 96), (3, 32), (576, 1536)])
def test_q4_0_kernel_matches_llama_cpp_numerics(rng, rows, n, k):
    packed, dense = _weights(rng, n, k, "Q4_0")
    x = rng.standard_normal((1, rows, k)).astype(np.float32)  # leading dims flatten into the kernel's rows
    _check(np.asarray(cpu.q4_0_matmul(x, packed)), x, dense)


@pytest.mark.parametrize("rows", [1, 4, 7, 16, 17, 40])
@pytest.mark.parametrize("n,k", [(37, 256), (5, 768), (576, 1536)])
def test_q4_k_kernel_matches_gguf_dequantized_weights(rng, rows, n, k):
    """Q4_K's per-sub-block mins: minus min_j times each block's activation sum, exact against gguf's dequantizer."""
    packed, dense = _weights(rng, n, k, "Q4_K")
    x = rng.standard_normal((rows, k)).astype(np.float32) + 0.5  # a mean away from 0 makes the min term matter
    _check(np.asarray(cpu.q4_k_matmul(x, packed)), x, dense)


def test_rows_of_zeros_and_wide_ranges(rng):
    """A block of zeros has scale 0 (no division by it); blocks of very different magnitude keep their own scale."""
    packed, dense = _weights(rng, 40, 128, "Q4_0")
    for rows in (2, 20):
        x = rng.standard_normal((rows, 128)).astype(np.float32)
        x[0, :32] = 0.0
        x[1, 32:64] *= 1e4
        _check(np.asarray(cpu.q4_0_matmul(x, packed)), x, dense)


@pytest.mark.parametrize("qname", ["Q4_0", "Q4_K"])
def test_dispatch_uses_the_kernel_for_float32_and_the_reference_otherwise(rng, caplog, monkeypatch, qname):
    packed, dense = _weights(rng, 64, 256, qname)
    fast = cpu_library.qgemv_is_fast()  # False on a CPU without AVX-512 VNNI: the dispatch keeps XLA's float product
    for rows in (2, 40):  # the one-accumulator-per-row product and the blocked one
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        caplog.clear()
        with caplog.at_level("DEBUG", logger="maxfx.kernels"):
            out = np.asarray(jax.jit(lambda x, w: dispatch.qmatmul(qname, x, w))(x, packed))
        if fast:
            _check(out, x, dense)
        else:
            np.testing.assert_allclose(out, x.astype(np.float64) @ dense.T, rtol=1e-5, atol=1e-4)
        assert (f"qmatmul: CPU kernel ({qname})" in caplog.text) is fast
    monkeypatch.setenv("MAXFX_CPU_KERNELS", "0")  # switched off: float products, the reference
    caplog.clear()
    with caplog.at_level("DEBUG", logger="maxfx.kernels"):
        out = np.asarray(jax.jit(lambda x, w: dispatch.qmatmul(qname, x, w))(x, packed))
    np.testing.assert_allclose(out, x.astype(np.float64) @ dense.T, rtol=1e-5, atol=1e-4)
    assert "CPU kernel" not in caplog.text


def test_gradient_through_the_q8_0_kernel(rng):
    packed, dense = _weights(rng, 48, 64, "Q8_0")
    values, scales = _split_q8(packed, 48, 64)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    g = rng.standard_normal((1, 48))

    def loss(x):
        return jnp.sum(dispatch.q8_0_matmul(x, values, scales) * g)

    np.testing.assert_allclose(jax.grad(loss)(x), g @ dense, rtol=1e-5, atol=1e-5)  # the backward pass is float


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 instruction-set levels")
@pytest.mark.parametrize("march,fast", [("x86-64-v3", True), ("x86-64-v2", False)])
def test_portable_build_gives_the_same_numbers(rng, tmp_path, march, fast):
    """Built for a CPU without AVX-512: AVX2 (x86-64-v3, AMD Zen 2/3) is a fast path, SSE only (v2) the scalar loop;
    same numerics.
    """
    packed, dense = _weights(rng, 70, 96, "Q4_0")
    x = rng.standard_normal((20, 96)).astype(np.float32)  # 16 rows, then 4
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", packed)
    packed_k, dense_k = _weights(rng, 9, 512, "Q4_K")
    xk = rng.standard_normal((3, 512)).astype(np.float32) + 0.5
    np.save(tmp_path / "xk.npy", xk)
    np.save(tmp_path / "wk.npy", packed_k)
    code = (
        "import sys, numpy as np\n"
        "from custom_calls import cpu as lib\n"
        "from custom_calls.qmatmul import cpu\n"
        f"assert lib.available() and lib.qgemv_is_fast() is {fast}\n"
        f"x, w = np.load({str(tmp_path / 'x.npy')!r}), np.load({str(tmp_path / 'w.npy')!r})\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, np.asarray(cpu.q4_0_matmul(x, w)))\n"
        f"xk, wk = np.load({str(tmp_path / 'xk.npy')!r}), np.load({str(tmp_path / 'wk.npy')!r})\n"
        f"np.save({str(tmp_path / 'yk.npy')!r}, np.asarray(cpu.q4_k_matmul(xk, wk)))\n"
    )
    env = {**os.environ, "MAXFX_CPU_MARCH": march, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    _check(np.load(tmp_path / "y.npy"), x, dense)
    _check(np.load(tmp_path / "yk.npy"), xk, dense_k)


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


# ─── float32 products of a few rows (decode projections) ────────────────────


@pytest.mark.parametrize("rows", [1, 3, 16, 20])
@pytest.mark.parametrize("n,k", [(192, 576), (37, 33), (700, 1536)])
def test_f32_kernel_matches_numpy(rng, rows, n, k):
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(np.asarray(cpu.f32_matmul(x, w)), want, rtol=1e-5, atol=1e-4 * np.sqrt(k / 32))


def test_f32_kernel_gradients_are_the_float_products(rng):
    x = rng.standard_normal((2, 96)).astype(np.float32)
    w = rng.standard_normal((200, 96)).astype(np.float32)
    g = rng.standard_normal((2, 200))
    dx, dw = jax.grad(lambda x, w: jnp.sum(cpu.f32_matmul(x, w) * g), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(dx, g @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dw, g.T @ x, rtol=1e-5, atol=1e-4)


def test_matmul_uses_the_f32_kernel_for_decode_shaped_products(rng, caplog, monkeypatch):
    """``x @ w.T`` (the models' projections) with at most 16 rows and 64 KB of weights: the kernel; else XLA's dot."""
    from maxfx.experimental.tensor import Tensor  # noqa: PLC0415

    w = Tensor(rng.standard_normal((256, 64)).astype(np.float32))
    fast = cpu_library.qgemv_is_fast()  # the float32 kernel is only chosen where the AVX-512 build is
    for rows, expect in ((1, fast), (16, fast), (17, False)):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        caplog.clear()
        with caplog.at_level("DEBUG", logger="maxfx.kernels"):
            out = jax.jit(lambda x, w: x @ w.T)(Tensor(x), w)
        np.testing.assert_allclose(np.asarray(out.to_numpy()), x @ w.to_numpy().T, rtol=1e-5, atol=1e-4)
        assert ("matmul: CPU kernel (float32" in caplog.text) is expect, rows
    small = Tensor(rng.standard_normal((8, 64)).astype(np.float32))  # 2 KB of weights: XLA's
    caplog.clear()
    with caplog.at_level("DEBUG", logger="maxfx.kernels"):
        jax.jit(lambda x, w: x @ w.T)(Tensor(np.ones((1, 64), np.float32)), small)
    assert "CPU kernel" not in caplog.text


@pytest.mark.skipif(cpu_library.qgemv_path() != "amx", reason="Intel AMX (Sapphire Rapids and later) only")
@pytest.mark.parametrize("qname", ["Q8_0", "Q4_0", "Q4_K"])
@pytest.mark.parametrize("rows", [5, 16, 40])
def test_amx_path_matches_the_reference_and_the_vector_path(rng, qname, rows):
    """AMX splits x's int16 values into exact high and low bytes: the same integer dots as AVX-512, only float order
    differs.
    """
    n, k = 37, 512  # 37 columns: a last group of 5 decoded (not read in place)
    packed, dense = _weights(rng, n, k, qname)
    x = rng.standard_normal((rows, k)).astype(np.float32) + (0.5 if qname == "Q4_K" else 0.0)
    operands = _split_q8(packed, n, k) if qname == "Q8_0" else (packed,)
    fn = {"Q8_0": cpu.q8_0_matmul, "Q4_0": cpu.q4_0_matmul, "Q4_K": cpu.q4_k_matmul}[qname]
    outs = {}
    try:
        for on in (True, False):
            cpu_library.use_amx(on)
            outs[on] = np.asarray(fn(x, *operands))
    finally:
        cpu_library.use_amx(True)
    _check(outs[True], x, dense)
    np.testing.assert_allclose(outs[True], outs[False], rtol=1e-5, atol=1e-5)
