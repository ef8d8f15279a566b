"""maxfx attention runs through custom_calls.attention (issue 7, point 4).

With ``MAXFX_PALLAS_INTERPRET=1`` (read by the dispatch on every call) the
registry ops behind ``maxfx.nn.kernels.flash_attention_gpu``,
``flash_attention_ragged_gpu``, the paged ``flash_attention_ragged`` and the
eager ``F.flash_attention`` run the Pallas flash kernel in interpret mode; the
tests count the kernel's entry point to prove the route and compare the
outputs with the loop-based numpy attention of ``tests/ops``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from custom_calls.attention import dispatch
from custom_calls.attention import pallas_decode as pd
from custom_calls.attention import pallas_flash as pf
from lowering.compile import clear_cache
from maxfx import functional as F
from maxfx.driver import Tensor as DriverTensor
from maxfx.dtype import DType
from maxfx.graph import BufferType, DeviceRef, TensorType, ops
from maxfx.nn import kernels
from maxfx.nn.attention import MHAMaskVariant
from maxfx.tensor import Tensor
from tests.graph_run import run_graph
from tests.ops.test_attention_ops import np_attend

F32 = DType.float32
CPU = DeviceRef.CPU()

# maxfx graphs trace and lower under jax_enable_x64: these tests also guard that the kernels' static slice starts
# stay int32 there (custom_calls/attention/_tiles.ds).


@pytest.fixture
def kernel_calls(monkeypatch):
    """Interpret mode on; returns the list that records each trace of the flash kernel."""
    calls: list[tuple] = []
    real = pf.flash_attention_packed

    def counting(q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(pf, "flash_attention_packed", counting)
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    clear_cache()  # compiled graphs are cached per structure, not per kernel mode
    yield calls
    clear_cache()


def test_cpu_default_is_the_reference(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_INTERPRET, raising=False)
    assert dispatch.kernel_mode() is None
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    assert dispatch.kernel_mode() == "interpret"


def test_flash_attention_gpu_graph_runs_the_kernel(kernel_calls, rng):
    b, s, h, hkv, d = 2, 7, 4, 2, 16
    q = rng.normal(size=(b, s, h, d)).astype(np.float32)
    k, v = (rng.normal(size=(b, s, hkv, d)).astype(np.float32) for _ in range(2))
    valid = np.array([7, 5], np.uint32)
    (out,) = run_graph(
        lambda a, c, e, n: kernels.flash_attention_gpu(
            a, c, e, MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK, 0.3, local_window_size=3, valid_length=n
        ),
        q,
        k,
        v,
        valid,
    )
    assert kernel_calls, "flash_attention_gpu did not reach the Pallas kernel"
    for i in range(b):
        want = np_attend(q[i], k[i], v[i], np.arange(s), valid[i], "sliding_window", 0.3, 3)
        np.testing.assert_allclose(out[i], want, rtol=2e-5, atol=2e-5)


def test_flash_attention_ragged_gpu_graph_runs_the_kernel(kernel_calls, rng):
    offs = np.array([0, 3, 9, 9, 11], np.uint32)  # an empty sequence; rows 11, 12 are padding
    t, h, d = 13, 2, 8
    q, k, v = (rng.normal(size=(t, h, d)).astype(np.float32) for _ in range(3))
    (out,) = run_graph(
        lambda a, c, e, o: kernels.flash_attention_ragged_gpu(a, c, e, o, 6, MHAMaskVariant.CAUSAL_MASK, 0.5),
        q,
        k,
        v,
        offs,
    )
    assert kernel_calls
    for s, e in zip(offs[:-1], offs[1:]):
        want = np_attend(q[s:e], k[s:e], v[s:e], np.arange(e - s), e - s, "causal", 0.5)
        np.testing.assert_allclose(out[s:e], want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(out[11:], 0)


def test_ragged_chunked_prefill_positions_run_the_kernel(kernel_calls, rng):
    """Queries not aligned to the end of their keys (q_start/kv_start) use the kernel's position table."""
    q_offs, kv_offs = np.array([0, 2, 5], np.uint32), np.array([0, 6, 9], np.uint32)
    q = rng.normal(size=(5, 2, 8)).astype(np.float32)
    k, v = (rng.normal(size=(9, 1, 8)).astype(np.float32) for _ in range(2))
    q_start, kv_start = np.array([3, 1], np.uint32), np.array([0, 0], np.uint32)
    (out,) = run_graph(
        lambda a, c, e, qo, ko, qs, ks: ops.ragged_attention(
            a, c, e, qo, kv_row_offsets=ko, q_start=qs, kv_start=ks, scale=0.5
        ),
        q,
        k,
        v,
        q_offs,
        kv_offs,
        q_start,
        kv_start,
    )
    assert kernel_calls
    for i in range(2):
        qs, qe, ks, ke = q_offs[i], q_offs[i + 1], kv_offs[i], kv_offs[i + 1]
        want = np_attend(q[qs:qe], k[ks:ke], v[ks:ke], q_start[i] + np.arange(qe - qs), ke - ks, "causal", 0.5)
        np.testing.assert_allclose(out[qs:qe], want, rtol=2e-5, atol=2e-5)


def test_paged_attention_runs_the_kernel(kernel_calls, rng):
    """The op behind the paged ``kernels.flash_attention_ragged``: cache gathered per layer, then the flash kernel."""
    n_pages, layers, page, hkv, d = 6, 2, 4, 1, 8
    pool = rng.normal(size=(n_pages, 2, layers, page, hkv, d)).astype(np.float32)
    lookup = np.array([[4, 0, 2], [5, 1, 3]], np.uint32)
    cache_len, offs = np.array([5, 0], np.uint32), np.array([0, 3, 7], np.uint32)
    q = rng.normal(size=(7, 2, d)).astype(np.float32)
    types = [
        BufferType(F32, list(pool.shape), CPU),
        TensorType(F32, list(q.shape)),
        TensorType(DType.uint32, [2, 3]),
        TensorType(DType.uint32, [3]),
        TensorType(DType.uint32, [2]),
    ]
    (out,) = run_graph(
        lambda blocks, qv, lk, of, cl: ops.paged_attention(
            qv, blocks, lk, ops.constant(1, DType.uint32, CPU), of, cl, scale=0.4
        ),
        DriverTensor.from_numpy(pool),
        q,
        lookup,
        offs,
        cache_len,
        types=types,
        name="paged_wiring",
    )
    assert kernel_calls
    for i in range(2):
        n = int(cache_len[i] + offs[i + 1] - offs[i])
        rows = [(lookup[i, p // page], p % page) for p in range(n)]
        k = np.stack([pool[pg, 0, 1, sl] for pg, sl in rows])
        v = np.stack([pool[pg, 1, 1, sl] for pg, sl in rows])
        want = np_attend(
            q[offs[i] : offs[i + 1]], k, v, cache_len[i] + np.arange(offs[i + 1] - offs[i]), n, "causal", 0.4
        )
        np.testing.assert_allclose(out[offs[i] : offs[i + 1]], want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mask", ["causal", "null"])
def test_one_query_per_row_against_a_cache_runs_the_decode_kernel(kernel_calls, monkeypatch, rng, mask):
    """ops.attention with one query per row and cache lengths (a model's decode step) takes the split-K decode
    kernel.
    """
    decode_calls = []
    real = pd.decode_attention
    monkeypatch.setattr(pd, "decode_attention", lambda *a, **kw: decode_calls.append(1) or real(*a, **kw))
    b, s, h, hkv, d = 3, 20, 4, 2, 16
    q = rng.normal(size=(b, 1, h, d)).astype(np.float32)
    k, v = (rng.normal(size=(b, s, hkv, d)).astype(np.float32) for _ in range(2))
    pos = np.array([4, 19, 0], np.int32)  # the query's position; its key was stored at that slot
    kv_len = np.array([5, 20, 3], np.int32)  # row 2: a longer valid length than the causal bound
    (out,) = run_graph(
        lambda q_, k_, v_, p_, n_: ops.attention(q_, k_, v_, mask=mask, scale=0.25, q_offset=p_, kv_length=n_),
        q,
        k,
        v,
        pos,
        kv_len,
    )
    assert decode_calls and not kernel_calls, "a one-query step should use the decode kernel, not the flash kernel"
    for i in range(b):
        np.testing.assert_allclose(
            out[i], np_attend(q[i], k[i], v[i], [pos[i]], kv_len[i], mask, 0.25), rtol=2e-5, atol=2e-5
        )


@pytest.mark.parametrize("interpret", [False, True], ids=["reference", "pallas_interpret"])
@pytest.mark.parametrize("causal, window", [(False, -1), (True, -1), (True, 2)])
def test_eager_functional_flash_attention(monkeypatch, rng, causal, window, interpret):
    calls = []
    if interpret:
        real = pf.flash_attention
        monkeypatch.setattr(pf, "flash_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    else:
        monkeypatch.delenv(dispatch.ENV_INTERPRET, raising=False)
    s = 6 + interpret  # eager programs are cached per structure and shape, not per kernel mode
    q = rng.normal(size=(1, s, 4, 8)).astype(np.float32)
    k, v = (rng.normal(size=(1, s, 2, 8)).astype(np.float32) for _ in range(2))
    out = F.flash_attention(Tensor(q), Tensor(k), Tensor(v), causal=causal, local_window_size=window).to_numpy()
    assert bool(calls) == interpret
    mask = "null" if not causal else ("sliding_window" if window > 0 else "causal")
    want = np_attend(q[0], k[0], v[0], np.arange(s), s, mask, 1 / np.sqrt(8), window)
    np.testing.assert_allclose(out[0], want, rtol=2e-5, atol=2e-5)


def test_eager_functional_flash_attention_errors():
    x = Tensor(np.zeros((1, 2, 2, 4), np.float32))
    with pytest.raises(Exception, match="flash_attention: local_window_size=3 .*causal=True"):
        F.flash_attention(x, x, x, local_window_size=3)
    with pytest.raises(Exception, match=r"attention: q must be a rank-4 floating-point tensor, got float32\[2, 4\]"):
        F.flash_attention(Tensor(np.zeros((2, 4), np.float32)), x, x, scale=1.0)


def _np_softmax_attention(q, k, v, scale):
    """Causal GQA attention in plain jnp (the gradient oracle), q [B, S, H, D]."""
    g = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision="highest") * scale
    s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v, precision="highest")


def test_grad_of_registry_attention_uses_the_kernel_vjp(kernel_calls, rng):
    q = jnp.asarray(rng.normal(size=(1, 5, 2, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(1, 5, 1, 8)), jnp.float32) for _ in range(2))
    w = jnp.asarray(rng.normal(size=(1, 5, 2, 8)), jnp.float32)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

    got = jax.grad(loss(lambda q, k, v: ops.attention(q, k, v, mask="causal", scale=0.3)), argnums=(0, 1, 2))(q, k, v)
    assert kernel_calls
    want = jax.grad(loss(lambda q, k, v: _np_softmax_attention(q, k, v, 0.3)), argnums=(0, 1, 2))(q, k, v)
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(np.asarray(gv), np.asarray(wv), rtol=1e-4, atol=1e-5)


def test_sinks_fall_back_to_the_reference_with_one_warning(kernel_calls, rng):
    dispatch.reset_warnings()
    q, k, v = (jnp.asarray(rng.normal(size=(1, 4, 2, 8)), jnp.float32) for _ in range(3))
    sink = np.array([0.5, -1.0], np.float32)
    with pytest.warns(UserWarning, match="sinks not supported by the kernel"):
        out = ops.attention(q, k, v, mask="causal", scale=0.5, sink_weights=jnp.asarray(sink))
    assert not kernel_calls
    want = np_attend(np.asarray(q[0]), np.asarray(k[0]), np.asarray(v[0]), np.arange(4), 4, "causal", 0.5, sink=sink)
    np.testing.assert_allclose(np.asarray(out[0]), want, rtol=2e-5, atol=2e-5)


def test_functional_flash_attention_in_a_graph_runs_the_kernel(kernel_calls, rng):
    q, k, v = (rng.normal(size=(2, 5, 2, 8)).astype(np.float32) for _ in range(3))
    (out,) = run_graph(
        lambda a, c, e: F.flash_attention(a, c, e, causal=True, scale=0.4),
        q,
        k,
        v,
    )
    assert kernel_calls
    for i in range(2):
        np.testing.assert_allclose(
            out[i], np_attend(q[i], k[i], v[i], np.arange(5), 5, "causal", 0.4), rtol=2e-5, atol=2e-5
        )
