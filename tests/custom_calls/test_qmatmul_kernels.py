"""Pallas quantized-matmul kernels (custom_calls.qmatmul.pallas_gguf / pallas_gptq / dispatch).

On CPU the kernels run in Pallas interpret mode and are checked against the
jnp reference and against ``gguf.quants.dequantize`` + a numpy matmul; the
Triton lowering of every format and tiling family is checked by exporting
for CUDA from the CPU (``PALLAS_NOTES.md`` §9). ``@pytest.mark.gpu`` tests run
the compiled kernels when a GPU is present (``JAX_PLATFORMS= pytest -m gpu``).
"""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from custom_calls import qmatmul as cq
from custom_calls.qmatmul import dispatch, pallas_gguf, pallas_gptq
from custom_calls.qmatmul import reference as ref
from custom_calls.qmatmul._pallas_core import KernelConfig
from tests.custom_calls._util import HAS_GPU, cuda_module, quiet_triton, uses_pallas  # noqa: F401 - quiet_triton: autouse fixture
from tests.custom_calls.test_qmatmul_reference import gguf_dequant, random_blocks, random_gptq

GGUF = list(pallas_gguf.ENCODINGS)  # Q4_0, Q8_0, Q4_K, Q5_K, Q6_K
# blocks per row: K = 640 for the 32-element formats (not a multiple of the 256 chunk), 768 for K-quants
BLOCKS = {"Q4_0": 20, "Q8_0": 20, "Q4_K": 3, "Q5_K": 3, "Q6_K": 3}


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


# ─── GGUF kernels in interpret mode ───────────────────────────────────────


# Default suite: each format at every row count in float32 and one bf16 case (m=5, ragged n);
# the other bf16 row counts run with -m slow (interpret mode costs 1-3 s a case on 2 cores).
_GGUF_CASES = [("float32", 1), ("float32", 5), ("float32", 130), ("bfloat16", 5)] + [
    pytest.param("bfloat16", m, marks=pytest.mark.slow) for m in (1, 130)
]


@pytest.mark.parametrize("encoding", GGUF)
@pytest.mark.parametrize("dtype, m", _GGUF_CASES)
def test_gguf_kernel_matches_reference_and_gguf(rng, encoding, m, dtype):
    n = 40 if m != 5 else 130  # never a multiple of the 128-row tile
    w = random_blocks(rng, encoding, n, BLOCKS[encoding])
    deq = gguf_dequant(encoding, w).astype(np.float64)
    x = jnp.asarray(rng.standard_normal((m, deq.shape[1])).astype(np.float32), dtype)
    got = pallas_gguf.qmatmul(encoding, x, w, interpret=True)
    assert got.shape == (m, n) and got.dtype == x.dtype
    want = np.asarray(x, np.float64) @ deq.T  # the activations as the kernel sees them
    if dtype == "float32":
        assert _rel(got, want) < 1e-5
        assert _rel(got, cq.reference.qmatmul(encoding, x, w)) < 1e-5
    else:  # decoded tiles rounded to bf16, bf16 output
        assert _rel(got, want) < 1.5e-2


@pytest.mark.parametrize("encoding", GGUF + ["GPTQ", "INT8"])
def test_in_kernel_decode_is_bit_exact(rng, encoding):
    """An identity lhs returns the decoded weight itself: bit-equal to gguf / the reference dequant."""
    if encoding == "GPTQ":
        qweight, scales, _, _ = random_gptq(rng, 256, 24, 64)
        packed = cq.gptq_pack(qweight, scales)
        want = np.asarray(ref.gptq_dequantize_packed(packed, group_size=64))  # [K, N]
        got = pallas_gptq.gptq_qmatmul(np.eye(256, dtype=np.float32), packed, group_size=64, interpret=True)
    elif encoding == "INT8":
        q = rng.integers(-128, 128, size=(24, 256)).astype(np.int8)
        s = rng.uniform(0.001, 0.02, size=24).astype(np.float32)
        want = np.asarray(ref.int8_dequantize(q, s)).T
        got = pallas_gptq.int8_qmatmul(np.eye(256, dtype=np.float32), q, s, interpret=True)
    else:
        w = random_blocks(rng, encoding, 24, 1 if BLOCKS[encoding] == 3 else 8)
        want = gguf_dequant(encoding, w).T
        got = pallas_gguf.qmatmul(encoding, np.eye(want.shape[0], dtype=np.float32), w, interpret=True)
    # (+ 0.0: a dot sums exact zeros to +0 where the decoder gives -0)
    np.testing.assert_array_equal(
        np.asarray(got).view(np.uint32), (want.astype(np.float32) + np.float32(0)).view(np.uint32)
    )


@pytest.mark.parametrize(
    "cfg",
    [
        KernelConfig(bm=1, bn=32, mode="fma", splits=3),
        KernelConfig(bm=16, bn=16, mode="dot", swap=False, splits=1),
        KernelConfig(bm=16, bn=64, mode="dot", swap=True, splits=3),
        KernelConfig(bm=32, bn=128, mode="dot", swap=True),
    ],
    ids=lambda c: f"{c.mode}-bm{c.bm}-bn{c.bn}-swap{int(c.swap)}-s{c.splits}",
)
def test_tilings(rng, cfg):
    w = random_blocks(rng, "Q4_K", 200, 3)  # N = 200: padded to 256 rows
    deq = gguf_dequant("Q4_K", w).astype(np.float64)
    m = 1 if cfg.mode == "fma" else 7
    x = rng.standard_normal((m, 768)).astype(np.float32)
    got = pallas_gguf.qmatmul("Q4_K", x, w, config=cfg, interpret=True)
    assert _rel(got, x @ deq.T) < 1e-5


def test_prepared_weight_is_reused(rng):
    w = random_blocks(rng, "Q6_K", 9, 2)
    pw = pallas_gguf.prepare("Q6_K", w)
    assert (pw.n, pw.k, pw.kp, pw.np_) == (9, 512, 512, 128)
    assert [p.shape for p in pw.planes] == [(128, 256), (128, 128), (128, 32), (128, 2)]
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)  # leading dims are flattened and restored
    got = jax.jit(lambda a, p: pallas_gguf.qmatmul("Q6_K", a, p, interpret=True))(x, pw)
    assert got.shape == (2, 3, 9)
    assert _rel(got, x @ gguf_dequant("Q6_K", w).T) < 1e-5


# ─── GPTQ and int8 kernels in interpret mode ──────────────────────────────


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group_size, k, n", [(128, 384, 40), (32, 320, 130)])
@pytest.mark.parametrize("m", [1, pytest.param(5, marks=pytest.mark.slow)])  # m=5: -m slow (2-3 s a case)
def test_gptq_kernel(rng, act_order, group_size, k, n, m):
    qweight, scales, g_idx, w = random_gptq(rng, k, n, group_size, act_order=act_order)
    packed = cq.gptq_pack(qweight, scales)
    perm = np.argsort(g_idx, kind="stable").astype(np.int32) if act_order else None
    x = rng.standard_normal((m, k)).astype(np.float32)
    lhs = x[:, perm] if act_order else x
    got = pallas_gptq.gptq_qmatmul(lhs, packed, perm, group_size=group_size, interpret=True)
    assert got.shape == (m, n)
    assert _rel(got, x.astype(np.float64) @ w) < 1e-5
    assert _rel(got, ref.gptq_qmatmul(lhs, packed, perm, group_size=group_size)) < 1e-5
    gb = pallas_gptq.gptq_qmatmul(jnp.asarray(lhs, jnp.bfloat16), packed, perm, group_size=group_size, interpret=True)
    assert (
        gb.dtype == jnp.bfloat16
        and _rel(gb, np.asarray(jnp.asarray(lhs, jnp.bfloat16), np.float64) @ w[perm if act_order else slice(None)])
        < 1.5e-2
    )


@pytest.mark.parametrize("m", [1, 130])
def test_int8_kernel(rng, m):
    q = rng.integers(-128, 128, size=(50, 300)).astype(np.int8)
    s = rng.uniform(0.001, 0.02, size=50).astype(np.float32)
    x = rng.standard_normal((m, 300)).astype(np.float32)
    want = x.astype(np.float64) @ (q * s[:, None].astype(np.float64)).T
    assert _rel(pallas_gptq.int8_qmatmul(x, q, s, interpret=True), want) < 1e-5
    yb = pallas_gptq.int8_qmatmul(jnp.asarray(x, jnp.bfloat16), q, s, interpret=True)
    assert yb.dtype == jnp.bfloat16 and _rel(yb, want) < 1.5e-2


# ─── dispatch ─────────────────────────────────────────────────────────────


def test_dispatch_reference_without_env(monkeypatch, rng):
    monkeypatch.delenv(dispatch.ENV_INTERPRET, raising=False)
    w = random_blocks(rng, "Q4_0", 4, 2)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    if not HAS_GPU:
        assert dispatch.kernel_mode() is None
        assert not uses_pallas(lambda a: cq.qmatmul("Q4_0", a, w), x)


def test_dispatch_env_forces_interpreted_kernels(monkeypatch, rng):
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    assert dispatch.kernel_mode() == "interpret"
    w = random_blocks(rng, "Q8_0", 6, 8)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    assert uses_pallas(lambda a: cq.qmatmul("Q8_0", a, w), x)
    np.testing.assert_allclose(
        np.asarray(cq.qmatmul("Q8_0", x, w)), x @ gguf_dequant("Q8_0", w).T, rtol=1e-5, atol=1e-5
    )
    # gradients flow to lhs through the custom_vjp (dy @ dequant(W))
    g = jax.grad(lambda a: cq.qmatmul("Q8_0", a, w).sum())(x)
    np.testing.assert_allclose(np.asarray(g), np.broadcast_to(gguf_dequant("Q8_0", w).sum(0), x.shape), rtol=1e-5)
    qweight, scales, g_idx, wg = random_gptq(rng, 256, 16, 64, act_order=True)
    perm = np.argsort(g_idx, kind="stable").astype(np.int32)
    xg = rng.standard_normal((2, 256)).astype(np.float32)
    packed = cq.gptq_pack(qweight, scales)
    assert uses_pallas(lambda a: cq.gptq_qmatmul(a, packed, perm, group_size=64), xg)
    assert _rel(cq.gptq_qmatmul(xg[:, perm], packed, perm, group_size=64), xg @ wg) < 1e-5
    q = rng.integers(-128, 128, size=(8, 256)).astype(np.int8)
    s = rng.uniform(0.01, 0.02, size=8).astype(np.float32)
    assert _rel(cq.int8_qmatmul(xg, q, s), xg @ (q * s[:, None]).T) < 1e-5


def test_dispatch_caches_prepared_weights(monkeypatch, rng):
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    dispatch.clear_cache()
    calls = []
    real = pallas_gguf.prepare
    monkeypatch.setattr(pallas_gguf, "prepare", lambda *a: calls.append(1) or real(*a))
    w = jnp.asarray(random_blocks(rng, "Q4_0", 4, 8))
    x = rng.standard_normal((1, 256)).astype(np.float32)
    y1 = cq.qmatmul("Q4_0", x, w)
    y2 = cq.qmatmul("Q4_0", x, w)
    assert len(calls) == 1 and np.array_equal(np.asarray(y1), np.asarray(y2))
    cq.qmatmul("Q4_0", x, np.asarray(w))  # numpy weights are not cached (they are mutable)
    assert len(calls) == 2
    del w
    assert not dispatch._cache  # dropped with the array


def test_dispatch_fallbacks_warn_once(monkeypatch, rng):
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    dispatch.clear_cache()
    w = random_blocks(rng, "Q5_K", 3, 1)
    x = np.zeros((0, 256), np.float32)
    with pytest.warns(UserWarning, match="empty lhs"):
        y = cq.qmatmul("Q5_K", x, w)
    assert y.shape == (0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cq.qmatmul("Q5_K", x, w)  # second time: silent
    qweight, scales, _, wg = random_gptq(rng, 96, 8, 48)
    xg = rng.standard_normal((1, 96)).astype(np.float32)
    with pytest.warns(UserWarning, match="group_size 48 is not a power of two"):
        yg = cq.gptq_qmatmul(xg, cq.gptq_pack(qweight, scales), group_size=48)
    assert _rel(yg, xg @ wg) < 1e-5


def test_errors_name_the_parameter(monkeypatch, rng):
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    with pytest.raises(ValueError, match=r"rhs: Q4_0 qmatmul needs uint8 \[N, a multiple of 18 bytes\]"):
        cq.qmatmul("Q4_0", np.zeros((1, 32), np.float32), np.zeros((3, 20), np.uint8))
    with pytest.raises(ValueError, match=r"lhs: Q4_K qmatmul lhs \[1, 200\] does not match"):
        cq.qmatmul("Q4_K", np.zeros((1, 200), np.float32), np.zeros((3, 144), np.uint8))
    with pytest.raises(ValueError, match="lhs must be a floating-point array"):
        cq.qmatmul("Q4_0", np.zeros((1, 32), np.int32), np.zeros((3, 18), np.uint8))
    with pytest.raises(ValueError, match="encoding: no Pallas kernel for 'Q2_K'"):
        pallas_gguf.prepare("Q2_K", np.zeros((1, 84), np.uint8))
    with pytest.raises(ValueError, match="group_size: the GPTQ kernel needs a power of two"):
        pallas_gptq.prepare_gptq(np.zeros((60, 8), np.uint8), group_size=48)
    with pytest.raises(ValueError, match="lhs: dtype must be float32, bfloat16 or float16"):
        pallas_gguf.qmatmul("Q4_0", np.zeros((1, 32), np.int32), np.zeros((3, 18), np.uint8), interpret=True)
    with pytest.raises(ValueError, match=r"perm_idx: expected shape \[256\]"):
        pallas_gptq.prepare_gptq(np.zeros((128 + 8, 8), np.uint8), np.arange(10), group_size=64)


# ─── Triton lowering, checked on CPU ──────────────────────────────────────

_LOWER_CASES = [
    (fmt, cfg)
    for fmt in GGUF + ["GPTQ", "INT8"]
    for cfg in (
        KernelConfig(bm=1, bn=16, mode="fma"),
        KernelConfig(bm=16, bn=32, swap=True, splits=2),
        KernelConfig(bm=128, bn=128, num_warps=8),
    )
]


@pytest.mark.parametrize("fmt, cfg", _LOWER_CASES, ids=[f"{f}-{c.mode}-bm{c.bm}" for f, c in _LOWER_CASES])
def test_triton_lowering(fmt, cfg):
    """Export for CUDA from the CPU: catches Triton-only restrictions that interpret mode accepts."""
    from jax.experimental.pallas import triton as pltriton

    from tests.bench.qmatmul_kernels import kernel_fn, make_weight

    n, k = 256, 512
    w = make_weight(fmt, jax.random.key(0), n, k)
    planes = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in w.planes]
    f = jax.jit(
        lambda x, ps: kernel_fn(fmt, cfg, False)(x, jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(w), ps))
    )
    for dt in (jnp.bfloat16, jnp.float32):
        assert pltriton.CUSTOM_CALL_TARGET_NAME in cuda_module(f, jax.ShapeDtypeStruct((cfg.bm, k), dt), planes)


# ─── benchmark script smoke run ───────────────────────────────────────────


@pytest.mark.slow  # 12 s: runs the benchmark script's sweep in interpret mode
def test_benchmark_smoke(tmp_path):
    from tests.bench import qmatmul_kernels

    out = tmp_path / "q.json"
    res = qmatmul_kernels.main(["--smoke", "--formats", "Q4_0,GPTQ", "--sweep-formats", "Q4_0", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["smoke"] and len(data["decode"]) == 2 and len(data["prefill"]) == 2 and res["decode"]
    for r in data["decode"] + data["prefill"]:
        assert r["xla_bf16_us"] > 0 and r["best_speedup_vs_bf16"] > 0 and r["best_max_rel_err"] < 2e-2
    assert len(data["decode"][0]["configs"]) > 2  # Q4_0 decode swept several tilings


# ─── GPU (compiled Triton kernels) ────────────────────────────────────────


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("fmt", GGUF + ["GPTQ", "INT8"])
@pytest.mark.parametrize("m, dtype", [(1, "bfloat16"), (5, "float32"), (130, "bfloat16")])
def test_gpu_kernels(fmt, m, dtype):
    from tests.bench.qmatmul_kernels import kernel_fn, make_weight

    dev = jax.devices("gpu")[0]
    with jax.default_device(dev):
        n, k = 384, 1280  # K not a multiple of the 256 chunk for 32-element formats
        if fmt in ("Q4_K", "Q5_K", "Q6_K", "GPTQ"):
            k = 1024
        w, deq = make_weight(fmt, jax.random.key(1), n, k, dequant=True)
        x = jax.random.normal(jax.random.key(2), (m, k), dtype)
        got = jax.jit(kernel_fn(fmt, None, False))(x, w)
        want = jnp.dot(x.astype(jnp.float32), deq.T, precision="highest")
        assert got.dtype == x.dtype and got.shape == (m, n)
        assert _rel(got, want) < (1e-5 if dtype == "float32" else 1.5e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_gpu_dispatch_uses_triton(rng):
    w = jax.device_put(random_blocks(rng, "Q4_K", 64, 4), jax.devices("gpu")[0])
    x = jax.device_put(rng.standard_normal((1, 1024)).astype(np.float32), jax.devices("gpu")[0])
    f = jax.jit(lambda a, b: cq.qmatmul("Q4_K", a, b))
    assert "triton" in f.lower(x, w).as_text()
    assert _rel(f(x, w), np.asarray(x, np.float64) @ gguf_dequant("Q4_K", np.asarray(w)).T) < 1e-5
    g = jax.jit(jax.grad(lambda a: cq.qmatmul("Q4_K", a, w).sum()))(x)
    np.testing.assert_allclose(np.asarray(g)[0], gguf_dequant("Q4_K", np.asarray(w)).sum(0), rtol=1e-4, atol=1e-4)
