"""Eager multi-latent attention (max.experimental.nn.common_layers.multi_latent_attention) against numpy.

The numpy reference decompresses K and V per head from the cached latents
(the textbook form), while the layer attends in the absorbed latent form, so
the two share no code: q (optionally through q_lora), kv_a projection, latent
RMSNorm, interleaved RoPE on the rope part, causal attention over the paged
cache's contents (rows cached earlier plus this step's), output projection.
"""

from __future__ import annotations

import numpy as np
import pytest

from maxfx import driver
from maxfx.driver import CPU
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.nn.common_layers.kv_cache import PagedCacheValues
from maxfx.experimental.nn.common_layers.mesh_axis import DP, TP
from maxfx.experimental.nn.common_layers.multi_latent_attention import (
    LatentAttentionWithRope,
    MLAPrefillMetadata,
    tensor_parallel_latent_attention_with_rope,
)
from maxfx.experimental.sharding import (
    DeviceMesh,
    Partial,
    PlacementMapping,
    Replicated,
    Sharded,
    distribute,
    from_shards,
)
from maxfx.experimental.tensor import Tensor
from maxfx.graph import BufferType, DeviceRef, SymbolicDim, TensorType
from maxfx.nn.kv_cache import KVCacheInputsPerDevice, KVCacheLeafInputs, MHAKVCacheParams, MLAKVCacheParams
from maxfx.nn.kv_cache import PagedCacheValues as GraphPagedCacheValues

H, HIDDEN, Q_LORA, RANK, NOPE, ROPE, V = 4, 24, 12, 16, 8, 6, 8
LAYERS, LAYER, PAGE, PAGES, MAX_SEQ = 2, 1, 4, 6, 16
EPS = 1e-6


def _params(n_devices: int = 1) -> MLAKVCacheParams:
    return MLAKVCacheParams(
        DType.float32,
        head_dim=RANK + ROPE,
        num_layers=LAYERS,
        devices=[DeviceRef.CPU()] * n_devices,
        num_q_heads=H,
        page_size=PAGE,
    )


def _layer(
    params: MLAKVCacheParams, q_lora_rank: int | None, weights: dict[str, np.ndarray]
) -> LatentAttentionWithRope:
    layer = LatentAttentionWithRope(
        num_attention_heads=H,
        num_key_value_heads=1,
        hidden_size=HIDDEN,
        kv_params=params,
        layer_idx=LAYER,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=RANK,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=V,
    )
    layer.load_state_dict({k: Tensor(v) for k, v in weights.items()})
    return layer


def _weights(rng: np.random.Generator, q_lora_rank: int | None) -> dict[str, np.ndarray]:
    def r(*shape: int, s: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {
        "kv_a_proj_layernorm": 1 + r(RANK, s=0.1),
        "kv_a_proj_with_mqa": r(RANK + ROPE, HIDDEN),
        "kv_b_proj": r(H * (NOPE + V), RANK),
        "o_proj.weight": r(HIDDEN, H * V),
    }
    if q_lora_rank is None:
        w["q_proj"] = r(H * (NOPE + ROPE), HIDDEN)
    else:
        w.update(
            {
                "q_a_proj": r(q_lora_rank, HIDDEN),
                "q_a_layernorm.weight": 1 + r(q_lora_rank, s=0.1),
                "q_b_proj": r(H * (NOPE + ROPE), q_lora_rank),
            }
        )
    return w


def _freqs() -> np.ndarray:
    """``[MAX_SEQ, ROPE]`` of interleaved (cos, sin) pairs."""
    inv = 10000.0 ** (-np.arange(0, ROPE, 2) / ROPE)
    ang = np.arange(MAX_SEQ)[:, None] * inv[None, :]
    return np.stack([np.cos(ang), np.sin(ang)], axis=-1).reshape(MAX_SEQ, ROPE).astype(np.float32)


# ─── the numpy reference ────────────────────────────────────────────────────


def _rms(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def _rope(x: np.ndarray, pos: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """Rotate pairs (2j, 2j+1) of ``x [T, ..., ROPE]`` by the angles of positions ``pos [T]``."""
    cos, sin = freqs[pos, 0::2], freqs[pos, 1::2]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (ROPE // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out


def _reference(
    w: dict[str, np.ndarray],
    x: np.ndarray,
    blocks: np.ndarray,
    lookup: np.ndarray,
    cache_lengths: np.ndarray,
    offsets: np.ndarray,
    n_heads: int = H,
):
    """(output [T, HIDDEN], the cache blocks after this step)."""
    blocks = blocks.copy()
    t = x.shape[0]
    q = _rms(x @ w["q_a_proj"].T, w["q_a_layernorm.weight"]) @ w["q_b_proj"].T if "q_a_proj" in w else x @ w["q_proj"].T
    q = q.reshape(t, n_heads, NOPE + ROPE)
    kv = x @ w["kv_a_proj_with_mqa"].T
    latent, k_pe = _rms(kv[:, :RANK], w["kv_a_proj_layernorm"]), kv[:, RANK:]
    kv_b = w["kv_b_proj"].reshape(n_heads, NOPE + V, RANK)
    out = np.zeros((t, n_heads, V), np.float32)
    freqs = _freqs()
    for b in range(len(cache_lengths)):
        lo, hi, start = int(offsets[b]), int(offsets[b + 1]), int(cache_lengths[b])
        pos = start + np.arange(hi - lo)
        rows = np.concatenate([latent[lo:hi], _rope(k_pe[lo:hi], pos, freqs)], axis=-1)
        for i, p in enumerate(pos):
            blocks[lookup[b, p // PAGE], 0, LAYER, p % PAGE, 0] = rows[i]
        keys = np.stack([blocks[lookup[b, p // PAGE], 0, LAYER, p % PAGE, 0] for p in range(start + hi - lo)])
        c, k_rope = keys[:, :RANK], keys[:, RANK:]
        qb = np.concatenate([q[lo:hi, :, :NOPE], _rope(q[lo:hi, :, NOPE:], pos, freqs)], axis=-1)
        for h in range(n_heads):
            k = np.concatenate([c @ kv_b[h, :NOPE].T, k_rope], axis=-1)  # decompressed keys [L, NOPE + ROPE]
            v = c @ kv_b[h, NOPE:].T  # [L, V]
            s = qb[:, h] @ k.T / np.sqrt(NOPE + ROPE)
            s = np.where(np.arange(len(keys))[None, :] <= pos[:, None], s, -np.inf)
            p_ = np.exp(s - s.max(-1, keepdims=True))
            out[lo:hi, h] = (p_ / p_.sum(-1, keepdims=True)) @ v
    return out.reshape(t, n_heads * V) @ w["o_proj.weight"].T, blocks


# ─── building the cache as MAX's test does ──────────────────────────────────


def _step(rng: np.random.Generator):
    """A batch of two: sequence 0 has 3 cached tokens and 2 new, sequence 1 none cached and 3 new."""
    blocks = (rng.standard_normal((PAGES, 1, LAYERS, PAGE, 1, RANK + ROPE)) * 0.5).astype(np.float32)
    lookup = np.array([[4, 1], [0, 5]], np.uint32)
    cache_lengths = np.array([3, 0], np.uint32)
    offsets = np.array([0, 2, 5], np.uint32)
    x = rng.standard_normal((5, HIDDEN)).astype(np.float32)
    return x, blocks, lookup, cache_lengths, offsets


def _device_values(blocks, lookup, cache_lengths, offsets) -> list[Tensor]:
    """One device's cache inputs in `get_symbolic_inputs` order."""
    new = np.diff(offsets.astype(np.int64))
    return [
        Tensor(blocks.copy()), Tensor(cache_lengths), Tensor(lookup),
        Tensor(np.array([new.max()], np.uint32)), Tensor(np.array([(cache_lengths + new).max()], np.uint32)),
        Tensor(np.zeros(3, np.int64)), Tensor(np.ones(1, np.int64)),
    ]  # fmt: skip


def _collection(params: MLAKVCacheParams, per_device: list[list[Tensor]], mesh: DeviceMesh) -> PagedCacheValues:
    symbols = params.get_symbolic_inputs()
    concrete = symbols.unflatten(iter([v for values in per_device for v in values]))
    return PagedCacheValues.from_upstream(concrete.inputs, PlacementMapping(mesh, (Replicated(),)))


def _cpu_mesh(n: int, axis: str) -> DeviceMesh:
    return DeviceMesh((CPU(),) * n, (n,), (axis,))


# ─── numerics ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("q_lora_rank", [None, Q_LORA])
def test_one_device_matches_numpy_and_writes_the_cache(q_lora_rank):
    rng = np.random.default_rng(0)
    w = _weights(rng, q_lora_rank)
    x, blocks, lookup, cache_lengths, offsets = _step(rng)
    params = _params()
    layer = _layer(params, q_lora_rank, w)
    kv = _collection(params, [_device_values(blocks, lookup, cache_lengths, offsets)], _cpu_mesh(1, "x"))
    out = layer(Tensor(x), kv, Tensor(_freqs()), Tensor(offsets))
    want, want_blocks = _reference(w, x, blocks, lookup, cache_lengths, offsets)
    assert [int(d) for d in out.shape] == [5, HIDDEN] and out.device == CPU()
    np.testing.assert_allclose(out.to_numpy(), want, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(kv.kv_blocks.local_shards[0].to_numpy(), want_blocks, rtol=2e-5, atol=2e-5)


def test_tensor_parallel_heads_sum_to_the_reference():
    rng = np.random.default_rng(1)
    w = _weights(rng, Q_LORA)
    x, blocks, lookup, cache_lengths, offsets = _step(rng)
    params = _params(2)
    mesh = _cpu_mesh(2, TP)
    layer = tensor_parallel_latent_attention_with_rope(_layer(params, Q_LORA, w)).to(mesh)
    assert [int(s.shape[0]) for s in layer.kv_b_proj.local_shards] == [H // 2 * (NOPE + V)] * 2
    assert [int(s.shape[1]) for s in layer.o_proj.weight.local_shards] == [H // 2 * V] * 2
    kv = _collection(params, [_device_values(blocks, lookup, cache_lengths, offsets) for _ in range(2)], mesh)
    rep = PlacementMapping(mesh, (Replicated(),))
    out = layer(distribute(Tensor(x), rep), kv, distribute(Tensor(_freqs()), rep), distribute(Tensor(offsets), rep))
    want, want_blocks = _reference(w, x, blocks, lookup, cache_lengths, offsets)
    assert out.mapping.mesh == mesh and out.mapping.to_placements() == (Partial(),)
    np.testing.assert_allclose(out.to_numpy(), want, rtol=2e-4, atol=2e-4)
    for shard in kv.kv_blocks.local_shards:  # the latent cache is replicated: every device wrote the same rows
        np.testing.assert_allclose(shard.to_numpy(), want_blocks, rtol=2e-5, atol=2e-5)


def test_data_parallel_replicas_each_run_their_sequences():
    rng = np.random.default_rng(2)
    w = _weights(rng, None)
    x, blocks, lookup, cache_lengths, offsets = _step(rng)
    params = _params(2)
    mesh = _cpu_mesh(2, DP)
    layer = _layer(params, None, w).to(mesh)
    # Device 0 holds sequence 0 (tokens 0-1), device 1 sequence 1 (tokens 2-4), each with its own cache.
    parts = [
        (x[0:2], lookup[0:1], cache_lengths[0:1], np.array([0, 2], np.uint32)),
        (x[2:5], lookup[1:2], cache_lengths[1:2], np.array([0, 3], np.uint32)),
    ]
    kv = _collection(params, [_device_values(blocks, lk, cl, off) for _, lk, cl, off in parts], mesh)
    sharded = PlacementMapping(mesh, (Sharded(0),))
    xs = from_shards([Tensor(p[0]) for p in parts], sharded)
    offs = from_shards([Tensor(p[3]) for p in parts], sharded)
    out = layer(xs, kv, distribute(Tensor(_freqs()), PlacementMapping(mesh, (Replicated(),))), offs)
    assert out.mapping == sharded and [int(d) for d in out.shape] == [5, HIDDEN]
    for i, (xi, lk, cl, off) in enumerate(parts):
        want, want_blocks = _reference(w, xi, blocks, lk, cl, off)
        np.testing.assert_allclose(out.local_shards[i].to_numpy(), want, rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(kv.kv_blocks.local_shards[i].to_numpy(), want_blocks, rtol=2e-5, atol=2e-5)


def test_derived_weights_have_maxs_shapes():
    rng = np.random.default_rng(3)
    w = _weights(rng, Q_LORA)
    layer = _layer(_params(), Q_LORA, w)
    assert [int(d) for d in layer.w_uk.shape] == [H, RANK, NOPE]
    assert [int(d) for d in layer.w_uv.shape] == [H, V, RANK]
    assert [int(d) for d in layer.w_k.shape] == [H * NOPE, RANK]
    assert [int(d) for d in layer.wqkv.shape] == [Q_LORA + RANK + ROPE, HIDDEN]
    kv_b = w["kv_b_proj"].reshape(H, NOPE + V, RANK)
    np.testing.assert_array_equal(layer.w_uk.to_numpy(), kv_b[:, :NOPE].transpose(0, 2, 1))
    np.testing.assert_array_equal(layer.w_uv.to_numpy(), kv_b[:, NOPE:])


def test_the_prefill_plan_covers_the_step():
    rng = np.random.default_rng(3)
    layer = _layer(_params(), Q_LORA, _weights(rng, Q_LORA))
    x, blocks, lookup, cache_lengths, offsets = _step(rng)
    kv = _collection(_params(), [_device_values(blocks, lookup, cache_lengths, offsets)], _cpu_mesh(1, "x"))
    plan = layer.create_mla_prefill_metadata(Tensor(offsets), kv)
    assert isinstance(plan, MLAPrefillMetadata)
    assert plan.buffer_row_offsets.to_numpy().tolist() == [[0, 5, 8]]  # keys: 3 cached + 2 new, then 3 new
    assert plan.buffer_lengths.to_numpy().tolist() == [8]


# ─── the cache's symbolic inputs ────────────────────────────────────────────


def test_symbolic_inputs_follow_maxs_layout_and_round_trip():
    params = MLAKVCacheParams(
        DType.bfloat16, head_dim=80, num_layers=2, devices=[DeviceRef.CPU()] * 2, num_q_heads=8, data_parallel_degree=2
    )
    symbols = params.get_symbolic_inputs()
    assert isinstance(symbols, KVCacheLeafInputs) and len(symbols.inputs) == 2
    first, second = symbols.inputs
    assert isinstance(first.kv_blocks, BufferType) and [str(d) for d in first.kv_blocks.shape] == [
        "total_num_pages",
        "1",
        "2",
        "128",
        "1",
        "80",
    ]
    assert [str(d) for d in second.lookup_table.shape] == ["replica_1_batch_size", "replica_1_max_num_pages"]
    assert first.attention_dispatch_metadata == TensorType(DType.int64, [3], DeviceRef.CPU())
    assert first.mla_num_partitions == TensorType(DType.int64, [1], DeviceRef.CPU())
    flat = symbols.flatten()
    assert len(flat) == 14 and list(symbols) == flat
    back = symbols.unflatten(iter(range(14)))
    assert [d.flatten() for d in back.inputs] == [list(range(7)), list(range(7, 14))]
    assert isinstance(back.inputs[0], GraphPagedCacheValues)  # maxfx's kernels take it as kv_collection
    mha = MHAKVCacheParams(
        DType.float32, head_dim=8, num_layers=1, devices=[DeviceRef.CPU()], n_kv_heads=2, page_size=16
    ).get_symbolic_inputs()
    assert (
        mha.inputs[0].attention_dispatch_metadata == TensorType(DType.int64, [4], DeviceRef.CPU())
        and mha.inputs[0].mla_num_partitions is None
    )


def test_symbolic_input_errors():
    with pytest.raises(ValueError, match="iterator ended early"):
        _params().get_symbolic_inputs().unflatten(iter(range(3)))
    with pytest.raises(ValueError, match="mla_num_partitions must be int64"):
        KVCacheInputsPerDevice(0, 1, 2, 3, 4, mla_num_partitions=TensorType(DType.int32, [1], DeviceRef.CPU()))


# ─── tracing for GPUs this machine lacks ──────────────────────────────────────


@pytest.mark.skipif(
    driver.accelerator_count() > 0, reason="needs a machine without GPUs (virtual GPUs stand in for absent ones)"
)
@pytest.mark.parametrize("q_lora_rank", [None, Q_LORA])
def test_traces_on_virtual_gpus_one_device_and_tensor_parallel(virtual_cuda, q_lora_rank):
    driver.set_virtual_device_count(2)
    gpus = [driver.Accelerator(0), driver.Accelerator(1)]
    rng = np.random.default_rng(4)
    w = _weights(rng, q_lora_rank)
    x, blocks, lookup, cache_lengths, offsets = _step(rng)
    with F.lazy():
        params = MLAKVCacheParams(
            DType.float32,
            head_dim=RANK + ROPE,
            num_layers=LAYERS,
            devices=[DeviceRef.from_device(gpus[0])],
            num_q_heads=H,
            page_size=PAGE,
        )
        layer = _layer(params, q_lora_rank, w).to(gpus[0])
        values = [
            v.to(t.device.to_device())
            for v, t in zip(
                _device_values(blocks, lookup, cache_lengths, offsets), params.get_symbolic_inputs().flatten()
            )
        ]
        kv = PagedCacheValues.from_upstream(params.get_symbolic_inputs().unflatten(iter(values)).inputs, gpus[0])
        out = layer(Tensor(x).to(gpus[0]), kv, Tensor(_freqs()).to(gpus[0]), Tensor(offsets))
        assert [int(d) for d in out.shape] == [5, HIDDEN] and out.device == gpus[0] and not out.real

        mesh = DeviceMesh(tuple(gpus), (2,), (TP,))
        tp_params = MLAKVCacheParams(
            DType.float32,
            head_dim=RANK + ROPE,
            num_layers=LAYERS,
            devices=[DeviceRef.from_device(g) for g in gpus],
            num_q_heads=H,
            page_size=PAGE,
        )
        tp = tensor_parallel_latent_attention_with_rope(_layer(tp_params, q_lora_rank, w)).to(mesh)
        flat = tp_params.get_symbolic_inputs().flatten()
        values = [
            v.to(t.device.to_device())
            for v, t in zip([v for _ in gpus for v in _device_values(blocks, lookup, cache_lengths, offsets)], flat)
        ]
        tp_kv = PagedCacheValues.from_upstream(tp_params.get_symbolic_inputs().unflatten(iter(values)).inputs, mesh)
        rep = PlacementMapping(mesh, (Replicated(),))
        tp_out = tp(
            distribute(Tensor(x), rep), tp_kv, distribute(Tensor(_freqs()), rep), distribute(Tensor(offsets), rep)
        )
    assert [int(d) for d in tp_out.shape] == [5, HIDDEN] and tp_out.mapping.mesh == mesh
    assert [s.device for s in tp_out.local_shards] == gpus


def test_data_parallel_traces_with_named_token_and_batch_dims():
    """MAX traces data-parallel layers with symbolic token/batch counts inside F.lazy(): each shard gets its own
    names.
    """
    rng = np.random.default_rng(5)
    w = _weights(rng, Q_LORA)
    params = _params(2)
    mesh = _cpu_mesh(2, DP)
    sharded = PlacementMapping(mesh, (Sharded(0),))
    with F.lazy():
        layer = _layer(params, Q_LORA, w).to(mesh)
        sizes = {"total_num_pages": PAGES, "batch_size": "batch", "max_num_pages": PAGES, "steps_remaining": 2}
        values = []
        for t in params.get_symbolic_inputs().flatten():
            shape = [
                next(v for k, v in sizes.items() if d.name.endswith(k)) if isinstance(d, SymbolicDim) else int(d)
                for d in t.shape
            ]
            values.append(Tensor.zeros(shape, dtype=t.dtype))
        kv = PagedCacheValues.from_upstream(
            params.get_symbolic_inputs().unflatten(iter(values)).inputs, PlacementMapping(mesh, (Replicated(),))
        )
        x = Tensor.zeros(["tokens", HIDDEN], device=sharded)
        offsets = Tensor.zeros(["batch_plus_one"], dtype=DType.uint32, device=sharded)
        out = layer(x, kv, distribute(Tensor(_freqs()), PlacementMapping(mesh, (Replicated(),))), offsets)
    assert out.shape == x.shape and out.mapping == sharded and not out.real
    assert [str(s.shape[0]) for s in out.local_shards] == ["tokens_dp_0", "tokens_dp_1"]


# ─── errors ───────────────────────────────────────────────────────────────────


def _kwargs(**over):
    base = dict(
        num_attention_heads=H,
        num_key_value_heads=1,
        hidden_size=HIDDEN,
        kv_params=_params(),
        layer_idx=0,
        kv_lora_rank=RANK,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=V,
    )
    return {**base, **over}


def test_construction_errors_name_the_layer_and_what_is_expected():
    with pytest.raises(ValueError, match=r"LatentAttentionWithRope: invalid graph_mode 'train'"):
        LatentAttentionWithRope(**_kwargs(graph_mode="train"))
    with pytest.raises(
        ValueError, match=r"kv_params.head_dim \(22\) must be kv_lora_rank \+ qk_rope_head_dim = 32 \+ 6"
    ):
        LatentAttentionWithRope(**_kwargs(kv_lora_rank=32))
    mha = MHAKVCacheParams(DType.float32, head_dim=RANK + ROPE, num_layers=1, devices=[DeviceRef.CPU()], n_kv_heads=1)
    with pytest.raises(ValueError, match="must be an MLA cache's KVCacheParams"):
        LatentAttentionWithRope(**_kwargs(kv_params=mha))
    with pytest.raises(ValueError, match="num_attention_heads must be a positive int, got 0"):
        LatentAttentionWithRope(**_kwargs(num_attention_heads=0))
    layer = tensor_parallel_latent_attention_with_rope(LatentAttentionWithRope(**_kwargs(num_attention_heads=3)))
    with pytest.raises(ValueError, match="3 attention heads do not split evenly over the 2 devices"):
        layer.to(_cpu_mesh(2, TP))
    with pytest.raises(TypeError, match="expected a LatentAttentionWithRope"):
        tensor_parallel_latent_attention_with_rope(object())


def test_call_errors_give_shapes():
    rng = np.random.default_rng(5)
    x, blocks, lookup, cache_lengths, offsets = _step(rng)
    layer = _layer(_params(), None, _weights(rng, None))
    kv = _collection(_params(), [_device_values(blocks, lookup, cache_lengths, offsets)], _cpu_mesh(1, "x"))
    freqs, offs = Tensor(_freqs()), Tensor(offsets)
    with pytest.raises(ValueError, match=r"x must be ragged \[total_tokens, hidden_size=24\], got float32\[5, 7\]"):
        layer(Tensor(np.zeros((5, 7), np.float32)), kv, freqs, offs)
    with pytest.raises(
        ValueError, match=r"freqs_cis must be \[max_seq_len, qk_rope_head_dim=6\], got float32\[16, 4\]"
    ):
        layer(Tensor(x), kv, Tensor(_freqs()[:, :4]), offs)
    with pytest.raises(
        ValueError, match=r"input_row_offsets must be an integer \[batch \+ 1\] tensor, got float32\[3\]"
    ):
        layer(Tensor(x), kv, freqs, Tensor(offsets.astype(np.float32)))
    with pytest.raises(
        TypeError, match="kv_collection must be a max.experimental.nn.common_layers.kv_cache.PagedCacheValues"
    ):
        layer(Tensor(x), kv.for_device(0), freqs, offs)
    with pytest.raises(ValueError, match=r"from_upstream: 1 per-device records for a mesh of 2 devices"):
        PagedCacheValues.from_upstream(_params().get_symbolic_inputs().inputs, _cpu_mesh(2, "x"))
