"""AttentionWithRopeAndLoRA over the paged KV cache against a numpy reference.

The reference recomputes each full sequence without a cache: base Q/K/V
projections plus the request's adapter delta ``(x @ A[id][:rank].T) @ B[id][:, :rank].T``
(none for id < 0), RoPE, causal GQA attention, ``o_proj``.
"""

from __future__ import annotations

import numpy as np
import pytest

from maxfx import nn
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import Dim, Graph, TensorType
from maxfx.nn.kv_cache import KVCacheParams, PagedCacheValues, PagedKVCacheManager
from maxfx.nn.lora import AttentionWithRopeAndLoRA, LinearLoRA
from maxfx.nn.rotary_embedding import RotaryEmbedding
from tests.nn._llama_ref import np_causal_attention, np_rope

F32 = DType.float32
HID, NH, NKV, HD, THETA = 16, 4, 2, 4, 10000.0
N_LORAS, MAX_RANK = 3, 4


def _params():
    return KVCacheParams(F32, n_kv_heads=NKV, head_dim=HD, page_size=4)


def _layer(**kw):
    rope = RotaryEmbedding(HID, NH, THETA, 32, head_dim=HD)
    kw = dict(max_num_loras=N_LORAS, max_lora_rank=MAX_RANK) | kw
    return AttentionWithRopeAndLoRA(
        rope=rope, num_attention_heads=NH, num_key_value_heads=NKV, hidden_size=HID, kv_params=_params(), **kw
    )


def _fill(layer, rng):
    state = {k: (0.5 * rng.normal(size=np.shape(v))).astype(np.float32) for k, v in layer.state_dict().items()}
    layer.load_state_dict(state)
    return state


def np_lora_attention(w, x, lora_id, rank, has_bias=False):
    """One full sequence ``x [S, HID]`` using adapter ``lora_id`` of ``rank`` (id < 0: none)."""
    s = x.shape[0]

    def proj(name, heads):
        y = x @ w[f"{name}.weight"].T + (w[f"{name}.bias"] if has_bias else 0)
        if lora_id >= 0 and rank > 0:
            a, b = w[f"{name}.lora_A.weight"][lora_id][:rank], w[f"{name}.lora_B.weight"][lora_id][:, :rank]
            y = y + (x @ a.T) @ b.T
        return y.reshape(s, heads, HD)

    q, k, v = proj("q_proj", NH), proj("k_proj", NKV), proj("v_proj", NKV)
    a = np_causal_attention(np_rope(q, THETA, True), np_rope(k, THETA, True), v, 1 / np.sqrt(HD))
    return a.reshape(s, NH * HD) @ w["o_proj.weight"].T


def _graph(layer):
    i32, u32 = DType.int32, DType.uint32
    types = [
        TensorType(F32, ["t", HID]),
        TensorType(u32, ["b1"]),
        TensorType(i32, ["g"]),
        TensorType(i32, ["g"]),
        TensorType(u32, [Dim("g") + 1]),
    ]
    with Graph("lora_attn", input_types=types + _params().input_types()) as g:
        x, offsets, ids, ranks, groups = (v.tensor for v in g.inputs[:5])
        kv = PagedCacheValues.from_graph_inputs(g.inputs[5:])
        layer.set_lora_batch_info(ids, ranks, groups)
        g.output(layer(0, x, kv, layer.rope.freqs_cis, offsets))
    return InferenceSession().load(g, weights_registry=layer.state_dict())


@pytest.mark.parametrize("has_bias", [False, True])
def test_prefill_then_decode_match_numpy(rng, has_bias):
    layer = _layer(has_bias=has_bias)
    w = _fill(layer, rng)
    assert {"q_proj.lora_A.weight", "k_proj.lora_B.weight", "v_proj.lora_A.weight", "o_proj.weight"} <= set(w)
    model = _graph(layer)
    mgr = PagedKVCacheManager(_params(), 1, 16, 2, 32)
    seq_ids = [mgr.claim(), mgr.claim()]
    # Request 0 uses adapter 2 at rank 3 (< max rank: columns past 3 must be dropped); request 1 has none.
    lora_ids, lora_ranks = np.array([2, -1], np.int32), np.array([3, 0], np.int32)
    prompts = [rng.normal(size=(5, HID)).astype(np.float32), rng.normal(size=(3, HID)).astype(np.float32)]
    step2 = rng.normal(size=(2, HID)).astype(np.float32)
    outs = []
    for x, counts in ((np.concatenate(prompts), [5, 3]), (step2, [1, 1])):
        offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
        outs.append(model.execute(x, offs, lora_ids, lora_ranks, offs, *mgr.fetch(seq_ids, counts))[0].to_numpy())
        mgr.step(seq_ids, counts)
    full = [np.concatenate([prompts[0], step2[:1]]), np.concatenate([prompts[1], step2[1:]])]
    want = [np_lora_attention(w, f, int(i), int(r), has_bias) for f, i, r in zip(full, lora_ids, lora_ranks)]
    np.testing.assert_allclose(outs[0], np.concatenate([want[0][:5], want[1][:3]]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs[1], np.stack([want[0][5], want[1][3]]), rtol=1e-4, atol=1e-5)
    # The adapter matters: without it request 0's output differs.
    assert not np.allclose(outs[0][:5], np_lora_attention(w, prompts[0], -1, 0, has_bias), atol=1e-3)


def test_host_batch_info_prefill(rng):
    layer = _layer()
    w = _fill(layer, rng)
    types = [TensorType(F32, [7, HID]), TensorType(DType.uint32, [3])] + _params().input_types()
    with Graph("lora_attn_host", input_types=types) as g:
        layer.set_lora_batch_info([-1, 1], [0, 4], [0, 4, 7])  # host arrays become graph constants
        kv = PagedCacheValues.from_graph_inputs(g.inputs[2:])
        g.output(layer(0, g.inputs[0].tensor, kv, None, g.inputs[1].tensor))
    model = InferenceSession().load(g, weights_registry=layer.state_dict())
    mgr = PagedKVCacheManager(_params(), 1, 8, 2, 16)
    seq_ids = [mgr.claim(), mgr.claim()]
    x = rng.normal(size=(7, HID)).astype(np.float32)
    (out,) = model.execute(x, np.array([0, 4, 7], np.uint32), *mgr.fetch(seq_ids, [4, 3]))
    want = np.concatenate([np_lora_attention(w, x[:4], -1, 0), np_lora_attention(w, x[4:], 1, 4)])
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-4, atol=1e-5)


def test_members():
    layer = _layer()
    assert [type(p) for p in layer.qkv_loras] == [LinearLoRA] * 3
    assert layer.qkv_loras[0] is layer.q_proj and layer.qkv_loras[2] is layer.v_proj
    assert isinstance(layer.rope, RotaryEmbedding) and not isinstance(layer.o_proj, LinearLoRA)
    assert nn.AttentionWithRopeAndLoRA is AttentionWithRopeAndLoRA and isinstance(layer, nn.AttentionWithRope)


def _build(layer, call, n_rows=5):
    types = [
        TensorType(F32, [n_rows, HID]),
        TensorType(DType.uint32, [2]),
        TensorType(DType.int32, [1]),
        TensorType(DType.int32, [2]),
    ]
    with Graph("bad", input_types=types + _params().input_types()) as g:
        call(layer, *(v.tensor for v in g.inputs[:4]), PagedCacheValues.from_graph_inputs(g.inputs[4:]))


def test_bad_inputs():
    layer = _layer()
    with pytest.raises(ValueError, match=r"fused_qkv_lora: 'set_lora_batch_info' has not been called"):
        _build(layer, lambda m, x, o, i, r, kv: m.fused_qkv_lora(x, kv, o, 0))
    with pytest.raises(ValueError, match=r"lora_ids \[2, 3\] out of range; this layer holds 3 adapters"):
        _build(layer, lambda m, *a: m.set_lora_batch_info([2, 3], [1, 1], [0, 2, 5]))
    with pytest.raises(ValueError, match=r"lora_ranks \[2, 5\] must lie in \[0, max_lora_rank=4\]"):
        _build(layer, lambda m, *a: m.set_lora_batch_info([0, 1], [2, 5], [0, 2, 5]))
    with pytest.raises(
        ValueError, match=r"one rank per lora id.*lora_ids \[1\], lora_ranks \[2\], lora_grouped_offsets \[2\]"
    ):
        _build(layer, lambda m, x, o, i, r, kv: m.set_lora_batch_info(i, r, o))
    with pytest.raises(ValueError, match=r"lora_grouped_offsets \[0, 3, 2\] must be non-negative and non-decreasing"):
        _build(layer, lambda m, *a: m.set_lora_batch_info([0, 1], [1, 1], [0, 3, 2]))
    with pytest.raises(ValueError, match=r"lora_ids must be a 1-D integer tensor"):
        _build(layer, lambda m, x, o, i, r, kv: m.set_lora_batch_info(x, r, o))
    with pytest.raises(ValueError, match=r"x must be ragged \[total_tokens, 16\], got shape \[5, 8\]"):
        _build(layer, lambda m, x, o, i, r, kv: m.fused_qkv_lora(x[:, :8], kv, o, 0))
    with pytest.raises(ValueError, match="stacked_qkv is not supported"):
        _layer(stacked_qkv=True)
    with pytest.raises(ValueError, match="max_num_loras and max_lora_rank must be positive"):
        _layer(max_lora_rank=0)
    with pytest.raises(ValueError, match="LoRA attention does not support tensor parallelism"):
        layer.shard([None, None])
