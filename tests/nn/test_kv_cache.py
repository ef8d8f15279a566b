"""KV-cache configuration (KVCacheParams, KVCacheStrategy), step inputs and the paged cache manager."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
from maxfx.nn.kv_cache import (
    KVCacheInputs,
    KVCacheInputsSequence,
    KVCacheParams,
    KVCacheStrategy,
    PagedCacheValues,
    PagedKVCacheManager,
    RaggedKVCacheInputs,
    cache_params,
    manager,
)


def test_params_fields_and_properties():
    p = KVCacheParams(DType.bfloat16, n_kv_heads=8, head_dim=64, page_size=128)
    assert (p.cache_strategy, p.n_devices, p.data_parallel_degree, p.is_mla) == (KVCacheStrategy.PAGED, 1, 1, False)
    assert p.n_kv_heads_per_device == 8 and p.dtype_shorthand == "bf16" and p.kv_dim == 2
    assert KVCacheParams(DType.float32, 2, 8, page_size=16).dtype_shorthand == "f32"
    assert p.static_cache_shape == ("num_layers", "batch_size", "seq_len", "n_kv_heads", "head_dim")
    assert (
        p.enable_prefix_caching is False
        and p.enable_kvcache_swapping_to_host is False
        and p.host_kvcache_swap_space_gb is None
    )
    tp = KVCacheParams(DType.float32, n_kv_heads=8, head_dim=4, page_size=16, n_devices=4)
    assert tp.n_kv_heads_per_device == 2
    assert KVCacheParams(DType.float32, n_kv_heads=2, head_dim=4, page_size=16, n_devices=4).n_kv_heads_per_device == 1
    dp = KVCacheParams(DType.float32, n_kv_heads=8, head_dim=4, page_size=16, n_devices=4, data_parallel_degree=4)
    assert dp.n_kv_heads_per_device == 8
    one = dp.copy_as_dp_1()
    assert (one.n_devices, one.data_parallel_degree, one.n_kv_heads_per_device) == (1, 1, 8)
    assert KVCacheParams(DType.float32, 1, 576, page_size=64, is_mla=True).blocks_shape(3, 10) == [10, 1, 3, 64, 1, 576]
    assert cache_params.KVCacheParams is KVCacheParams and manager.RaggedKVCacheInputs is RaggedKVCacheInputs


def test_params_errors():
    with pytest.raises(ValueError, match="page_size .* is required for the PAGED strategy"):
        KVCacheParams(DType.float32, 2, 8)
    with pytest.raises(ValueError, match="host_kvcache_swap_space_gb is required"):
        KVCacheParams(DType.float32, 2, 8, page_size=16, enable_kvcache_swapping_to_host=True)
    with pytest.raises(ValueError, match="data_parallel_degree must be 1 or n_devices"):
        KVCacheParams(DType.float32, 2, 8, page_size=16, n_devices=4, data_parallel_degree=2)
    with pytest.raises(ValueError, match="3 KV heads cannot be split over 2 devices"):
        KVCacheParams(DType.float32, 3, 8, page_size=16, n_devices=2)
    with pytest.raises(TypeError, match="dtype must be a DType"):
        KVCacheParams(np.float32, 2, 8, page_size=16)
    p = KVCacheParams(DType.float32, 2, 8, page_size=16, n_devices=2, data_parallel_degree=2)
    bad = dataclasses.replace(p)
    bad.n_devices = 3
    with pytest.raises(ValueError, match=r"n_devices \(3\) is not divisible by data_parallel_degree \(2\)"):
        bad.copy_as_dp_1()


def test_strategy():
    assert KVCacheStrategy.PAGED.kernel_substring() == "paged"
    assert KVCacheStrategy.PAGED.uses_opaque() and not KVCacheStrategy.MODEL_DEFAULT.uses_opaque()
    with pytest.raises(ValueError, match="MODEL_DEFAULT has no kernels"):
        KVCacheStrategy.MODEL_DEFAULT.kernel_substring()
    assert KVCacheParams(DType.float32, 2, 8, cache_strategy=KVCacheStrategy.MODEL_DEFAULT).page_size is None


def test_inputs_iterate_in_order():
    a = RaggedKVCacheInputs("blocks", "lengths", "lookup", "max")
    assert list(a) == ["blocks", "lengths", "lookup", "max"] and len(a) == 4 and a[2] == "lookup"
    seq = KVCacheInputsSequence([a, RaggedKVCacheInputs(1, 2, 3, 4)])
    assert list(seq) == ["blocks", "lengths", "lookup", "max", 1, 2, 3, 4]
    assert isinstance(seq, KVCacheInputs) and list(KVCacheInputs()) == []


def test_input_types_and_paged_values():
    p = KVCacheParams(DType.float32, 2, 8, page_size=4)
    blocks_t, lengths_t, lookup_t, max_t = p.input_types()
    assert isinstance(blocks_t, BufferType) and [str(d) for d in blocks_t.shape] == [
        "total_num_pages",
        "2",
        "num_layers",
        "4",
        "2",
        "8",
    ]
    assert lengths_t == TensorType(DType.uint32, ["batch_size"]) and lookup_t.rank == 2 and max_t.rank == 2
    with Graph("kv", input_types=p.input_types()) as g:
        kv = PagedCacheValues.from_graph_inputs(g.inputs)
        # MAX's fields: max_lengths [steps, 2] becomes max_prompt_length / max_cache_length, each uint32 [1]
        one = TensorType(DType.uint32, [1], max_t.device)
        assert kv.kv_blocks.type == blocks_t and [v.type for v in list(kv)[1:]] == [lengths_t, lookup_t, one, one]
        assert kv.kv_scales is None and kv.attention_dispatch_metadata is None
        with pytest.raises(ValueError, match="expected 4 values"):
            PagedCacheValues.from_graph_inputs(g.inputs[:3])
        with pytest.raises(TypeError, match="expected a buffer and three tensors"):
            PagedCacheValues.from_graph_inputs([g.inputs[1], *g.inputs[1:]])
        g.output(ops.buffer_load(kv.kv_blocks))


def test_manager_allocates_pages_and_tracks_lengths():
    p = KVCacheParams(DType.float32, 1, 2, page_size=4)
    mgr = PagedKVCacheManager(p, num_layers=2, total_num_pages=5, max_batch_size=2, max_seq_len=12)
    assert mgr.blocks.shape == (5, 2, 2, 4, 1, 2) and mgr.num_free_pages == 5
    a, b = mgr.claim(), mgr.claim()
    inputs = mgr.fetch([a, b], [6, 1])
    np.testing.assert_array_equal(inputs.cache_lengths.to_numpy(), [0, 0])
    np.testing.assert_array_equal(inputs.lookup_table.to_numpy(), [[0, 1, 0], [2, 0, 0]])  # fixed width ceil(12/4)
    np.testing.assert_array_equal(inputs.max_lengths.to_numpy(), [[6, 6]])
    assert inputs.blocks is mgr.blocks
    mgr.step([a, b], [6, 1])
    assert (mgr.cache_length(a), mgr.cache_length(b), mgr.num_free_pages) == (6, 1, 2)
    inputs = mgr.fetch([a, b], [3, 1])  # a grows into a third page
    np.testing.assert_array_equal(inputs.cache_lengths.to_numpy(), [6, 1])
    np.testing.assert_array_equal(inputs.lookup_table.to_numpy(), [[0, 1, 3], [2, 0, 0]])
    mgr.step([a, b], [3, 1])
    mgr.release(b)
    assert mgr.num_free_pages == 2
    c = mgr.claim()
    assert mgr.fetch([c], [8]).lookup_table.to_numpy()[0, :2].tolist() == [4, 2]


def test_manager_errors():
    p = KVCacheParams(DType.float32, 1, 2, page_size=4)
    mgr = PagedKVCacheManager(p, num_layers=1, total_num_pages=2, max_batch_size=1, max_seq_len=16)
    a = mgr.claim()
    with pytest.raises(ValueError, match="more than max_seq_len=16"):
        mgr.fetch([a], [17])
    with pytest.raises(RuntimeError, match="out of pages"):
        mgr.fetch([a], [9])
    with pytest.raises(ValueError, match="batch of 2 sequences; expected 1..1"):
        mgr.fetch([a, mgr.claim()], [1, 1])
    with pytest.raises(KeyError, match="unknown sequence 7"):
        mgr.fetch([7], [1])
    with pytest.raises(ValueError, match="already active"):
        mgr.claim(a)
    with pytest.raises(ValueError, match="has no pages for 5 more tokens"):
        mgr.step([a], [5])
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        PagedKVCacheManager(p, 0, 2, 1, 4)


def test_manager_pool_is_updated_by_the_model():
    """A graph that stores rows through the cache inputs changes the manager's pool in place."""
    p = KVCacheParams(DType.float32, 1, 2, page_size=2)
    mgr = PagedKVCacheManager(p, num_layers=1, total_num_pages=4, max_batch_size=1, max_seq_len=4)
    with Graph(
        "store", input_types=[TensorType(DType.float32, [3, 1, 2]), TensorType(DType.uint32, [2])] + mgr.input_types()
    ) as g:
        x, offs = g.inputs[0].tensor, g.inputs[1].tensor
        kv = PagedCacheValues.from_graph_inputs(g.inputs[2:])
        zero = ops.constant(0, DType.uint32, DeviceRef.CPU())
        ops.kv_cache_store(kv.kv_blocks, x, kv.lookup_table, zero, offs, kv.cache_lengths, zero, kv_index=0)
        g.output(kv.cache_lengths)
    model = InferenceSession().load(g)
    s = mgr.claim()
    rows = np.arange(6, dtype=np.float32).reshape(3, 1, 2)
    model.execute(rows, np.array([0, 3], np.uint32), *mgr.fetch([s], [3]))
    pool = mgr.blocks.to_numpy()
    np.testing.assert_array_equal(pool[0, 0, 0, :, 0], rows[:2, 0])
    np.testing.assert_array_equal(pool[1, 0, 0, 0, 0], rows[2, 0])
    assert not pool[:, 1].any()
