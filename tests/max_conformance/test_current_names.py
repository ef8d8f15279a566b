"""Names of MAX's current Python API (issue 35): each imports from MAX's module path and behaves as MAX's source says.

Checked against numpy or the behaviour MAX's source documents (modular/modular,
``max/python/max/...``); where maxfx departs (a MAX bug, or no Mojo), the test
pins maxfx's documented behaviour (docs/pages/max_compatibility.md).
"""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest

from maxfx.driver import CPU, Buffer
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.experimental.tensor import Tensor
from maxfx.graph import DeviceRef, Graph, TensorType, Weight, ops

CPU_REF = DeviceRef.CPU()


# ─── max.experimental.tensor ───────────────────────────────────────────────


def test_nested_array_and_number_are_max_literal_aliases():
    from maxfx.experimental.tensor import NestedArray, Number
    from maxfx.graph._literal import literal_shape

    assert "NestedArray" in __import__("maxfx.experimental.tensor", fromlist=["__all__"]).__all__
    value: NestedArray = [[1.0, 2.0], [3.0, 4.0]]
    scalar: Number = np.float32(2.0)
    assert literal_shape(value) == (2, 2) and literal_shape(scalar) == ()
    with pytest.raises(ValueError, match="rectangular"):
        literal_shape([[1.0, 2.0], [3.0]])


# ─── max.experimental.nn ───────────────────────────────────────────────────


def _linear(n_in: int = 4, n_out: int = 3):
    from maxfx.experimental.nn import Linear

    return Linear(n_in, n_out)


def test_compiled_model_paths_agree_with_eager():
    from maxfx.experimental.nn.module import CompiledModel

    layer = _linear()
    compiled = layer.compile(TensorType(DType.float32, ["batch", 4], device=layer.device))
    assert isinstance(compiled, CompiledModel)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    want = x @ layer.weight.to_numpy().T + layer.bias.to_numpy()
    np.testing.assert_allclose(compiled(Tensor(x)).to_numpy(), want, rtol=1e-5, atol=1e-5)
    [raw] = compiled.execute_raw(x)
    assert isinstance(raw, Buffer)
    np.testing.assert_allclose(raw.to_numpy(), want, rtol=1e-5, atol=1e-5)
    assert compiled.engine_model is compiled.model and compiled.signal_buffers == []
    assert compiled.graph is not None
    with pytest.raises(TypeError, match="keyword arguments"):
        compiled(x=Tensor(x))


def test_pinned_device_tensor_stays_put_when_the_module_moves():
    from maxfx.experimental.nn import Module, PinnedDeviceTensor, module_dataclass
    from maxfx.experimental.sharding import DeviceMesh, DistributedTensor

    @module_dataclass
    class Scaled(Module):
        weight: Tensor
        scale: PinnedDeviceTensor

        def forward(self, x: Tensor) -> Tensor:
            return x @ self.weight.T * self.scale

    m = Scaled(Tensor.ones([2, 2]), Tensor(2.0))
    mesh = DeviceMesh((CPU(),), (1,), ("tp",))
    assert m.to(mesh) is m
    assert isinstance(m.weight, DistributedTensor)  # moved onto the mesh
    assert not isinstance(m.scale, DistributedTensor)  # pinned: left as it was
    assert m.device == CPU()
    with pytest.raises(TypeError, match="Device, DeviceMesh, or DeviceMapping"):
        m.to("gpu")


def test_subgraphable_shares_one_subgraph_and_matches_eager():
    from maxfx.experimental.nn import Linear, Module, Sequential, module_dataclass, subgraphable

    net = Sequential(*[subgraphable(Linear(4, 4)) for _ in range(3)])
    compiled = net.compile(TensorType(DType.float32, ["batch", 4], device=net.device))
    assert len(compiled.graph._subgraphs) == 1
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    np.testing.assert_allclose(compiled(x).to_numpy(), net(x).to_numpy(), rtol=1e-5, atol=1e-5)

    @subgraphable(name="block")
    @module_dataclass
    class Block(Module):
        w: Tensor

        def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
            return x * self.w, x + self.w

    @module_dataclass
    class Two(Module):
        a: Block
        b: Block

        def forward(self, x: Tensor) -> Tensor:
            p, q = self.a(x)
            r, s = self.b(p + q)
            return r - s

    two = Two(Block(Tensor([2.0, 3.0])), Block(Tensor([5.0, 7.0])))
    c2 = two.compile(TensorType(DType.float32, [2], device=CPU()))
    assert len(c2.graph._subgraphs) == 1
    np.testing.assert_allclose(c2(Tensor([1.0, 1.0])).to_numpy(), two(Tensor([1.0, 1.0])).to_numpy())
    with pytest.raises(TypeError, match="Module subclass or instance"):
        subgraphable(object())


def test_replace_module_swaps_a_descendant():
    from maxfx.experimental.nn import Linear, Sequential, replace_module

    net = Sequential(Linear(4, 4), Sequential(Linear(4, 4), Linear(4, 2)))
    old = replace_module(net, "1.1", Linear(4, 3))
    assert list(old.weight.shape) == [2, 4] and [n for n, _ in net.parameters][-2:] == ["1.1.weight", "1.1.bias"]
    assert net(Tensor.ones([1, 4])).shape == [1, 3]
    with pytest.raises(KeyError, match="no descendant"):
        replace_module(net, "9", Linear(1, 1))


def test_yarn_positional_embedding_matches_the_paper():
    from maxfx.experimental.nn.rope import RotaryEmbedding, yarn

    dim, base, long, short = 64, 10000.0, 512, 128
    s = long / short
    inv = base ** (-np.arange(0, dim, 2) / dim)

    def index(rotations):
        return (dim / 2) * math.log(short / (2 * math.pi * rotations), base)

    lo, hi = max(0, math.floor(index(32))), min(dim - 1, math.ceil(index(1)))
    mask = np.clip((np.arange(dim // 2) - lo) / (hi - lo), 0, 1)
    freqs = (1 - mask) * inv + mask * inv / s
    angles = np.outer(np.arange(long), freqs)
    want = np.stack([np.cos(angles), np.sin(angles)], -1) * (0.1 * math.log(s) + 1)
    for alpha, beta in ((1, 32), (32, 1)):  # MAX's documented order, and the one MAX's code accepts
        table = yarn.positional_embedding(dim, base, long, short, alpha=alpha, beta=beta)
        assert table.dtype == DType.float32 and list(table.shape) == [long, dim // 2, 2]
        np.testing.assert_allclose(table.to_numpy(), want, atol=1e-6)
    assert RotaryEmbedding(table).max_sequence_length == long
    assert yarn.linear_ramp_mask(1, 3, 5).to_numpy().tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="start_idx"):
        yarn.linear_ramp_mask(3, 3, 5)


# ─── max.nn, max.nn.kernels ────────────────────────────────────────────────


def test_identity_returns_its_input():
    from maxfx.nn import Identity, Module
    from maxfx.nn.identity import Identity as FromModule

    assert FromModule is Identity and issubclass(Identity, Module)
    with Graph("id", input_types=[TensorType(DType.float32, [3], CPU_REF)]) as g:
        x = g.inputs[0].tensor
        assert Identity()(x) is x
        g.output(Identity()(x))
    np.testing.assert_array_equal(
        InferenceSession().load(g).execute(np.arange(3, dtype=np.float32))[0].to_numpy(), [0, 1, 2]
    )


def _rope_reference(x, offsets, start, freqs, interleaved=True):
    out = x.astype(np.float64).copy()
    rope_dim = freqs.shape[1]
    for b in range(len(offsets) - 1):
        for i, row in enumerate(range(offsets[b], offsets[b + 1])):
            cos, sin = freqs[start[b] + i, 0::2], freqs[start[b] + i, 1::2]
            h = x[row, :, -rope_dim:].astype(np.float64)
            if interleaved:
                re, im = h[..., 0::2], h[..., 1::2]
                rot = np.stack([re * cos - im * sin, re * sin + im * cos], -1).reshape(h.shape)
            else:
                re, im = h[..., : rope_dim // 2], h[..., rope_dim // 2 :]
                rot = np.concatenate([re * cos - im * sin, re * sin + im * cos], -1)
            out[row, :, -rope_dim:] = rot
    return out


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rope_dim", [8, 4])
def test_rope_ragged_in_max_argument_order(interleaved, rope_dim):
    from maxfx.nn.kernels import rope_ragged

    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 2, 8)).astype(np.float32)
    offsets, start = np.array([0, 2, 5], np.uint32), np.array([3, 0], np.uint32)
    angles = np.outer(np.arange(10), 10000.0 ** (-np.arange(0, rope_dim, 2) / rope_dim))
    freqs = np.stack([np.cos(angles), np.sin(angles)], -1).reshape(10, rope_dim).astype(np.float32)
    got = rope_ragged(Tensor(x), Tensor(offsets), Tensor(start), Tensor(freqs), interleaved=interleaved).to_numpy()
    np.testing.assert_allclose(got, _rope_reference(x, offsets, start, freqs, interleaved), atol=1e-5)
    if rope_dim < 8:  # rope_first rotates the leading columns instead
        first = rope_ragged(
            Tensor(x), Tensor(offsets), Tensor(start), Tensor(freqs), interleaved=interleaved, rope_first=True
        ).to_numpy()
        flipped = _rope_reference(
            np.concatenate([x[..., rope_dim:], x[..., :rope_dim]], -1), offsets, start, freqs, interleaved
        )
        np.testing.assert_allclose(
            first, np.concatenate([flipped[..., -rope_dim:], flipped[..., :-rope_dim]], -1), atol=1e-5
        )
    half = rope_ragged(Tensor(x), Tensor(offsets), Tensor(start), Tensor(freqs), output_dtype=DType.float16)
    assert half.dtype == DType.float16
    with pytest.raises(ValueError, match="input_row_offsets to have dtype uint32"):
        rope_ragged(Tensor(x), Tensor(offsets.astype(np.int32)), Tensor(start), Tensor(freqs))


@pytest.mark.parametrize(
    "data,updates,indices,want",
    [
        ([1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 15.0, 20.0], [[1], [-999], [3]], [1.0, 10.0, 3.0, 20.0, 5.0]),
        ([1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 15.0, 20.0], [[-4], [999], [-2]], [1.0, 10.0, 3.0, 20.0, 5.0]),
        (
            [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
            [[9.0, 9.0], [7.0, 7.0]],
            [[2], [-4]],
            [[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]],
        ),
        ([[1.0, 2.0], [3.0, 4.0]], [8.0, 9.0], [[1, 0], [0, 2]], [[1.0, 2.0], [8.0, 4.0]]),
    ],
)
def test_scatter_nd_skip_oob_indices(data, updates, indices, want):
    from maxfx.nn.kernels import scatter_nd_skip_oob_indices

    args = np.array(data, np.float32), np.array(updates, np.float32), np.array(indices, np.int64)
    np.testing.assert_array_equal(scatter_nd_skip_oob_indices(*map(Tensor, args)).to_numpy(), want)
    types = [
        TensorType(DType.float32, ["n", *np.shape(data)[1:]], CPU_REF),
        TensorType(DType.float32, ["q", *np.shape(updates)[1:]], CPU_REF),
        TensorType(DType.int64, ["q", len(indices[0])], CPU_REF),
    ]
    with Graph("skip_oob", input_types=types) as g:
        g.output(scatter_nd_skip_oob_indices(*g.inputs))
    np.testing.assert_array_equal(InferenceSession().load(g).execute(*args)[0].to_numpy(), want)


@pytest.mark.parametrize("shape", [(3, 40), (2, 3, 40), (2, 1, 64)])
def test_apply_packed_bitmask_against_numpy(shape):
    from maxfx.nn.kernels import apply_packed_bitmask

    rng = np.random.default_rng(0)
    vocab, words = shape[-1], -(-shape[-1] // 32)
    logits = rng.standard_normal(shape).astype(np.float32)
    packed = rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, size=(*shape[:-1], words), dtype=np.int32)
    keep = (
        ((packed[..., None].astype(np.int64) >> np.arange(32)) & 1).reshape(*shape[:-1], -1)[..., :vocab].astype(bool)
    )
    want = np.where(keep, logits, np.float32(-7.0))
    np.testing.assert_array_equal(apply_packed_bitmask(Tensor(logits), Tensor(packed), fill_val=-7.0).to_numpy(), want)
    types = [
        TensorType(DType.float32, [*shape[:-1], "vocab"], CPU_REF),
        TensorType(DType.int32, [*shape[:-1], "words"], CPU_REF),
    ]
    with Graph("bitmask", input_types=types) as g:
        g.output(apply_packed_bitmask(*g.inputs, fill_val=-7.0))
    np.testing.assert_array_equal(InferenceSession().load(g).execute(logits, packed)[0].to_numpy(), want)
    assert (
        apply_packed_bitmask(Tensor(logits), Tensor(np.zeros_like(packed))).to_numpy().max() == -10000.0
    )  # MAX's sampler fill
    with pytest.raises(ValueError, match="ceil"):
        apply_packed_bitmask(
            Tensor(logits), Tensor(packed[..., :1]) if words > 1 else Tensor(np.zeros((*shape[:-1], 3), np.int32))
        )


# ─── max.dtype ─────────────────────────────────────────────────────────────


def test_finfo_matches_ieee_and_ocp_limits():
    from maxfx.dtype import finfo

    bf16 = finfo(DType.bfloat16)
    assert (bf16.bits, bf16.eps, bf16.max, bf16.min, bf16.tiny) == (
        16,
        2**-7,
        (2 - 2**-7) * 2**127,
        -(2 - 2**-7) * 2**127,
        2**-126,
    )
    assert bf16.smallest_normal == bf16.tiny and bf16.dtype is DType.bfloat16
    assert (finfo(DType.float8_e4m3fn).max, finfo(DType.float8_e4m3fnuz).tiny, finfo(DType.float8_e5m2).max) == (
        448.0,
        2**-7,
        57344.0,
    )
    e8m0 = finfo(DType.float8_e8m0fnu)
    assert (e8m0.eps, e8m0.max, e8m0.min) == (1.0, 2.0**127, 2.0**-127)  # no sign bit: min is the smallest positive
    assert (finfo(DType.float4_e2m1fn).max, finfo(DType.float4_e2m1fn).tiny) == (6.0, 1.0)
    for dt in (DType.float16, DType.float32, DType.float64):
        info = np.finfo(dt.to_numpy())
        assert (finfo(dt).eps, finfo(dt).max, finfo(dt).tiny) == (float(info.eps), float(info.max), float(info.tiny))
    assert DType.finfo is finfo and "finfo(dtype=bfloat16, bits=16" in repr(bf16)
    with pytest.raises(TypeError, match="floating-point"):
        finfo(DType.int32)
    assert ml_dtypes.finfo(ml_dtypes.bfloat16).eps == bf16.eps


# ─── max.nn.kv_cache ───────────────────────────────────────────────────────


def _mha(layers: int = 2, **kw):
    from maxfx.nn.kv_cache import MHAKVCacheParams

    return MHAKVCacheParams(
        kw.pop("dtype", DType.float32),
        head_dim=kw.pop("head_dim", 8),
        num_layers=layers,
        devices=[CPU_REF],
        n_kv_heads=2,
        page_size=16,
        **kw,
    )


def test_kv_cache_memory_estimation():
    from maxfx.nn.kv_cache import compute_max_seq_len_fitting_in_cache, compute_num_device_blocks, estimated_memory_size

    p = _mha()
    assert p.shape_per_block == [2, 2, 16, 2, 8] and p.bytes_per_block == 2 * 2 * 16 * 2 * 8 * 4
    # 4 requests of 64 tokens need 4 pages each: 16 pages, well inside 1 MiB
    assert compute_num_device_blocks(p, 1 << 20, max_batch_size=4, max_seq_len=64) == 16
    assert estimated_memory_size(p, 1 << 20, max_batch_size=4, max_seq_len=64) == 16 * p.bytes_per_block
    assert compute_num_device_blocks(p, 1 << 20, max_batch_size=4, max_seq_len=64, include_null_block=True) == 17
    assert compute_max_seq_len_fitting_in_cache(p, 10 * p.bytes_per_block) == 10 * 16
    with pytest.raises(RuntimeError, match="even a single page"):
        compute_num_device_blocks(p, p.bytes_per_block - 1, 1, 16)
    with pytest.raises(RuntimeError, match="max sequence length"):
        compute_num_device_blocks(p, 2 * p.bytes_per_block, 1, 64, require_max_seq_len_fits=True)


def test_kv_cache_quantization_config_and_buffers():
    from maxfx.nn.kv_cache import KVCacheBuffer, KVCacheQuantizationConfig

    q = _mha(1, dtype=DType.float8_e4m3fn, head_dim=128, kvcache_quant_config=KVCacheQuantizationConfig())
    assert q.quantized_kv_cache and q.kv_cache_scale_dtype == DType.float32
    assert q.shape_per_scale_block == [2, 1, 16, 2, 1]
    assert q.bytes_per_block == 2 * 16 * 2 * 128 * 1 + 2 * 16 * 2 * 1 * 4
    [buf] = q.allocate_buffers(total_num_pages=3)
    assert isinstance(buf, KVCacheBuffer) and buf.total_num_pages == 3
    assert [b.shape for b in buf.all_buffers] == [(3, 2, 1, 16, 2, 128), (3, 2, 1, 16, 2, 1)]
    assert not buf.values[0].to_numpy().astype(np.float32).any()
    hash(q)  # layers keep cache params as static jit data
    with pytest.raises(ValueError, match="granularity"):
        _mha(1, dtype=DType.float8_e4m3fn, head_dim=96, kvcache_quant_config=KVCacheQuantizationConfig())
    with pytest.raises(ValueError, match="same shape"):
        KVCacheBuffer(
            replicates_kv_across_tp=False,
            values=[Buffer.zeros((2, 3), DType.float32), Buffer.zeros((2, 4), DType.float32)],
        )
    with pytest.raises(ValueError, match="at least 2 TP shards"):
        KVCacheBuffer(replicates_kv_across_tp=True, values=[Buffer.zeros((2, 3), DType.float32)])


def test_multi_kv_cache_params_is_a_tree_over_one_pool():
    from maxfx.nn.kv_cache import KVCacheLeafInputs, MultiKVCacheBuffer, MultiKVCacheParams

    target, draft = _mha(4), _mha(1)
    tree = MultiKVCacheParams.from_params({"target": target, "draft": draft})
    assert tree.bytes_per_block == target.bytes_per_block + draft.bytes_per_block
    assert tree.page_size == 16 and tree.n_devices == 1 and tree.tensor_parallel_degree == 1
    flat = tree.flattened_kv_inputs()
    assert len(flat) == len(target.flattened_kv_inputs()) + len(draft.flattened_kv_inputs())
    assert [str(flat[0].shape[0]), str(flat[len(flat) // 2].shape[0])] == [
        "target_total_num_pages",
        "draft_total_num_pages",
    ]
    per_child = tree.unflatten_basic_kv_tree(iter(range(len(flat))))
    assert [len(c) for c in per_child] == [1, 1] and per_child[1][0].kv_blocks == len(flat) // 2
    assert isinstance(tree.get_symbolic_inputs().children["target"], KVCacheLeafInputs)
    [bufs] = tree.allocate_buffers(2)
    assert isinstance(bufs, MultiKVCacheBuffer) and bufs.total_num_pages == 2 and len(bufs.all_buffers) == 2
    other = MultiKVCacheParams.from_params({"a": _mha(1)})
    assert (
        MultiKVCacheParams.from_params({"tree": tree, "more": _mha(1)}).bytes_per_block
        == tree.bytes_per_block + other.bytes_per_block
    )
    with pytest.raises(ValueError, match="at least one"):
        MultiKVCacheParams.from_params({})
    with pytest.raises(ValueError, match="same page_size"):
        from maxfx.nn.kv_cache import MHAKVCacheParams

        MultiKVCacheParams.from_params(
            {
                "a": target,
                "b": MHAKVCacheParams(
                    DType.float32, head_dim=8, num_layers=1, devices=[CPU_REF], n_kv_heads=2, page_size=32
                ),
            }
        )


def test_mha_flattened_kv_inputs_is_the_flattened_symbolic_inputs():
    p = _mha()
    assert p.flattened_kv_inputs() == p.get_symbolic_inputs().flatten()
    assert type(p.flattened_kv_inputs()[0]).__name__ == "BufferType"


def test_attn_keys_pack_max_dispatch_buffers():
    from maxfx.nn.kv_cache import AttnKey, MHAAttnKey, MLAAttnKey, MultiAttnKey, build_max_lengths_tensors
    from maxfx.nn.kv_cache.utils import AttnKeyInterface

    mha = MHAAttnKey(batch_size=2, max_prompt_length=5, num_partitions=1)
    assert isinstance(mha, AttnKey) and isinstance(mha, AttnKeyInterface)
    assert mha.pack_into_buffer(CPU(), 40).to_numpy().tolist() == [2, 5, 1, 40]
    assert MLAAttnKey(2, 5, 4).pack_into_buffer(CPU(), 40).to_numpy().tolist() == [2, 5, 4]
    tree = MultiAttnKey.from_dict({"target": mha, "draft": MHAAttnKey(2, 1, 1)})
    assert hash(tree) == hash(MultiAttnKey.from_dict({"target": mha, "draft": MHAAttnKey(2, 1, 1)}))
    assert [b.to_numpy().tolist() for b in build_max_lengths_tensors(5, 40)] == [[5], [40]]


def test_data_parallelism_utils():
    from maxfx.nn.kv_cache.data_parallelism_utils import split_input_row_offsets, split_into_groups

    assert split_into_groups([0, 1, 2, 3, 4, 5, 6, 7], 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split_into_groups([0, 1, 2, 3, 4, 5, 6, 7], 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    offsets = Tensor(np.array([0, 3, 5, 9, 10], np.uint32))
    assert [t.to_numpy().tolist() for t in split_input_row_offsets(2, offsets, [0, 2, 4])] == [[0, 3, 5], [0, 4, 5]]
    with Graph("dp", input_types=[TensorType(DType.uint32, [5], CPU_REF)]) as g:  # MAX's graph form, static splits
        g.output(*split_input_row_offsets(2, g.inputs[0], np.array([0, 1, 4])))
    outs = InferenceSession().load(g).execute(np.array([0, 3, 5, 9, 10], np.uint32))
    assert [o.to_numpy().tolist() for o in outs] == [[0, 3], [0, 2, 6, 7]]


# ─── module paths ──────────────────────────────────────────────────────────


def test_max_module_paths():
    from maxfx.driver import DevicePinnedBuffer
    from maxfx.driver.buffer import Buffer as B
    from maxfx.driver.buffer import DevicePinnedBuffer as P
    from maxfx.graph.weights import WeightData, Weights
    from maxfx.graph.weights.weights import WeightData as WD
    from maxfx.graph.weights.weights import Weights as W

    assert (B, P, WD, W) == (Buffer, DevicePinnedBuffer, WeightData, Weights)


def test_buffer_utils_cast_on_device():
    from maxfx.graph.buffer_utils import cast_dlpack_to, cast_tensor_to, cast_tensors_to

    x = np.array([[1.5, -2.25], [3.0, 1e-3]], np.float32)
    b = cast_tensor_to(Buffer.from_numpy(x), DType.bfloat16)
    assert b.dtype == DType.bfloat16 and b.shape == (2, 2)
    np.testing.assert_array_equal(b.to_numpy(), x.astype(ml_dtypes.bfloat16))
    same = Buffer.from_numpy(x)
    assert cast_tensor_to(same, DType.float32) is same
    assert cast_dlpack_to(np.array([1, 2], np.int32), DType.int32, DType.float16, CPU()).to_numpy().tolist() == [
        1.0,
        2.0,
    ]
    assert [t.dtype for t in cast_tensors_to([same, same], DType.float64)] == [DType.float64] * 2 and cast_tensors_to(
        None, DType.float64
    ) == []


# ─── Graph.copy, Model.kernel_summaries, CUSTOM_OPS_PATH ────────────────────


def test_graph_copy_is_independent():
    with Graph("scale", input_types=[TensorType(DType.float32, [2], CPU_REF)]) as g:
        w = g.add_weight(Weight("w", DType.float32, [2], CPU_REF))
        y = g.inputs[0] * w
    twin = g.copy("scale_relu")
    with twin:
        twin.output(ops.relu(twin.inputs[0] * twin._weight_values["w"]))
    with g:
        g.output(y + 1)
    session, x, weights = InferenceSession(), np.array([1.0, -2.0], np.float32), {"w": np.array([3.0, 4.0], np.float32)}
    np.testing.assert_array_equal(session.load(g, weights_registry=weights).execute(x)[0].to_numpy(), [4.0, -7.0])
    np.testing.assert_array_equal(session.load(twin, weights_registry=weights).execute(x)[0].to_numpy(), [3.0, 0.0])
    assert twin.name == "scale_relu" and twin.module is not g.module and list(twin.weights()) == ["w"]


def test_model_kernel_summaries_name_the_fused_kernels():
    with Graph("fused", input_types=[TensorType(DType.float32, [4, 8], CPU_REF)]) as g:
        g.output(ops.exp(g.inputs[0]) * 2 + 1)
    summaries = InferenceSession().load(g).kernel_summaries
    assert (
        len(summaries) == 1
        and summaries[0].startswith("Loop(")
        and "exponential" in summaries[0]
        and "add" in summaries[0]
    )

    with Graph(
        "sym", input_types=[TensorType(DType.float32, ["b", 8], CPU_REF), TensorType(DType.float32, [8, 8], CPU_REF)]
    ) as h:
        h.output(ops.softmax(h.inputs[0] @ h.inputs[1]))
    model = InferenceSession().load(h)
    with pytest.raises(RuntimeError, match="symbolic dims \\['b'\\]"):
        model.kernel_summaries
    model.execute(np.ones((3, 8), np.float32), np.ones((8, 8), np.float32))
    kernels = model.kernel_summaries
    assert any("dot" in k for k in kernels) and any("exponential" in k for k in kernels)


def test_custom_ops_path_loads_python_ops_and_names_mojo_libraries(tmp_path, monkeypatch):
    from lowering.ops.custom import CustomOpNotFoundError

    py, mojo = tmp_path / "py_ops", tmp_path / "mojo_ops"
    py.mkdir()
    mojo.mkdir()
    (py / "ops.py").write_text(
        "from lowering.ops.custom import register_custom_op\nregister_custom_op('issue35_times_three', lambda x: x * "
        "3)\n"
    )
    (mojo / "kernels.mojo").write_text("fn main(): pass\n")
    monkeypatch.setenv("CUSTOM_OPS_PATH", os.pathsep.join([str(py), str(mojo)]))
    t = TensorType(DType.float32, [2], CPU_REF)
    with Graph("custom", input_types=[t]) as g:
        [y] = ops.custom("issue35_times_three", CPU_REF, [g.inputs[0]], [t])
        g.output(y)
    np.testing.assert_array_equal(
        InferenceSession().load(g).execute(np.array([1.0, 2.0], np.float32))[0].to_numpy(), [3.0, 6.0]
    )
    with (
        pytest.raises(CustomOpNotFoundError, match=r"mojo_ops \(1 Mojo file\) hold Mojo kernels"),
        Graph("mojo", input_types=[t], custom_extensions=[mojo]) as g2,
    ):
        ops.custom("issue35_mojo_only_op", CPU_REF, [g2.inputs[0]], [t])


def test_custom_extensions_python_file(tmp_path):
    lib = tmp_path / "negate_ops.py"
    lib.write_text(
        "from lowering.ops.custom import register_custom_op\nregister_custom_op('issue35_negate', lambda x: -x)\n"
    )
    t = TensorType(DType.float32, [2], CPU_REF)
    with Graph("ext", input_types=[t], custom_extensions=[lib]) as g:
        [y] = ops.custom("issue35_negate", CPU_REF, [g.inputs[0]], [t])
        g.output(y)
    np.testing.assert_array_equal(
        InferenceSession().load(g).execute(np.array([1.0, -2.0], np.float32))[0].to_numpy(), [-1.0, 2.0]
    )
