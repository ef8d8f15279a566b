"""Attention layers, attention/KV-cache kernels and the Transformer against numpy references.

The end-to-end test builds a 2-layer Llama-style decoder from maxfx.nn layers,
runs a ragged prefill of two prompts and three decode steps through the paged
KV cache manager, and compares every step's logits with a numpy model that
recomputes each full sequence without a cache.
"""

from __future__ import annotations

import numpy as np
import pytest

from lowering.compile import compile_stats
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from maxfx.nn import kernels
from maxfx.nn.attention import (
    AttentionWithRope,
    AttentionWithRopeNoOpaque,
    DataParallelAttentionWithRope,
    MHAMaskVariant,
    MultiheadAttention,
    RaggedAttention,
    TensorParallelAttentionWithRope,
)
from maxfx.nn.kv_cache import KVCacheParams, PagedCacheValues, PagedKVCacheManager
from maxfx.nn.rotary_embedding import RotaryEmbedding
from maxfx.nn.transformer import ReturnLogits
from tests.nn._llama_ref import (
    TINY,
    build_llama,
    np_attention_layer,
    np_causal_attention,
    np_llama,
    np_rms,
    np_rope,
    random_weights,
)

CPU = DeviceRef.CPU()
F32 = DType.float32


# ─── end to end ───────────────────────────────────────────────────────────


def _llama_graph(model, kv_params, n_logits=1):
    types = [
        TensorType(DType.int64, ["total_seq_len"]),
        TensorType(DType.uint32, ["batch_plus_1"]),
    ] + kv_params.input_types()
    with Graph("llama", input_types=types) as g:
        kv = PagedCacheValues.from_graph_inputs(g.inputs[2:])
        g.output(*model(g.inputs[0].tensor, kv, n_logits, g.inputs[1].tensor))
    return InferenceSession().load(g, weights_registry=model.state_dict())


def test_tiny_llama_prefill_and_decode_match_numpy(rng):
    model, kv_params = build_llama()
    weights = random_weights(model, rng)
    assert (
        "layers.1.self_attn.q_proj.weight" in weights
        and "lm_head.weight" in weights
        and "embed_tokens.weight" in weights
    )
    session_model = _llama_graph(model, kv_params)
    mgr = PagedKVCacheManager(
        kv_params, num_layers=TINY["n_layers"], total_num_pages=12, max_batch_size=2, max_seq_len=TINY["max_seq_len"]
    )
    seqs = [
        list(rng.integers(0, TINY["vocab"], 7)),
        list(rng.integers(0, TINY["vocab"], 3)),
    ]  # 7 tokens span two pages of 4
    ids = [mgr.claim(), mgr.claim()]
    counts = [len(s) for s in seqs]
    tokens, offsets = np.concatenate(seqs).astype(np.int64), np.array([0, 7, 10], np.uint32)
    for step in range(4):
        before = compile_stats()["compiles"]
        (logits,) = session_model.execute(tokens, offsets, *mgr.fetch(ids, counts))
        mgr.step(ids, counts)
        if step >= 2:
            assert compile_stats()["compiles"] == before, "decode steps with equal shapes must reuse one executable"
        logits = logits.to_numpy()
        assert logits.shape == (2, TINY["vocab"]) and logits.dtype == np.float32
        for b in range(2):
            np.testing.assert_allclose(logits[b], np_llama(weights, seqs[b], TINY)[-1], rtol=1e-4, atol=1e-4)
        nxt = logits.argmax(-1)
        for b in range(2):
            seqs[b].append(int(nxt[b]))
        tokens, offsets, counts = nxt.astype(np.int64), np.array([0, 1, 2], np.uint32), [1, 1]
    assert [mgr.cache_length(i) for i in ids] == [10, 6]


@pytest.mark.parametrize("mode", [ReturnLogits.ALL, ReturnLogits.VARIABLE])
def test_transformer_return_logits(rng, mode):
    cfg = dict(TINY, n_layers=1)
    model, kv_params = build_llama(cfg, return_logits=mode)
    weights = random_weights(model, rng)
    m = _llama_graph(model, kv_params, n_logits=2)
    mgr = PagedKVCacheManager(kv_params, 1, 8, 2, 16)
    seqs = [list(rng.integers(0, 50, 4)), list(rng.integers(0, 50, 3))]
    ids = [mgr.claim(), mgr.claim()]
    last, logits, offs = (
        o.to_numpy()
        for o in m.execute(
            np.concatenate(seqs).astype(np.int64), np.array([0, 4, 7], np.uint32), *mgr.fetch(ids, [4, 3])
        )
    )
    refs = [np_llama(weights, s, cfg) for s in seqs]
    np.testing.assert_allclose(last, np.stack([r[-1] for r in refs]), rtol=1e-4, atol=1e-4)
    if mode is ReturnLogits.ALL:
        np.testing.assert_allclose(logits, np.concatenate(refs), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(offs, [0, 4, 7])
    else:
        np.testing.assert_allclose(logits, np.concatenate([r[-2:] for r in refs]), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(offs, [0, 2, 4])


def test_transformer_variable_logits_needs_a_static_count(rng):
    model, kv_params = build_llama(dict(TINY, n_layers=1), return_logits=ReturnLogits.VARIABLE)
    random_weights(model, rng)
    with pytest.raises(ValueError, match="VARIABLE needs return_n_logits as a positive Python int"):
        _llama_graph(model, kv_params, n_logits=0)


# ─── single attention layers over the cache ───────────────────────────────

HID, NH, NKV, HD = 16, 4, 2, 4


def _attn_params(page_size=4):
    return KVCacheParams(F32, n_kv_heads=NKV, head_dim=HD, page_size=page_size)


def _fill(layer, rng, scale=0.5):
    state = {k: (scale * rng.normal(size=np.shape(v))).astype(np.float32) for k, v in layer.state_dict().items()}
    for k in state:
        if "norm" in k:
            state[k] = (1 + 0.1 * rng.normal(size=state[k].shape)).astype(np.float32)
    layer.load_state_dict(state)
    return state


def _run_steps(layer, kv_params, steps, freqs=True, n_layers=1, layer_idx=0):
    """Run ``layer`` on ragged inputs ``steps = [(x [T, HID], counts per sequence)]``; returns outputs per step."""
    types = [TensorType(F32, ["t", HID]), TensorType(DType.uint32, ["b1"])] + kv_params.input_types()
    with Graph("attn", input_types=types) as g:
        kv = PagedCacheValues.from_graph_inputs(g.inputs[2:])
        f = layer.rope.freqs_cis if freqs else None
        g.output(layer(layer_idx, g.inputs[0].tensor, kv, f, g.inputs[1].tensor))
    model = InferenceSession().load(g, weights_registry=layer.state_dict())
    mgr = PagedKVCacheManager(kv_params, n_layers, 16, 2, 32)
    ids = [mgr.claim() for _ in steps[0][1]]
    outs = []
    for x, counts in steps:
        offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
        outs.append(model.execute(x, offs, *mgr.fetch(ids, counts))[0].to_numpy())
        mgr.step(ids, counts)
    return outs


def _two_steps(rng):
    xs = [rng.normal(size=(5, HID)).astype(np.float32), rng.normal(size=(3, HID)).astype(np.float32)]
    x1 = np.concatenate(xs)
    x2 = rng.normal(size=(2, HID)).astype(np.float32)
    full = [np.concatenate([xs[0], x2[:1]]), np.concatenate([xs[1], x2[1:]])]
    return [(x1, [5, 3]), (x2, [1, 1])], full


def _check_steps(outs, full, ref):
    want = [ref(f) for f in full]
    np.testing.assert_allclose(outs[0], np.concatenate([want[0][:5], want[1][:3]]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs[1], np.stack([want[0][5], want[1][3]]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("interleaved", [True, False])
def test_attention_with_rope_gqa_prefill_then_decode(rng, interleaved):
    rope = RotaryEmbedding(HID, NH, 10000.0, 32, head_dim=HD, interleaved=interleaved)
    layer = AttentionWithRope(
        rope=rope, num_attention_heads=NH, num_key_value_heads=NKV, hidden_size=HID, kv_params=_attn_params()
    )
    w = _fill(layer, rng)
    steps, full = _two_steps(rng)
    outs = _run_steps(layer, _attn_params(), steps, n_layers=2, layer_idx=1)
    _check_steps(outs, full, lambda x: np_attention_layer(w, "", x, NH, NKV, HD, 10000.0, interleaved))


def test_attention_with_rope_stacked_bias_clip_and_qk_norm(rng):
    rope = RotaryEmbedding(HID, NH, 500.0, 32, head_dim=HD)
    layer = AttentionWithRope(
        rope=rope, num_attention_heads=NH, num_key_value_heads=NKV, hidden_size=HID, kv_params=_attn_params(),
        stacked_qkv=True, has_bias=True, clip_qkv=0.6, use_qk_norm=True, scale=0.3,
    )  # fmt: skip
    w = _fill(layer, rng)
    assert sorted(w) == ["k_norm.weight", "o_proj.weight", "q_norm.weight", "qkv_proj.bias", "qkv_proj.weight"]
    steps, full = _two_steps(rng)
    outs = _run_steps(layer, _attn_params(), steps)

    def ref(x):
        s, qd, kd = x.shape[0], NH * HD, NKV * HD
        qkv = x @ np.clip(w["qkv_proj.weight"], -0.6, 0.6).T + w["qkv_proj.bias"]
        q = np_rms(qkv[:, :qd].reshape(s, NH, HD), w["q_norm.weight"])
        k = np_rms(qkv[:, qd : qd + kd].reshape(s, NKV, HD), w["k_norm.weight"])
        v = qkv[:, qd + kd :].reshape(s, NKV, HD)
        a = np_causal_attention(np_rope(q, 500.0, True), np_rope(k, 500.0, True), v, 0.3)
        return a.reshape(s, qd) @ w["o_proj.weight"].T

    _check_steps(outs, full, ref)


def test_attention_with_rope_no_opaque_matches_numpy(rng):
    rope = RotaryEmbedding(HID, NH, 10000.0, 32, head_dim=HD)
    layer = AttentionWithRopeNoOpaque(
        rope=rope, num_attention_heads=NH, num_key_value_heads=NKV, hidden_size=HID, kv_params=_attn_params()
    )
    w = _fill(layer, rng)
    steps, full = _two_steps(rng)
    _check_steps(
        _run_steps(layer, _attn_params(), steps),
        full,
        lambda x: np_attention_layer(w, "", x, NH, NKV, HD, 10000.0, True),
    )


def test_ragged_attention_null_mask(rng):
    layer = RaggedAttention(
        mask_variant=MHAMaskVariant.NULL_MASK,
        num_attention_heads=NH,
        num_key_value_heads=NKV,
        hidden_size=HID,
        kv_params=_attn_params(),
    )
    w = _fill(layer, rng)
    x = rng.normal(size=(7, HID)).astype(np.float32)
    (out,) = _run_steps(layer, _attn_params(), [(x, [4, 3])], freqs=False)
    for s, e in ((0, 4), (4, 7)):
        xs = x[s:e]
        q, k, v = (xs @ w[f"{n}_proj.weight"].T for n in "qkv")
        q, k, v = q.reshape(-1, NH, HD), k.reshape(-1, NKV, HD), v.reshape(-1, NKV, HD)
        a = np.zeros_like(q)
        for h in range(NH):
            lg = q[:, h] @ k[:, h // 2].T / np.sqrt(HD)
            p = np.exp(lg - lg.max(-1, keepdims=True))
            a[:, h] = p / p.sum(-1, keepdims=True) @ v[:, h // 2]
        np.testing.assert_allclose(out[s:e], a.reshape(-1, NH * HD) @ w["o_proj.weight"].T, rtol=1e-4, atol=1e-5)


def test_multihead_attention_padded(rng):
    mha = MultiheadAttention(num_attention_heads=2, hidden_size=8, qkv_has_bias=True, o_proj_has_bias=True)
    w = _fill(mha, rng)
    x = rng.normal(size=(2, 5, 8)).astype(np.float32)
    with Graph("mha", input_types=[TensorType(F32, ["b", "s", 8])]) as g:
        g.output(mha(g.inputs[0].tensor))
    out = InferenceSession().load(g, weights_registry=mha.state_dict()).execute(x)[0].to_numpy()
    for b in range(2):
        q, k, v = (x[b] @ w[f"{n}_proj.weight"].T + w[f"{n}_proj.bias"] for n in "qkv")
        a = np.zeros((5, 2, 4))
        for h in range(2):
            lg = q[:, h * 4 : h * 4 + 4] @ k[:, h * 4 : h * 4 + 4].T / 2.0
            p = np.exp(lg - lg.max(-1, keepdims=True))
            a[:, h] = p / p.sum(-1, keepdims=True) @ v[:, h * 4 : h * 4 + 4]
        np.testing.assert_allclose(
            out[b], a.reshape(5, 8) @ w["o_proj.weight"].T + w["o_proj.bias"], rtol=1e-4, atol=1e-5
        )


def test_tensor_and_data_parallel_attention(rng):
    rope = RotaryEmbedding(HID, NH, 10000.0, 32, head_dim=HD)
    kwargs = dict(
        rope=rope,
        num_attention_heads=NH,
        num_key_value_heads=NKV,
        hidden_size=HID,
        kv_params=_attn_params(),
        devices=[CPU, CPU],
    )
    tp, dp = TensorParallelAttentionWithRope(**kwargs), DataParallelAttentionWithRope(**kwargs)
    w = _fill(tp, rng)
    dp.load_state_dict(w)
    x = rng.normal(size=(5, HID)).astype(np.float32)
    want = np_attention_layer(w, "", x, NH, NKV, HD, 10000.0, True)
    kv_params = _attn_params()
    tp_kv = KVCacheParams(F32, n_kv_heads=NKV, head_dim=HD, page_size=4, n_devices=2)
    types = (
        [TensorType(F32, ["t", HID]), TensorType(DType.uint32, ["b1"])]
        + tp_kv.input_types()
        + tp_kv.input_types()
        + kv_params.input_types()
        + kv_params.input_types()
    )
    with Graph("dist", input_types=types) as g:
        x_in, offs = g.inputs[0].tensor, g.inputs[1].tensor
        kvs = [PagedCacheValues.from_graph_inputs(g.inputs[2 + 4 * i : 6 + 4 * i]) for i in range(4)]
        f = rope.freqs_cis
        tp_out = tp(0, [x_in, x_in], None, kvs[:2], [f, f], [offs, offs])
        dp_out = dp(0, [x_in, x_in], kvs[2:], [f, f], [offs, offs])
        g.output(*tp_out, *dp_out)
    model = InferenceSession().load(g, weights_registry=tp.state_dict())
    mgrs = [PagedKVCacheManager(tp_kv, 1, 4, 1, 8)] * 2 + [PagedKVCacheManager(kv_params, 1, 4, 1, 8) for _ in range(2)]
    mgrs[1] = PagedKVCacheManager(tp_kv, 1, 4, 1, 8)
    ins = []
    for m in mgrs:
        ins += list(m.fetch([m.claim()], [5]))
    outs = model.execute(x, np.array([0, 5], np.uint32), *ins)
    for o in outs:
        np.testing.assert_allclose(o.to_numpy(), want, rtol=1e-4, atol=1e-5)
    assert mgrs[0].blocks.shape[4] == 1  # each tensor-parallel cache holds n_kv_heads / 2 heads


def test_attention_layer_errors():
    rope = RotaryEmbedding(HID, NH, 10000.0, 32, head_dim=HD)
    with pytest.raises(
        ValueError, match=r"num_attention_heads \(4\) must be a positive multiple of num_key_value_heads \(3\)"
    ):
        AttentionWithRope(
            rope=rope,
            num_attention_heads=4,
            num_key_value_heads=3,
            hidden_size=HID,
            kv_params=KVCacheParams(F32, 3, HD, page_size=4),
        )
    with pytest.raises(ValueError, match=r"kv_params.n_kv_heads \(2\) differs from num_key_value_heads \(1\)"):
        AttentionWithRope(
            rope=rope, num_attention_heads=4, num_key_value_heads=1, hidden_size=HID, kv_params=_attn_params()
        )
    with pytest.raises(ValueError, match="float8_config is not supported"):
        AttentionWithRope(
            rope=rope,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=HID,
            kv_params=_attn_params(),
            float8_config=object(),
        )
    with pytest.raises(ValueError, match="needs local_window_size > 0"):
        RaggedAttention(
            mask_variant=MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK,
            num_attention_heads=4,
            num_key_value_heads=2,
            hidden_size=HID,
            kv_params=_attn_params(),
        )
    layer = AttentionWithRope(
        rope=rope, num_attention_heads=4, num_key_value_heads=2, hidden_size=HID, kv_params=_attn_params()
    )
    assert layer.qkv_input_scale is None and layer.scale == pytest.approx(0.5)
    with pytest.raises(ValueError, match="has no float8 weight scales"):
        layer.qkv_weight_scale
    types = [TensorType(F32, [3, 8]), TensorType(DType.uint32, [2])] + _attn_params().input_types()
    with Graph("bad", input_types=types) as g:
        kv = PagedCacheValues.from_graph_inputs(g.inputs[2:])
        with pytest.raises(ValueError, match=r"x must be ragged \[total_tokens, 16\]"):
            layer(0, g.inputs[0].tensor, kv, rope.freqs_cis, g.inputs[1].tensor)
        with pytest.raises(TypeError, match="kv_collection must be a PagedCacheValues"):
            kernels.flash_attention_ragged(
                _attn_params(),
                ops.reshape(g.inputs[0].tensor, [3, 2, 4]),
                g.inputs[1].tensor,
                list(kv),
                0,
                MHAMaskVariant.CAUSAL_MASK,
                1.0,
            )
        g.output(g.inputs[0].tensor)


# ─── multi-latent attention ───────────────────────────────────────────────

R, NOPE, ROPE_D, VD, MH = 8, 4, 4, 6, 2


def _mla_params():
    return KVCacheParams(F32, n_kv_heads=1, head_dim=R + ROPE_D, page_size=4, is_mla=True)


def _np_mla(w, x):
    s = x.shape[0]
    ckv = x @ w["kv_a_proj_with_mqa.weight"].T
    latent = np_rms(ckv[:, :R], w["kv_a_layernorm.weight"])
    k_pe = np_rope(ckv[:, R:][:, None, :], 10000.0, True)
    q = (x @ w["q_proj.weight"].T).reshape(s, MH, NOPE + ROPE_D)
    q = np.concatenate([q[..., :NOPE], np_rope(q[..., NOPE:], 10000.0, True)], -1)
    kvb = (latent @ w["kv_b_proj.weight"].T).reshape(s, MH, NOPE + VD)
    k = np.concatenate([kvb[..., :NOPE], np.repeat(k_pe, MH, axis=1)], -1)
    a = np_causal_attention(q, k, kvb[..., NOPE:], 1 / np.sqrt(NOPE + ROPE_D))
    return a.reshape(s, MH * VD) @ w["o_proj.weight"].T


def _mla_layer(cls=None, **kw):
    from maxfx.nn.attention import LatentAttentionWithRope

    rope = RotaryEmbedding(HID, MH, 10000.0, 32, head_dim=ROPE_D)
    return (cls or LatentAttentionWithRope)(
        rope=rope, num_attention_heads=MH, num_key_value_heads=1, hidden_size=HID, kv_params=_mla_params(), dtype=F32,
        kv_lora_rank=R, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE_D, v_head_dim=VD, **kw,
    )  # fmt: skip


def test_latent_attention_prefill_then_decode(rng):
    layer = _mla_layer()
    w = _fill(layer, rng, scale=0.4)
    steps, full = _two_steps(rng)
    _check_steps(_run_steps(layer, _mla_params(), steps), full, lambda x: _np_mla(w, x))


def test_tensor_parallel_latent_attention_sums_head_shards(rng):
    from maxfx.nn.attention import TensorParallelLatentAttentionWithRope

    layer = _mla_layer(TensorParallelLatentAttentionWithRope, devices=[CPU, CPU])
    w = _fill(layer, rng, scale=0.4)
    x = rng.normal(size=(4, HID)).astype(np.float32)
    types = [TensorType(F32, ["t", HID]), TensorType(DType.uint32, ["b1"])] + _mla_params().input_types() * 2
    with Graph("tp_mla", input_types=types) as g:
        xi, offs = g.inputs[0].tensor, g.inputs[1].tensor
        kvs = [PagedCacheValues.from_graph_inputs(g.inputs[2 + 4 * i : 6 + 4 * i]) for i in range(2)]
        f = layer.rope.freqs_cis
        g.output(*layer(0, [xi, xi], None, kvs, [f, f], [offs, offs]))
    model = InferenceSession().load(g, weights_registry=layer.state_dict())
    ins = []
    for _ in range(2):
        m = PagedKVCacheManager(_mla_params(), 1, 4, 1, 8)
        ins += list(m.fetch([m.claim()], [4]))
    for o in model.execute(x, np.array([0, 4], np.uint32), *ins):
        np.testing.assert_allclose(o.to_numpy(), _np_mla(w, x), rtol=1e-4, atol=1e-5)


def test_mla_prefill_kernels_match_decode_kernel(rng):
    """plan → decompress K/V from the latent cache → flare_mla_prefill_ragged equals the absorbed
    flare_mla_decode_ragged.
    """
    p = _mla_params()
    w_kvb = (0.5 * rng.normal(size=(MH * (NOPE + VD), R))).astype(np.float32)
    q = rng.normal(size=(5, MH, NOPE + ROPE_D)).astype(np.float32)
    pool = rng.normal(size=(8, 1, 1, 4, 1, R + ROPE_D)).astype(np.float32)
    lookup = np.array([[2, 5, 0], [7, 1, 0]], np.uint32)
    cache_len, offs = np.array([3, 6], np.uint32), np.array([0, 3, 5], np.uint32)
    types = [
        TensorType(F32, [5, MH, NOPE + ROPE_D]),
        TensorType(F32, list(w_kvb.shape)),
        TensorType(DType.uint32, [3]),
    ] + p.input_types()
    with Graph("mla_kernels", input_types=types) as g:
        qv, wv, ov = (v.tensor for v in g.inputs[:3])
        kv = PagedCacheValues.from_graph_inputs(g.inputs[3:])
        bro, co, blen = kernels.flare_mla_prefill_plan(p, ov, kv, 0, buffer_size=64, max_chunks=2)
        kvb = kernels.flare_mla_decompress_k_cache(p, bro[0], co[0], blen[0], wv, kv, 0, 64)  # [64, H*(nope+v)]
        kvb = ops.reshape(kvb, [64, MH, NOPE + VD])
        k_pe = ops.reshape(
            kernels.k_cache_to_buffer(p, bro[0], co[0], kv, 0, blen[0], 64, R + ROPE_D)[:, R:], [64, 1, ROPE_D]
        )
        k = ops.concat([kvb[:, :, :NOPE], ops.broadcast_to(k_pe, [64, MH, ROPE_D])], axis=-1)
        pre = kernels.flare_mla_prefill_ragged(
            p, qv, k, kvb[:, :, NOPE:], ov, bro[0], co[0], kv, 0, MHAMaskVariant.CAUSAL_MASK, 0.3, ROPE_D
        )
        w_uk = ops.reshape(wv, [MH, NOPE + VD, R])
        q_lat = ops.permute(ops.permute(qv[:, :, :NOPE], [1, 0, 2]) @ w_uk[:, :NOPE, :], [1, 0, 2])
        dec = kernels.flare_mla_decode_ragged(
            p, ops.concat([q_lat, qv[:, :, NOPE:]], axis=-1), ov, kv, 0, MHAMaskVariant.CAUSAL_MASK, 0.3, ROPE_D
        )
        dec = ops.permute(ops.permute(dec, [1, 0, 2]) @ ops.permute(w_uk[:, NOPE:, :], [0, 2, 1]), [1, 0, 2])
        g.output(pre, dec, bro, co, blen, kernels.kv_cache_get_max_seq_len(p, kv))
    from maxfx.driver import Tensor

    max_lengths = np.array([[3, 8]], np.uint32)
    pre, dec, bro, co, blen, mx = (
        o.to_numpy()
        for o in InferenceSession()
        .load(g)
        .execute(q, w_kvb, offs, Tensor.from_numpy(pool), cache_len, lookup, max_lengths)
    )
    np.testing.assert_array_equal(bro, [[0, 6, 14], [0, 0, 0]])  # 6 and 8 keys in one chunk of 64
    np.testing.assert_array_equal(co, [[0, 0], [6, 8]])  # the unused chunk starts past every key
    np.testing.assert_array_equal(blen, [14, 0])
    np.testing.assert_array_equal(mx, [8])
    np.testing.assert_allclose(pre, dec, rtol=1e-4, atol=1e-5)


def test_mla_prefill_plan_splits_long_batches():
    p = _mla_params()
    with Graph("plan", input_types=[TensorType(DType.uint32, [3])] + p.input_types()) as g:
        kv = PagedCacheValues.from_graph_inputs(g.inputs[1:])
        g.output(*kernels.flare_mla_prefill_plan(p, g.inputs[0].tensor, kv, 0, buffer_size=4, max_chunks=4))
    from maxfx.driver import Tensor

    pool = Tensor.from_numpy(np.zeros((2, 1, 1, 4, 1, R + ROPE_D), np.float32))
    outs = (
        InferenceSession()
        .load(g)
        .execute(
            np.array([0, 2, 3], np.uint32),
            pool,
            np.array([3, 1], np.uint32),
            np.zeros((2, 1), np.uint32),
            np.zeros((1, 2), np.uint32),
        )
    )
    bro, co, blen = (o.to_numpy() for o in outs)
    # sequence lengths 5 and 2 (7 keys): chunks [0,4) [4,7)
    np.testing.assert_array_equal(bro, [[0, 4, 4], [0, 1, 3], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(co, [[0, 0], [4, 0], [5, 2], [5, 2]])
    np.testing.assert_array_equal(blen, [4, 3, 0, 0])


# ─── kernels ──────────────────────────────────────────────────────────────


def test_flash_attention_gpu_sliding_window_and_valid_length(rng):
    from tests.ops.test_attention_ops import np_attend

    q, k, v = (rng.normal(size=(2, 6, 4, 8)).astype(np.float32) for _ in range(3))
    valid = np.array([6, 4], np.uint32)
    with Graph("fa", input_types=[TensorType(F32, [2, 6, 4, 8])] * 3 + [TensorType(DType.uint32, [2])]) as g:
        a, b, c, n = (x.tensor for x in g.inputs)
        g.output(
            kernels.flash_attention_gpu(
                a, b, c, MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK, 0.5, local_window_size=3, valid_length=n
            )
        )
    out = InferenceSession().load(g).execute(q, k, v, valid)[0].to_numpy()
    for i in range(2):
        want = np_attend(q[i], k[i], v[i], np.arange(6), valid[i], "sliding_window", 0.5, 3)
        np.testing.assert_allclose(out[i, : valid[i]], want[: valid[i]], rtol=1e-5, atol=1e-5)


def test_flash_attention_ragged_gpu(rng):
    from tests.ops.test_attention_ops import np_attend

    q, k, v = (rng.normal(size=(7, 2, 4)).astype(np.float32) for _ in range(3))
    offs = np.array([0, 5, 7], np.uint32)
    with Graph("far", input_types=[TensorType(F32, [7, 2, 4])] * 3 + [TensorType(DType.uint32, [3])]) as g:
        a, b, c, o = (x.tensor for x in g.inputs)
        g.output(kernels.flash_attention_ragged_gpu(a, b, c, o, 5, MHAMaskVariant.CAUSAL_MASK, 0.5))
    out = InferenceSession().load(g).execute(q, k, v, offs)[0].to_numpy()
    for s, e in ((0, 5), (5, 7)):
        np.testing.assert_allclose(
            out[s:e], np_attend(q[s:e], k[s:e], v[s:e], np.arange(e - s), e - s, "causal", 0.5), rtol=1e-5, atol=1e-5
        )


def test_cache_kernels_write_radd_norm_and_cross_attention(rng):
    """matmul_kv_cache_ragged stores encoder K/V, kv_cache_ragged_radd and rms_norm_key_cache update them in place,
    cross_attention_ragged attends over them; compared with numpy on the same data."""
    from maxfx.driver import Tensor
    from tests.ops.test_attention_ops import np_attend

    p = _attn_params(page_size=4)
    enc = rng.normal(size=(5, HID)).astype(np.float32)
    w_kv = (0.5 * rng.normal(size=(2 * NKV * HD, HID))).astype(np.float32)
    delta = rng.normal(size=(5, 2 * NKV * HD)).astype(np.float32)
    gamma = (1 + 0.1 * rng.normal(size=HD)).astype(np.float32)
    q = rng.normal(size=(3, NH, HD)).astype(np.float32)
    enc_offs, q_offs = np.array([0, 2, 5], np.uint32), np.array([0, 1, 3], np.uint32)
    types = [
        TensorType(F32, [5, HID]),
        TensorType(F32, list(w_kv.shape)),
        TensorType(F32, [5, 2 * NKV * HD]),
        TensorType(F32, [HD]),
        TensorType(F32, [3, NH, HD]),
    ]
    types += [TensorType(DType.uint32, [3]), TensorType(DType.uint32, [3])] + p.input_types()
    with Graph("cache_kernels", input_types=types) as g:
        e, wkv, d, gm, qv, eo, qo = (x.tensor for x in g.inputs[:7])
        kv = PagedCacheValues.from_graph_inputs(g.inputs[7:])
        kernels.matmul_kv_cache_ragged(p, e, eo, wkv, kv, 0)
        kernels.kv_cache_ragged_radd(p, d, kv, eo, 0, 0)
        kernels.rms_norm_key_cache(p, kv, gm, 1e-6, 0, e.shape[0], eo, 0.0)
        g.output(kernels.cross_attention_ragged(p, qv, qo, kv, 0, MHAMaskVariant.NULL_MASK, eo, 2, 0.5))
    lookup = np.array([[0, 1], [2, 3]], np.uint32)
    pool = Tensor.from_numpy(np.zeros((4, 2, 1, 4, NKV, HD), np.float32))
    out = (
        InferenceSession()
        .load(g)
        .execute(
            enc,
            w_kv,
            delta,
            gamma,
            q,
            enc_offs,
            q_offs,
            pool,
            np.zeros(2, np.uint32),
            lookup,
            np.zeros((1, 2), np.uint32),
        )[0]
        .to_numpy()
    )
    kvd = NKV * HD
    kvr = enc @ w_kv.T + delta
    k = np_rms(kvr[:, :kvd].reshape(5, NKV, HD), gamma)
    v = kvr[:, kvd:].reshape(5, NKV, HD)
    np.testing.assert_allclose(pool.to_numpy()[0, 0, 0, :2], k[:2], rtol=1e-5, atol=1e-5)  # seq 0's keys, page 0
    for qs, qe, ks, ke in ((0, 1, 0, 2), (1, 3, 2, 5)):
        want = np_attend(q[qs:qe], k[ks:ke], v[ks:ke], np.zeros(qe - qs, int), ke - ks, "null", 0.5)
        np.testing.assert_allclose(out[qs:qe], want, rtol=1e-4, atol=1e-5)


def test_gguf_attention_matches_dequantized_numpy(rng):
    import gguf

    from maxfx.graph.quantization import QuantizationEncoding
    from maxfx.nn.attention import GGUFQAttentionWithRope

    hid, heads, kvh, hd = 32, 2, 1, 32
    p = KVCacheParams(F32, kvh, hd, page_size=4)
    rope = RotaryEmbedding(hid, heads, 10000.0, 32, head_dim=hd)
    layer = GGUFQAttentionWithRope(
        rope=rope,
        num_attention_heads=heads,
        num_key_value_heads=kvh,
        hidden_size=hid,
        kv_params=p,
        dtype=F32,
        quantization_encoding=QuantizationEncoding.Q4_0,
    )
    dense = {
        n: (0.3 * rng.normal(size=s)).astype(np.float32)
        for n, s in (("q_proj", (64, 32)), ("k_proj", (32, 32)), ("v_proj", (32, 32)), ("o_proj", (32, 64)))
    }
    packed = {f"{n}.weight": gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0) for n, w in dense.items()}
    layer.load_state_dict(packed)
    deq = {k: gguf.quants.dequantize(v, gguf.GGMLQuantizationType.Q4_0).astype(np.float64) for k, v in packed.items()}
    x = rng.normal(size=(4, hid)).astype(np.float32)
    types = [TensorType(F32, ["t", hid]), TensorType(DType.uint32, ["b1"])] + p.input_types()
    with Graph("gguf_attn", input_types=types) as g:
        kv = PagedCacheValues.from_graph_inputs(g.inputs[2:])
        g.output(layer(0, g.inputs[0].tensor, kv, rope.freqs_cis, g.inputs[1].tensor))
    mgr = PagedKVCacheManager(p, 1, 4, 1, 8)
    out = (
        InferenceSession()
        .load(g, weights_registry=layer.state_dict())
        .execute(x, np.array([0, 4], np.uint32), *mgr.fetch([mgr.claim()], [4]))[0]
        .to_numpy()
    )
    # atol 1e-3: on a CPU the Q4_0 products round x to int16 per 32 values (custom_calls/cpu/qgemv.cc).
    np.testing.assert_allclose(out, np_attention_layer(deq, "", x, heads, kvh, hd, 10000.0, True), rtol=1e-3, atol=1e-3)


def test_sgmv_qkv_lora_kernel_adds_kv_deltas_to_the_cache(rng):
    from maxfx.driver import Tensor

    p = _attn_params()
    qd, kvd, rank = NH * HD, NKV * HD, 2
    x = rng.normal(size=(3, HID)).astype(np.float32)
    a = rng.normal(size=(1, rank, HID)).astype(np.float32)
    b = rng.normal(size=(1, qd + 2 * kvd, rank)).astype(np.float32)
    types = [
        TensorType(F32, [3, HID]),
        TensorType(F32, [1, rank, HID]),
        TensorType(F32, [1, qd + 2 * kvd, rank]),
        TensorType(DType.int32, [1]),
        TensorType(DType.int32, [1]),
        TensorType(DType.uint32, [2]),
    ]
    with Graph("lora", input_types=types + p.input_types()) as g:
        xv, av, bv, ids, ranks, offs = (v.tensor for v in g.inputs[:6])
        kv = PagedCacheValues.from_graph_inputs(g.inputs[6:])
        g.output(kernels.sgmv_qkv_lora_kernel(xv, av, bv, ids, ranks, offs, offs, kv, p, 0, 8, rank, qd, kvd))
    pool = Tensor.from_numpy(np.zeros((2, 2, 1, 4, NKV, HD), np.float32))
    args = (
        x,
        a,
        b,
        np.zeros(1, np.int32),
        np.array([rank], np.int32),
        np.array([0, 3], np.uint32),
        pool,
        np.zeros(1, np.uint32),
        np.array([[1]], np.uint32),
        np.zeros((1, 2), np.uint32),
    )
    q = InferenceSession().load(g).execute(*args)[0].to_numpy()
    delta = x @ a[0].T @ b[0].T
    np.testing.assert_allclose(q, delta[:, :qd], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        pool.to_numpy()[1, 0, 0, :3].reshape(3, kvd), delta[:, qd : qd + kvd], rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(pool.to_numpy()[1, 1, 0, :3].reshape(3, kvd), delta[:, qd + kvd :], rtol=1e-4, atol=1e-5)
