"""Tensor-parallel `AttentionWithRope` with uneven head splits, checked against numpy.

`TensorParallelAttentionWithRope` splits query heads as MAX's
``num_heads_for_device`` (the first devices one head more) and gives each
device the KV heads its queries read (an even split, a shared KV head, or one
copy per query head when the groups do not line up). Each case runs a ragged
prefill of two sequences and one decode step through per-device paged caches
on [CPU, CPU] and compares every device's output with an independent numpy
attention (RoPE, grouped-query causal softmax, o_proj) over the whole
sequences, and with the single-device layer on the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, ShardingStrategy, TensorType
from maxfx.graph._weight import query_kv_heads
from maxfx.nn.attention import AttentionWithRope, TensorParallelAttentionWithRope, num_heads_for_device
from maxfx.nn.kv_cache import KVCacheParams, PagedCacheValues, PagedKVCacheManager
from maxfx.nn.rotary_embedding import RotaryEmbedding

CPU = DeviceRef.CPU()
F32 = DType.float32
HID, HD, THETA = 12, 4, 10000.0


# ─── numpy reference ─────────────────────────────────────────────────────────


def np_rope_interleaved(x, theta):
    """x [S, H, D]: rotate pairs (2i, 2i+1) of position s by s * theta^(-2i/D)."""
    s, _, d = x.shape
    ang = np.arange(s)[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    return np.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(x.shape)


def np_rms_heads(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def np_attention(w, x, n_heads, n_kv, stacked, qk_norm=False):
    """Full-sequence output [S, HID] of grouped-query causal attention with RoPE."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    s, q_dim, kv_dim = x.shape[0], n_heads * HD, n_kv * HD
    if stacked:
        qkv = x @ w["qkv_proj.weight"].T + w.get("qkv_proj.bias", 0.0)
        q, k, v = qkv[:, :q_dim], qkv[:, q_dim : q_dim + kv_dim], qkv[:, q_dim + kv_dim :]
    else:
        q, k, v = (x @ w[f"{n}_proj.weight"].T for n in "qkv")
    q, k, v = q.reshape(s, n_heads, HD), k.reshape(s, n_kv, HD), v.reshape(s, n_kv, HD)
    if qk_norm:
        q, k = np_rms_heads(q, w["q_norm.weight"]), np_rms_heads(k, w["k_norm.weight"])
    q, k = np_rope_interleaved(q, THETA), np_rope_interleaved(k, THETA)
    group, out = n_heads // n_kv, np.zeros((s, n_heads, HD))
    causal = np.tril(np.ones((s, s), bool))
    for h in range(n_heads):
        logits = np.where(causal, q[:, h] @ k[:, h // group].T / np.sqrt(HD), -np.inf)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        out[:, h] = p / p.sum(-1, keepdims=True) @ v[:, h // group]
    return out.reshape(s, q_dim) @ w["o_proj.weight"].T


# ─── helpers ─────────────────────────────────────────────────────────────────


def _layers(n_heads, n_kv, stacked, **kw):
    rope = RotaryEmbedding(HID, n_heads, THETA, 32, head_dim=HD)
    common = dict(
        rope=rope, num_attention_heads=n_heads, num_key_value_heads=n_kv, hidden_size=HID, stacked_qkv=stacked, **kw
    )
    tp = TensorParallelAttentionWithRope(
        **common, kv_params=KVCacheParams(F32, n_kv_heads=n_kv, head_dim=HD, page_size=4), devices=[CPU, CPU]
    )
    single = AttentionWithRope(**common, kv_params=KVCacheParams(F32, n_kv_heads=n_kv, head_dim=HD, page_size=4))
    return tp, single


def _fill(layer, rng):
    state = {k: (0.5 * rng.normal(size=np.shape(v))).astype(np.float32) for k, v in layer.state_dict().items()}
    for k in state:
        if "norm" in k:
            state[k] = (1 + 0.1 * rng.normal(size=state[k].shape)).astype(np.float32)
    layer.load_state_dict(state)
    return state


def _run(tp, single, w, steps):
    """Per step: each device's TP output, then the single-device layer's (when ``single`` is given)."""
    params = [a.kv_params for a in tp.list_of_attentions] + ([single.kv_params] if single is not None else [])
    types = [TensorType(F32, ["t", HID]), TensorType(DType.uint32, ["b1"])]
    for p in params:
        types += p.input_types()
    with Graph("tp_attention", input_types=types) as g:
        x, offs = g.inputs[0].tensor, g.inputs[1].tensor
        kvs = [PagedCacheValues.from_graph_inputs(g.inputs[2 + 4 * i : 6 + 4 * i]) for i in range(len(params))]
        f = tp.rope.freqs_cis
        outs = tp(0, [x, x], None, kvs[:2], [f, f], [offs, offs])
        g.output(*outs, *([single(0, x, kvs[2], f, offs)] if single is not None else []))
    model = InferenceSession().load(g, weights_registry=w)
    mgrs = [PagedKVCacheManager(p, 1, 16, 2, 32) for p in params]
    ids = [[m.claim() for _ in steps[0][1]] for m in mgrs]
    results = []
    for x, counts in steps:
        offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
        ins = []
        for m, i in zip(mgrs, ids):
            ins += list(m.fetch(i, counts))
        results.append([o.to_numpy() for o in model.execute(x, offs, *ins)])
        for m, i in zip(mgrs, ids):
            m.step(i, counts)
    return results


# ─── tests ───────────────────────────────────────────────────────────────────

CASES = [
    # (query heads, KV heads, stacked): heads per device / KV heads each device holds
    (3, 3, False),  # MHA, 2 + 1 heads: KV heads split unevenly
    pytest.param(3, 3, True, marks=pytest.mark.slow),  # the same split, stacked: in the slow run (5 s each)
    pytest.param(
        9, 3, False, marks=pytest.mark.slow
    ),  # GQA, 5 + 4 heads: groups cut across devices, KV heads copied per query head
    (9, 3, True),
    (6, 2, False),  # 3 + 3 heads, one KV group each
    (5, 1, True),  # MQA, 3 + 2 heads: the single KV head on both devices
]


@pytest.mark.parametrize("n_heads,n_kv,stacked", CASES)
def test_uneven_tensor_parallel_attention_matches_numpy(n_heads, n_kv, stacked):
    rng = np.random.default_rng(n_heads * 10 + n_kv + stacked)
    tp, single = _layers(n_heads, n_kv, stacked)
    w = _fill(tp, rng)
    single.load_state_dict(w)
    assert [a.n_heads for a in tp.list_of_attentions] == [
        num_heads_for_device(num_heads=n_heads, device_idx=i, num_devices=2) for i in range(2)
    ]
    for i, a in enumerate(tp.list_of_attentions):
        assert a.kv_params.n_kv_heads_per_device == len(query_kv_heads(n_heads, n_kv, i, 2)) == a.n_kv_heads
    xs = [rng.normal(size=(3, HID)).astype(np.float32), rng.normal(size=(2, HID)).astype(np.float32)]
    x2 = rng.normal(size=(2, HID)).astype(np.float32)
    steps = [(np.concatenate(xs), [3, 2]), (x2, [1, 1])]
    ref = [
        np_attention(w, np.concatenate([xs[0], x2[:1]]), n_heads, n_kv, stacked),
        np_attention(w, np.concatenate([xs[1], x2[1:]]), n_heads, n_kv, stacked),
    ]
    want = [np.concatenate([ref[0][:3], ref[1][:2]]), np.stack([ref[0][3], ref[1][2]])]
    for step, expected in zip(_run(tp, single, w, steps), want):
        for out in step:  # device 0, device 1, single device
            np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_uneven_tensor_parallel_attention_with_bias_and_qk_norm():
    rng = np.random.default_rng(3)
    tp, _ = _layers(9, 3, True, has_bias=True, use_qk_norm=True)
    w = _fill(tp, rng)
    x = rng.normal(size=(4, HID)).astype(np.float32)
    (step,) = _run(tp, None, w, [(x, [4])])  # the norms are shared by both devices (one weight each)
    want = np_attention(w, x, 9, 3, True, qk_norm=True)
    for out in step:
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_sharding_strategies_follow_max():
    tp, _ = _layers(9, 3, False)
    q, k, v = (tp.qkv_proj._child(n).sharding_strategy for n in ("q_proj", "k_proj", "v_proj"))
    assert q.is_rowwise and k.is_rowwise and v.is_rowwise and tp.o_proj.sharding_strategy.is_head_aware_colwise
    assert (k.num_heads, k.num_kv_heads, k.head_dim) == (9, 3, HD)
    stacked, _ = _layers(9, 3, True)
    assert stacked.qkv_proj.sharding_strategy == ShardingStrategy.stacked_qkv(2, 9, HD, num_kv_heads=3)
    assert sorted(tp.state_dict()) == ["k_proj.weight", "o_proj.weight", "q_proj.weight", "v_proj.weight"]
    assert sorted(stacked.state_dict()) == ["o_proj.weight", "qkv_proj.weight"]


def test_query_kv_heads_plans():
    assert [query_kv_heads(8, 4, i, 2) for i in range(2)] == [(0, 1), (2, 3)]  # even groups
    assert [query_kv_heads(9, 3, i, 2) for i in range(2)] == [(0, 0, 0, 1, 1), (1, 2, 2, 2)]  # groups cut: copies
    assert [query_kv_heads(4, 1, i, 2) for i in range(2)] == [(0,), (0,)]  # a KV head shared
    assert [query_kv_heads(30, 8, i, 4) for i in range(4)] == [
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
    ]  # not grouped: even split


def test_non_grouped_heads_build_but_refuse_to_run():
    rope = RotaryEmbedding(HID, 3, THETA, 32, head_dim=HD)
    tp = TensorParallelAttentionWithRope(
        rope=rope,
        num_attention_heads=3,
        num_key_value_heads=2,
        hidden_size=HID,
        kv_params=KVCacheParams(F32, n_kv_heads=2, head_dim=HD, page_size=4),
        devices=[CPU, CPU],
    )
    assert [a.n_heads for a in tp.list_of_attentions] == [2, 1]
    params = [a.kv_params for a in tp.list_of_attentions]
    types = (
        [TensorType(F32, ["t", HID]), TensorType(DType.uint32, ["b1"])]
        + params[0].input_types()
        + params[1].input_types()
    )
    with Graph("bad", input_types=types) as g:
        x, offs = g.inputs[0].tensor, g.inputs[1].tensor
        kvs = [PagedCacheValues.from_graph_inputs(g.inputs[2 + 4 * i : 6 + 4 * i]) for i in range(2)]
        f = rope.freqs_cis
        with pytest.raises(
            ValueError, match=r"num_attention_heads \(3\) must be a multiple of num_key_value_heads \(2\) to run"
        ):
            tp(0, [x, x], None, kvs, [f, f], [offs, offs])
        g.output(x)


def test_more_devices_than_heads_is_an_error():
    rope = RotaryEmbedding(HID, 1, THETA, 32, head_dim=HD)
    with pytest.raises(ValueError, match=r"1 query heads cannot be split over 2 devices"):
        TensorParallelAttentionWithRope(
            rope=rope,
            num_attention_heads=1,
            num_key_value_heads=1,
            hidden_size=HID,
            kv_params=KVCacheParams(F32, n_kv_heads=1, head_dim=HD, page_size=4),
            devices=[CPU, CPU],
        )
