"""The layer math the eager models and the graph layers share, run three ways against numpy.

`maxfx.nn._q8` (Q8_0 decode, matmul, lookup), `maxfx.nn._rope` (cos/sin and the
rotation) and `maxfx.nn.attention._attention_without_rope.padded_attention` are written once over
``maxfx.graph.ops``; each is run here on eager Tensors, under ``jax.jit`` and
inside a Graph, and compared with an independent numpy reference (the ``gguf``
package's Q8_0 dequantizer, Hugging Face's rotate-half / rotate-every-two, a
loop-based attention).
"""

from __future__ import annotations

import gguf
import jax
import numpy as np
import pytest

from lowering.dtypes import DType
from lowering.x64 import x64
from maxfx.experimental.tensor import Tensor
from maxfx.graph import DeviceRef, ops
from maxfx.nn._q8 import q8_lookup, q8_matmul, split_q8_0
from maxfx.nn._rope import apply_rope, rope_cos_sin
from maxfx.nn.attention._attention_without_rope import padded_attention
from tests.custom_calls.test_qmatmul_reference import cpu_kernel_atol
from tests.graph_run import run_graph
from tests.ops.test_attention_ops import np_attend

CPU = DeviceRef.CPU()


def _three_ways(fn, *arrays):
    """``fn`` over eager Tensors, under jax.jit, and in a Graph run by InferenceSession: three numpy results."""
    with x64():
        eager = fn(*[Tensor(a) for a in arrays]).to_numpy()
        jitted = jax.jit(fn)(*[Tensor(a) for a in arrays]).to_numpy()
    return eager, jitted, run_graph(fn, *arrays)[0]


@pytest.fixture
def q8(rng):
    w = rng.standard_normal((6, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q8_0).reshape(6, 64).astype(np.float64)
    return raw, dense


def test_split_q8_0_keeps_the_file_bytes(q8):
    raw, dense = q8
    values, scales = split_q8_0(raw)
    assert (values.dtype, values.shape, scales.dtype, scales.shape) == (np.int8, (6, 64), np.float16, (6, 2))
    np.testing.assert_array_equal(
        values.reshape(6, 2, 32) * scales[..., None].astype(np.float64), dense.reshape(6, 2, 32)
    )
    with pytest.raises(ValueError, match=r"split_q8_0: expected uint8 \[rows, a multiple of 34 bytes\].*\[6, 33\]"):
        split_q8_0(raw[:, :33])


def test_q8_matmul_and_lookup_match_gguf_dequantize(q8, rng):
    raw, dense = q8
    values, scales = split_q8_0(raw)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    ids = np.array([[5, 0], [2, 2]], np.int64)
    for got in _three_ways(q8_matmul, x, values, scales):  # the CPU kernel rounds x to int16 per 32 values
        np.testing.assert_allclose(got, x @ dense.T, rtol=1e-5, atol=cpu_kernel_atol(x, dense))
    for got in _three_ways(lambda v, s, i: q8_lookup(v, s, i, DType.float32), values, scales, ids):
        assert got.shape == (2, 2, 64)
        np.testing.assert_array_equal(got, dense[ids].astype(np.float32))  # one float32 product per value: exact


def _np_rope(x, pos, inv, interleaved):
    """Hugging Face's application: ``x * cos + rotate(x) * sin`` with cos/sin expanded to head_dim (float64)."""
    ang = pos[..., None].astype(np.float64) * inv  # [B, T, D/2]
    cos, sin = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
    if interleaved:  # rotate_every_two
        cos, sin = np.repeat(cos, 2, -1), np.repeat(sin, 2, -1)
        rot = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
    else:  # rotate_half
        cos, sin = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_at_per_row_positions_matches_hf(rng, interleaved):
    x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]], np.int64)  # rows at different offsets
    inv = (1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)).astype(np.float32)

    def rotate(x, pos, inv):
        cos, sin = rope_cos_sin(pos, inv)
        assert [int(d) for d in cos.shape] == [2, 5, 4]
        return apply_rope(x, ops.unsqueeze(cos, 2), ops.unsqueeze(sin, 2), interleaved=interleaved)

    for got in _three_ways(rotate, x, pos, inv):
        np.testing.assert_allclose(got, _np_rope(x, pos, inv, interleaved), rtol=1e-5, atol=1e-5)


def test_padded_attention_against_a_cache_matches_numpy(rng):
    b, t, s, h, hkv, d = 2, 3, 8, 4, 2, 8
    q = rng.standard_normal((b, t, h, d)).astype(np.float32)
    k = rng.standard_normal((b, s, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, s, hkv, d)).astype(np.float32)
    first = np.array([2, 5], np.int64)  # each row's first query position; the row sees slots 0 .. its last query
    for got in _three_ways(lambda q, k, v, f: padded_attention(q, k, v, q_offset=f, kv_length=f + t), q, k, v, first):
        assert got.shape == (b, t, h * d)
        for row in range(b):
            want = np_attend(
                q[row], k[row], v[row], np.arange(t) + first[row], int(first[row]) + t, scale=1 / np.sqrt(d)
            )
            np.testing.assert_allclose(got[row], want.reshape(t, h * d), rtol=1e-5, atol=1e-5)
