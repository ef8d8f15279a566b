"""MoE and LoRA layers and the MoE/LoRA/sampling kernels of maxfx.nn.kernels, against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from maxfx import driver, nn
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, ShardingStrategy, TensorType
from maxfx.nn import kernels
from maxfx.nn.float8_config import Float8Config, Float8InputScaleSpec, Float8WeightScaleSpec
from maxfx.nn.float8_config import Float8ScaleGranularity as G
from maxfx.nn.float8_config import Float8ScaleOrigin as O
from tests.graph_run import run_graph

CPU = DeviceRef.CPU()
F8 = ml_dtypes.float8_e4m3fn


def silu(z):
    return z / (1 + np.exp(-z))


def run_layer(layer, *arrays, call=None):
    outs = run_graph(call or layer, *arrays, weights=layer.state_dict())
    return outs if len(outs) > 1 else outs[0]


def fill(layer, rng, scale=0.5):
    state = {}
    for k, v in layer.state_dict().items():
        dt = np.asarray(v).dtype
        state[k] = (rng.normal(size=np.shape(v)) * scale).astype(dt)
    layer.load_state_dict(state)
    return state


# ─── MoE ──────────────────────────────────────────────────────────────────


def np_moe(x, st, n_exp, k, weight_first=False, shared=False, dequant=None):
    logits = x @ st["gate.gate_score.weight"].T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    top = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    get = dequant or (lambda name: st[name])
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e in top[t]:
            w = p[t, e]
            xin = x[t] * w if weight_first else x[t]
            h = silu(xin @ get(f"experts.{e}.gate_proj.weight").T) * (xin @ get(f"experts.{e}.up_proj.weight").T)
            y = h @ get(f"experts.{e}.down_proj.weight").T
            out[t] += y if weight_first else w * y
    if shared:
        s = lambda n: st[f"shared_experts.{n}.weight"]  # noqa: E731
        out += (silu(x @ s("gate_proj").T) * (x @ s("up_proj").T)) @ s("down_proj").T
    return out


@pytest.mark.parametrize("weight_first,shared", [(False, False), (True, True)])
def test_moe_against_numpy(rng, weight_first, shared):
    moe = nn.MoE(
        [CPU],
        8,
        4,
        2,
        6,
        dtype=DType.float32,
        apply_router_weight_first=weight_first,
        has_shared_experts=shared,
        shared_experts_dim=4 if shared else 0,
    )
    st = fill(moe, rng)
    x = rng.normal(size=(5, 8)).astype(np.float32)
    np.testing.assert_allclose(run_layer(moe, x), np_moe(x, st, 4, 2, weight_first, shared), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(driver.accelerator_count() > 0, reason="virtual GPUs stand in for absent ones")
def test_moe_for_a_gpu_builds_and_lowers_for_cuda(rng, virtual_cuda):
    """MAX reads the experts' usage stats on the host: a MoE for a GPU moves them to the CPU (an op's host input)."""
    gpu = DeviceRef.GPU()
    moe = nn.MoE([gpu], 8, 4, 2, 6, dtype=DType.float32)
    fill(moe, rng)
    with Graph("moe_gpu", input_types=[TensorType(DType.float32, ["tokens", 8], gpu)]) as g:
        g.output(moe(g.inputs[0].tensor))
    compiled = InferenceSession(devices=[driver.Accelerator(0)]).compile(g)  # lowered for CUDA on this CPU machine
    assert "ragged" in compiled._graphs[0].exported.mlir_module()


def test_grouped_matmul_host_input_may_only_be_on_the_cpu():
    h, w = TensorType(DType.float32, [6, 8], DeviceRef.GPU()), TensorType(DType.float32, [3, 4, 8], DeviceRef.GPU())
    idx = TensorType(DType.uint32, [3], DeviceRef.GPU())
    starts = TensorType(DType.uint32, [4], DeviceRef.GPU())
    for stats_device, ok in ((DeviceRef.CPU(), True), (DeviceRef.GPU(), True), (DeviceRef.GPU(1), False)):
        with Graph("g", input_types=[h, w, starts, idx, TensorType(DType.uint32, [2], stats_device)]) as g:
            if ok:
                assert kernels.grouped_matmul_ragged(*[v.tensor for v in g.inputs]).device == DeviceRef.GPU()
            else:
                with pytest.raises(ValueError, match="different devices"):
                    kernels.grouped_matmul_ragged(*[v.tensor for v in g.inputs])


def test_moe_gate_projections_and_errors(rng):
    moe = nn.MoE([CPU], 8, 3, 1, 6, dtype=DType.float32)
    st = fill(moe, rng)
    x = rng.normal(size=(4, 8)).astype(np.float32)
    idx, w = run_layer(moe, x, call=moe.gate)
    logits = x @ st["gate.gate_score.weight"].T
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_array_equal(idx[:, 0], p.argmax(-1))
    np.testing.assert_allclose(w[:, 0], p.max(-1), rtol=1e-5)
    gu, down = run_layer(moe, x, call=lambda _x: (moe.gate_up_proj, moe.down_proj))
    assert gu.shape == (3, 12, 8) and down.shape == (3, 8, 6)
    np.testing.assert_array_equal(
        gu[1], np.concatenate([st["experts.1.gate_proj.weight"], st["experts.1.up_proj.weight"]])
    )
    with pytest.raises(ValueError, match="EPBatchManager"):
        nn.MoE([CPU], 8, 4, 2, 6, ep_size=2, dtype=DType.float32)
    with pytest.raises(ValueError, match="num_experts_per_token must be in"):
        nn.MoEGate([CPU], 8, 4, 5, DType.float32)
    with pytest.raises(ValueError, match="has no expert parallelism"):
        moe.ep_batch_manager
    with pytest.raises(ValueError, match=r"hidden_state must be \[tokens, 8\]"):
        run_layer(moe, np.zeros((2, 3), np.float32))


def test_moe_tensor_parallel_shards_sum_to_full(rng):
    moe = nn.MoE([CPU], 8, 4, 2, 6, dtype=DType.float32, has_shared_experts=True, shared_experts_dim=4)
    fill(moe, rng)
    moe.sharding_strategy = ShardingStrategy.rowwise(2)
    shards = moe.shard([CPU, CPU])
    assert shards[0].moe_dim == 3
    x = rng.normal(size=(5, 8)).astype(np.float32)
    full, s0, s1 = run_layer(moe, x, call=lambda v: (moe(v), shards[0](v), shards[1](v)))
    np.testing.assert_allclose(s0 + s1, full, rtol=1e-4, atol=1e-5)


def test_moe_fp8_against_numpy(rng):
    cfg = Float8Config(
        Float8InputScaleSpec(G.COLWISE, O.DYNAMIC, DType.float32), Float8WeightScaleSpec(G.ROWWISE, DType.float32)
    )
    moe = nn.MoEFp8([CPU], 8, 4, 2, 6, dtype=DType.float32, float8_config=cfg)
    st = {}
    for k, v in moe.state_dict().items():
        shape = np.shape(v)
        if k.endswith("weight_scale"):
            st[k] = rng.uniform(0.05, 0.1, size=shape).astype(np.float32)
        elif k.startswith("experts"):
            st[k] = rng.normal(size=shape).astype(F8)
        else:
            st[k] = rng.normal(size=shape).astype(np.float32)
    moe.load_state_dict(st)
    x = rng.normal(size=(5, 8)).astype(np.float32)
    deq = lambda n: st[n].astype(np.float32) * st[n + "_scale"]  # noqa: E731
    ref = np_moe(x, st, 4, 2, dequant=deq)
    got = run_layer(moe, x)
    assert np.abs(got - ref).max() < 0.08 * np.abs(ref).max()  # activations go through float8
    scales = run_layer(moe, x, call=lambda _x: moe.gate_up_proj_scales)
    np.testing.assert_array_equal(
        scales[2], np.concatenate([st["experts.2.gate_proj.weight_scale"], st["experts.2.up_proj.weight_scale"]])
    )
    with pytest.raises(ValueError, match="float8_config is required"):
        nn.MoEFp8([CPU], 8, 4, 2, 6, dtype=DType.float32)


# ─── LoRA ─────────────────────────────────────────────────────────────────


def test_linear_lora_against_numpy(rng):
    lin = nn.LinearLoRA(
        6, 5, max_num_loras=3, max_lora_rank=4, dtype=DType.float32, device=CPU, has_bias=True, has_lora_bias=True
    )
    st = fill(lin, rng)
    x = rng.normal(size=(7, 6)).astype(np.float32)
    ids = np.array([1, -1, 2], np.int32)
    ranks = np.array([2, 0, 4], np.int32)
    offsets = np.array([0, 3, 4, 6], np.uint32)

    def call(xv, i, r, o):
        lin.set_lora_batch_info(i, r, o)
        return lin.apply_lora(xv), lin(xv)

    with_lora, base = run_layer(lin, x, ids, ranks, offsets, call=call)
    ref_base = x @ st["weight"].T + st["bias"]
    np.testing.assert_allclose(base, ref_base, rtol=1e-5, atol=1e-5)
    ref = ref_base.copy()
    for g in range(3):
        if ids[g] < 0 or ranks[g] == 0:
            continue
        a, b = st["lora_A.weight"][ids[g]][: ranks[g]], st["lora_B.weight"][ids[g]][:, : ranks[g]]
        rows = slice(offsets[g], offsets[g + 1])
        ref[rows] += (x[rows] @ a.T) @ b.T + st["lora.bias"][ids[g]]
    np.testing.assert_allclose(with_lora, ref, rtol=1e-4, atol=1e-5)
    assert isinstance(lin, nn.SupportsLoRA)


def test_lora_errors():
    lin = nn.LinearLoRA(6, 5, 3, 4, DType.float32, CPU)
    with Graph("e", input_types=[TensorType(DType.float32, [2, 6])]) as g:
        with pytest.raises(ValueError, match="'set_lora_batch_info' was not called"):
            lin.apply_lora(g.inputs[0].tensor)
    with pytest.raises(ValueError, match="max_num_loras and max_lora_rank must be positive"):
        nn.LinearLoRA(6, 5, 0, 4, DType.float32, CPU)


# ─── kernels: MoE, LoRA, sampling, misc ───────────────────────────────────


def test_moe_and_lora_kernels(rng):
    ids = np.array([2, 0, 2, 1], np.uint32)
    order, starts, restore, eids, stats = run_graph(lambda t: kernels.moe_create_indices(t, 3), ids)
    np.testing.assert_array_equal(order, [1, 3, 0, 2])
    np.testing.assert_array_equal(starts, [0, 1, 2, 4])
    np.testing.assert_array_equal(restore, [2, 0, 3, 1])
    np.testing.assert_array_equal(eids, [0, 1, 2])
    np.testing.assert_array_equal(stats, [2, 3])
    h = rng.normal(size=(4, 5)).astype(np.float32)
    w = rng.normal(size=(3, 2, 5)).astype(np.float32)
    (y,) = run_graph(kernels.grouped_matmul_ragged, h, w, starts, eids, stats)
    np.testing.assert_allclose(
        y, np.concatenate([h[:1] @ w[0].T, h[1:2] @ w[1].T, h[2:] @ w[2].T]), rtol=1e-5, atol=1e-5
    )
    lora = rng.normal(size=(2, 3, 5)).astype(np.float32)
    (v,) = run_graph(
        lambda *a: kernels.sgmv_kernel(*a, 4),
        h,
        lora,
        np.array([1, 0], np.int32),
        np.array([3, 3], np.int32),
        np.array([0, 1, 4], np.uint32),
    )
    np.testing.assert_allclose(v, np.concatenate([h[:1] @ lora[1].T, h[1:] @ lora[0].T]), rtol=1e-5, atol=1e-5)
    with Graph(
        "e",
        input_types=[
            TensorType(DType.float32, [4, 5]),
            TensorType(DType.float32, [2, 2, 5]),
            TensorType(DType.uint32, [3]),
        ],
    ) as g:
        x, wt, u = (i.tensor for i in g.inputs)
        with pytest.raises(ValueError, match=r"grouped_matmul_ragged: expected weight of shape \[num_experts=3"):
            kernels.grouped_matmul_ragged(x, wt, ops_constant(np.zeros(4, np.uint32)), u, u)
        with pytest.raises(ValueError, match="sgmv_kernel: max_lora_seq_len must be a positive int"):
            kernels.sgmv_kernel(x, wt, u, u, u, 0)
        with pytest.raises(TypeError, match="num_local_experts must be an int"):
            kernels.moe_create_indices(u, 2.5)


def ops_constant(arr):
    from maxfx.graph import ops  # noqa: PLC0415

    return ops.constant(arr, DType.from_numpy(arr.dtype), CPU)


def test_sampling_kernels(rng):
    logits = rng.normal(size=(3, 9)).astype(np.float32)
    (tok,) = run_graph(lambda l: kernels.topk_fused_sampling(l, 1), logits)
    np.testing.assert_array_equal(tok, logits.argmax(-1)[:, None])
    assert tok.dtype == np.int64 and tok.shape == (3, 1)
    k = np.array([1, 3, 2], np.int64)
    (tok,) = run_graph(lambda l, kk: kernels.topk_fused_sampling(l, kk, max_k=3, temperature=2.0, seed=5), logits, k)
    ranks = np.argsort(np.argsort(-logits, axis=-1), axis=-1)
    assert all(ranks[b, tok[b, 0]] < k[b] for b in range(3))
    assert tok[0, 0] == logits[0].argmax()
    for bad, msg in (
        ({"top_k": 0}, "top_k to be a positive int"),
        ({"top_k": 2, "top_p": 1.5}, r"top_p to be in \(0, 1\]"),
        ({"top_k": 2, "temperature": -1.0}, "temperature to be >= 0"),
    ):
        with Graph("e", input_types=[TensorType(DType.float32, [3, 9])]) as g, pytest.raises(ValueError, match=msg):
            kernels.topk_fused_sampling(g.inputs[0].tensor, **bad)
    with (
        Graph("e", input_types=[TensorType(DType.float32, [3, 9]), TensorType(DType.int64, [3])]) as g,
        pytest.raises(ValueError, match="max_k is required"),
    ):
        kernels.topk_fused_sampling(g.inputs[0].tensor, g.inputs[1].tensor)

    fd = np.array([[2, 1], [-1, 0], [5, 2], [-1, 0]], np.int32)
    fo = np.array([0, 2, 4], np.uint32)
    lg = rng.normal(size=(2, 9)).astype(np.float32)
    types = [
        BufferType(DType.float32, [2, 9]),
        TensorType(DType.int32, [4, 2]),
        TensorType(DType.uint32, [3]),
        BufferType(DType.int32, [4, 2]),
        TensorType(DType.int64, [2]),
    ]

    def step(lbuf, fdata, foff, fbuf, toks):
        kernels.apply_penalties_to_logits(
            lbuf, fdata, foff, frequency_penalty=0.5, presence_penalty=0.1, repetition_penalty=2.0
        )
        kernels.update_frequency_data(fbuf, foff, toks)
        return fdata  # outputs are unused; buffers are written in place

    from maxfx.driver import Tensor  # noqa: PLC0415

    lbuf, fbuf = Tensor.from_numpy(lg.copy()), Tensor.from_numpy(fd.copy())
    with Graph("pen", input_types=types) as g:
        vals = [v.buffer if isinstance(t, BufferType) else v.tensor for v, t in zip(g.inputs, types)]
        step(*vals)
        g.output(vals[1])
    InferenceSession().load(g).execute(lbuf, fd, fo, fbuf, np.array([7, 5], np.int64))
    ref = lg.copy()
    for b, (tok_id, cnt) in ((0, (2, 1)), (1, (5, 2))):
        v = ref[b, tok_id]
        ref[b, tok_id] = (v / 2 if v > 0 else v * 2) - 0.5 * cnt - 0.1
    np.testing.assert_allclose(lbuf.to_numpy(), ref, rtol=1e-6)
    np.testing.assert_array_equal(fbuf.to_numpy(), [[2, 1], [7, 1], [5, 3], [-1, 0]])


def test_misc_kernels(rng):
    a, b0, b1 = (
        rng.normal(size=(3, 4)).astype(np.float32),
        rng.normal(size=(5, 4)).astype(np.float32),
        rng.normal(size=(5, 4)).astype(np.float32),
    )
    (y,) = run_graph(kernels.swish_glu, a, b0, b1)
    np.testing.assert_allclose(y, silu(a @ b0.T) * (a @ b1.T), rtol=1e-5, atol=1e-6)
    m, off = run_graph(
        kernels.merge_ragged_tensors,
        np.arange(1, 7, dtype=np.float32),
        np.array([0, 2, 6], np.uint32),
        np.arange(7, 11, dtype=np.float32),
        np.array([0, 3, 4], np.uint32),
    )
    np.testing.assert_array_equal(m, [1, 2, 7, 8, 9, 3, 4, 5, 6, 10])
    np.testing.assert_array_equal(off, [0, 5, 10])
    from maxfx.driver import Tensor  # noqa: PLC0415

    data = Tensor.from_numpy(np.zeros((3, 4), np.float32))
    types = [BufferType(DType.float32, [3, 4]), TensorType(DType.int32, [2, 2])]
    with Graph("sc", input_types=types) as g:
        kernels.scatter_set_constant(g.inputs[0].buffer, g.inputs[1].tensor, -7.0)
        g.output(g.inputs[1].tensor)
    InferenceSession().load(g).execute(data, np.array([[0, 1], [2, 3]], np.int32))
    ref = np.zeros((3, 4), np.float32)
    ref[0, 1] = ref[2, 3] = -7.0
    np.testing.assert_array_equal(data.to_numpy(), ref)
    with (
        Graph("e", input_types=[TensorType(DType.float32, [3, 4])]) as g,
        pytest.raises(ValueError, match="swish_glu: b0 and b1 must both be"),
    ):
        x = g.inputs[0].tensor
        kernels.swish_glu(x, x, x.T)
