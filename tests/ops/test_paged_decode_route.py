"""``paged_attention`` routes decode steps to the split-K paged decode kernel.

A call with one query row per sequence (``total_tokens == batch``, a static
property of the shapes) and a mask the kernel supports runs
``custom_calls.attention.paged_decode_attention_pool`` (reading the layer's pages
in place, no copy) where a kernel runs (here: ``MAXFX_PALLAS_INTERPRET=1``); prefill steps keep the gathered
packed flash kernel, and the CPU reference path is unchanged. The tests count
the kernels' entry points and compare with the loop-based numpy attention over
the cached rows (``tests/ops/test_attention_ops.np_attend``).
"""

from __future__ import annotations

import numpy as np
import pytest

from custom_calls.attention import dispatch
from custom_calls.attention import pallas_decode as pd
from custom_calls.attention import pallas_flash as pf
from lowering.compile import clear_cache
from maxfx.driver import Tensor as DriverTensor
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
from tests.ops.test_attention_ops import np_attend

F32, U32 = DType.float32, DType.uint32
CPU = DeviceRef.CPU()
LAYERS, PAGE, HKV, H, D, LAYER = 2, 16, 2, 4, 8, 1
LOOKUP = np.array([[3, 0], [5, 1], [2, 4]], np.uint32)  # 3 sequences, 2 pages each (32 positions)


@pytest.fixture
def calls(monkeypatch):
    """Counts the traces of the paged decode kernel and the packed flash kernel (the caller sets the mode)."""
    seen: dict[str, list] = {"decode": [], "packed": []}
    for name, mod, fn in (("decode", pd, "paged_decode_attention_pool"), ("packed", pf, "flash_attention_packed")):
        real = getattr(mod, fn)

        def counting(q, *args, _real=real, _name=name, **kwargs):
            seen[_name].append(tuple(q.shape))
            return _real(q, *args, **kwargs)

        monkeypatch.setattr(mod, fn, counting)
    clear_cache()  # compiled graphs are cached per structure, not per kernel mode
    yield seen
    clear_cache()


@pytest.fixture
def interpret(monkeypatch, calls):
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    clear_cache()
    return calls


def _step(pool, q, k_new, v_new, offs, cache_len, *, mask="causal", window=-1, scale=0.4):
    """One graph step: store the new K/V rows of ``LAYER``, then ``paged_attention`` over the cache."""
    n = q.shape[0]
    types = [
        BufferType(F32, list(pool.shape), CPU),
        TensorType(F32, [n, H, D]), TensorType(F32, [n, HKV, D]), TensorType(F32, [n, HKV, D]),
        TensorType(U32, list(LOOKUP.shape)), TensorType(U32, [len(offs)]), TensorType(U32, [len(cache_len)]),
    ]  # fmt: skip
    with Graph(f"paged_decode_route_{mask}", input_types=types) as g:
        blocks, qv, kv, vv, lk, of, cl = g.inputs[0].buffer, *(x.tensor for x in g.inputs[1:])
        layer, zero = ops.constant(LAYER, U32, CPU), ops.constant(0, U32, CPU)
        ops.kv_cache_store(blocks, kv, lk, layer, of, cl, zero, kv_index=0)
        ops.kv_cache_store(blocks, vv, lk, layer, of, cl, zero, kv_index=1)
        g.output(ops.paged_attention(qv, blocks, lk, layer, of, cl, mask=mask, scale=scale, window=window))
    buf = DriverTensor.from_numpy(pool.copy())
    return InferenceSession().load(g).execute(buf, q, k_new, v_new, LOOKUP, offs, cache_len)[0].to_numpy()


def _want(pool, q, k_new, v_new, offs, cache_len, *, mask="causal", window=-1, scale=0.4):
    """numpy: write the new rows into a copy of the pool, then attend over each sequence's cached rows."""
    pool = pool.copy()
    out = np.zeros(q.shape)
    for b in range(len(cache_len)):
        s, e = int(offs[b]), int(offs[b + 1])
        for i in range(e - s):
            p = int(cache_len[b]) + i
            pool[LOOKUP[b, p // PAGE], 0, LAYER, p % PAGE] = k_new[s + i]
            pool[LOOKUP[b, p // PAGE], 1, LAYER, p % PAGE] = v_new[s + i]
        n = int(cache_len[b]) + e - s
        rows = [(LOOKUP[b, p // PAGE], p % PAGE) for p in range(n)]
        k = np.stack([pool[pg, 0, LAYER, sl] for pg, sl in rows])
        v = np.stack([pool[pg, 1, LAYER, sl] for pg, sl in rows])
        out[s:e] = np_attend(q[s:e], k, v, int(cache_len[b]) + np.arange(e - s), n, mask, scale, window)
    return out


def _inputs(rng, n_pages: int, n_rows: int):
    pool = rng.normal(size=(n_pages, 2, LAYERS, PAGE, HKV, D)).astype(np.float32)
    q = rng.normal(size=(n_rows, H, D)).astype(np.float32)
    k_new, v_new = (rng.normal(size=(n_rows, HKV, D)).astype(np.float32) for _ in range(2))
    return pool, q, k_new, v_new


DECODE_OFFS = np.arange(4, dtype=np.uint32)
DECODE_LENS = np.array([5, 16, 30], np.uint32)  # mid-page, first slot of page 1, last-but-one slot of the table


@pytest.mark.parametrize("n_pages", [6, 9], ids=["pool_le_table", "pool_gt_table"])  # pool ≤ / > the table's pages
@pytest.mark.parametrize("mask, window", [("causal", -1), ("sliding_window", 4), ("null", -1)])
def test_decode_step_runs_the_paged_decode_kernel(interpret, rng, n_pages, mask, window):
    pool, q, k_new, v_new = _inputs(rng, n_pages, 3)
    out = _step(pool, q, k_new, v_new, DECODE_OFFS, DECODE_LENS, mask=mask, window=window)
    assert interpret["decode"] == [(3, 1, H, D)], (
        "the decode step did not reach pallas_decode.paged_decode_attention_pool"
    )
    assert not interpret["packed"]
    want = _want(pool, q, k_new, v_new, DECODE_OFFS, DECODE_LENS, mask=mask, window=window)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_decode_shaped_call_with_uneven_offsets_is_exact(interpret, rng):
    """``total_tokens == batch`` with a 2-token and an empty sequence: each row still sees its own prefix."""
    offs = np.array([0, 2, 2, 3], np.uint32)
    pool, q, k_new, v_new = _inputs(rng, 6, 3)
    out = _step(pool, q, k_new, v_new, offs, DECODE_LENS)
    assert interpret["decode"] and not interpret["packed"]
    np.testing.assert_allclose(out, _want(pool, q, k_new, v_new, offs, DECODE_LENS), rtol=2e-5, atol=2e-5)


def test_padding_rows_of_a_decode_step_are_zero(interpret, rng):
    offs = np.array([0, 1, 2, 2], np.uint32)  # 3 rows, the last one past offsets[-1]
    pool, q, k_new, v_new = _inputs(rng, 6, 3)
    out = _step(pool, q, k_new, v_new, offs, DECODE_LENS)
    assert interpret["decode"]
    np.testing.assert_allclose(out[:2], _want(pool, q, k_new, v_new, offs, DECODE_LENS)[:2], rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(out[2], 0)


def test_prefill_step_keeps_the_packed_kernel(interpret, rng):
    offs, lens = np.array([0, 3, 4, 7], np.uint32), np.array([0, 12, 20], np.uint32)
    pool, q, k_new, v_new = _inputs(rng, 6, 7)
    out = _step(pool, q, k_new, v_new, offs, lens)
    assert interpret["packed"] and not interpret["decode"]
    np.testing.assert_allclose(out, _want(pool, q, k_new, v_new, offs, lens), rtol=2e-5, atol=2e-5)


def test_unsupported_masks_keep_the_packed_path(interpret, rng):
    """Chunked (and ALiBi, sinks, MLA) are not in the decode kernel: the gathered path (reference) runs."""
    dispatch.reset_warnings()
    pool, q, k_new, v_new = _inputs(rng, 6, 3)
    with pytest.warns(UserWarning, match="chunk_size"):
        out = _step(pool, q, k_new, v_new, DECODE_OFFS, DECODE_LENS, mask="chunked", window=8)
    assert not interpret["decode"]
    want = _want(pool, q, k_new, v_new, DECODE_OFFS, DECODE_LENS, mask="chunked", window=8)
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


def test_cpu_default_path_is_unchanged(monkeypatch, calls, rng):
    monkeypatch.delenv(dispatch.ENV_INTERPRET, raising=False)
    pool, q, k_new, v_new = _inputs(rng, 6, 3)
    out = _step(pool, q, k_new, v_new, DECODE_OFFS, DECODE_LENS)
    assert not calls["decode"] and not calls["packed"]  # the jnp reference, no kernel
    np.testing.assert_allclose(out, _want(pool, q, k_new, v_new, DECODE_OFFS, DECODE_LENS), rtol=2e-5, atol=2e-5)


def test_decode_step_reads_the_pool_in_place(monkeypatch):
    """No per-layer copy: the kernel gets the whole pool and indexes page, K/V plane and layer itself."""
    import re

    import jax
    import jax.numpy as jnp

    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    s = jax.ShapeDtypeStruct
    n_pages = 9
    args = (
        s((3, H, D), jnp.float32), s((n_pages, 2, LAYERS, PAGE, HKV, D), jnp.float32), s(LOOKUP.shape, jnp.uint32),
        s((), jnp.uint32), s((4,), jnp.uint32), s((3,), jnp.uint32),
    )  # fmt: skip

    def step(q, pool, lk, layer, offs, cl):
        return dispatch.paged_attention_pool(q, pool, layer, lk, offs, cl, scale=0.4)

    text = str(jax.make_jaxpr(step)(*args))
    assert "pallas_call" in text
    assert not re.search(rf"f32\[\d+,{PAGE},{HKV},{D}\]", text), "a [pages, page_size, Hkv, D] layer copy was made"
