"""Tensor-parallel layers, collectives as layers and GPTQLinear, against numpy and the unsharded layers."""

from __future__ import annotations

import numpy as np
import pytest

from custom_calls.qmatmul import gptq_pack
from maxfx import nn
from maxfx.driver import Tensor
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType
from maxfx.graph.quantization import QuantizationConfig, QuantizationEncoding
from tests.custom_calls.test_qmatmul_reference import random_gptq

CPU0, CPU1 = DeviceRef.CPU(0), DeviceRef.CPU(1)


def fill(layer, rng):
    state = {k: rng.normal(size=np.shape(v)).astype(np.asarray(v).dtype) for k, v in layer.state_dict().items()}
    layer.load_state_dict(state)
    return state


def signals(n=2, nbytes=8):
    """Small stand-in signal buffers (the collectives accept any uint8 buffer per device)."""
    return [BufferType(DType.uint8, [nbytes], d) for d in (CPU0, CPU1)[:n]], [
        Tensor.from_numpy(np.zeros(nbytes, np.uint8)) for _ in range(n)
    ]


def test_column_parallel_linear_matches_linear(rng):
    layer = nn.ColumnParallelLinear(6, 4, DType.float32, [CPU0, CPU1], has_bias=True)
    st = fill(layer, rng)
    assert [list(s.weight.shape) for s in layer.distributed_linear_layers] == [[2, 6], [2, 6]]
    x = rng.normal(size=(3, 6)).astype(np.float32)
    sig_types, sig_bufs = signals()
    with Graph("cpl", input_types=[TensorType(DType.float32, [3, 6]), *sig_types]) as g:
        xv = g.inputs[0].tensor
        gathered = layer(xv, [s.buffer for s in g.inputs[1:]])
        concatenated = layer([xv, xv])
        assert [o.device for o in gathered] == [CPU0, CPU1]
        g.output(*gathered, *concatenated)
    outs = InferenceSession().load(g, weights_registry=layer.state_dict()).execute(x, *sig_bufs)
    ref = x @ st["weight"].T + st["bias"]
    for o in outs:
        np.testing.assert_allclose(o.to_numpy(), ref, rtol=1e-5, atol=1e-5)
    uneven = nn.ColumnParallelLinear(
        6, 5, DType.float32, [CPU0, CPU1]
    )  # as in MAX: the first device gets the extra row
    assert [[int(d) for d in s.weight.shape] for s in uneven.distributed_linear_layers] == [[3, 6], [2, 6]]


def test_column_parallel_linear_tied_weight(rng):
    emb = nn.Embedding(8, 6, DType.float32, CPU0)
    head = nn.ColumnParallelLinear(6, 8, DType.float32, [CPU0, CPU1], tied_weight=emb.weight)
    assert "weight" not in head.state_dict()  # the tied table belongs to the embedding
    with pytest.raises(ValueError, match=r"tied_weight must be \[8, 4\]"):
        nn.ColumnParallelLinear(4, 8, DType.float32, [CPU0, CPU1], tied_weight=emb.weight)


def test_vocab_parallel_embedding_matches_embedding(rng):
    emb = nn.VocabParallelEmbedding(10, 4, DType.float32, [CPU0, CPU1])
    st = fill(emb, rng)
    ids = np.array([[0, 9, 4], [5, 2, 7]], np.int64)
    sig_types, sig_bufs = signals()
    with Graph("vpe", input_types=[TensorType(DType.int64, [2, 3]), *sig_types]) as g:
        out = emb(g.inputs[0].tensor, [s.buffer for s in g.inputs[1:]])
        g.output(*out, *emb(g.inputs[0].tensor))
    outs = InferenceSession().load(g, weights_registry=emb.state_dict()).execute(ids, *sig_bufs)
    for o in outs:
        np.testing.assert_array_equal(o.to_numpy(), st["weight"][ids])
    with pytest.raises(ValueError, match="vocab_size 9 must split evenly"):
        nn.VocabParallelEmbedding(9, 4, DType.float32, [CPU0, CPU1])


def test_allreduce_and_signals(rng):
    ar = nn.Allreduce(2)
    assert len(ar.devices) == 2
    xs = [rng.normal(size=(2, 3)).astype(np.float32) for _ in range(2)]
    sig_types, sig_bufs = signals()
    types = [TensorType(DType.float32, [2, 3], CPU0), TensorType(DType.float32, [2, 3], CPU1), *sig_types]
    with Graph("ar", input_types=types) as g:
        outs = ar([g.inputs[0].tensor, g.inputs[1].tensor], [s.buffer for s in g.inputs[2:]])
        assert [o.device for o in outs] == [CPU0, CPU1]
        g.output(*outs)
    for o in InferenceSession().load(g).execute(*xs, *sig_bufs):
        np.testing.assert_allclose(o.to_numpy(), xs[0] + xs[1], rtol=1e-6)
    with pytest.raises(ValueError, match="num_accelerators must be an int >= 1"):
        nn.Allreduce(0)
    with Graph("bad", input_types=types) as g:
        a, b = g.inputs[0].tensor, g.inputs[1].tensor
        with pytest.raises(ValueError, match="number of signal buffers"):
            ar([a, b], [g.inputs[2].buffer])
        with pytest.raises(TypeError, match="signal buffer 1 must be a BufferValue"):
            ar([a, b], [g.inputs[2].buffer, b])
    sig = nn.Signals([CPU0, DeviceRef.GPU(1)])
    assert [(t.dtype, list(t.shape), t.device) for t in sig.input_types()] == [
        (DType.uint8, [nn.Signals.NUM_BYTES], CPU0),
        (DType.uint8, [537919488], DeviceRef.GPU(1)),
    ]
    cpu_bufs = nn.Signals([CPU0]).buffers()
    assert tuple(cpu_bufs[0].shape) == (537919488,) and cpu_bufs[0].dtype is DType.uint8


def test_distributed_gemm_config(monkeypatch):
    assert nn.DistributedGemmConfig.generate() == nn.DistributedGemmConfig(enable_matmul_allreduce=False)
    monkeypatch.setenv("MAXFX_ENABLE_MATMUL_ALLREDUCE", "1")
    assert nn.DistributedGemmConfig.generate().enable_matmul_allreduce is True


@pytest.mark.parametrize("desc_act", [False, True])
def test_gptq_linear_against_numpy(rng, desc_act):
    k, n, gs = 64, 8, 32
    qweight, scales, g_idx, w = random_gptq(rng, k, n, gs, act_order=desc_act)
    cfg = QuantizationConfig(quant_method="gptq", bits=4, group_size=gs, desc_act=desc_act, sym=True)
    lin = nn.GPTQLinear(
        k,
        n,
        DType.float32,
        CPU0,
        has_bias=True,
        quantization_encoding=QuantizationEncoding.GPTQ,
        quantization_config=cfg,
    )
    bias = rng.normal(size=n).astype(np.float32)
    state = {"weight": gptq_pack(qweight, scales), "bias": bias}
    x = rng.normal(size=(3, k)).astype(np.float32)
    ref = x @ w + bias
    if desc_act:
        # As MAX's act-order layout: perm_idx sorts the input features by group; the
        # layer gathers x by it and qmatmul maps the rows back, so y = x @ W still.
        state["perm_idx"] = np.argsort(g_idx, kind="stable").astype(np.int32)
    lin.load_state_dict(state)
    with Graph("gptq", input_types=[TensorType(DType.float32, [3, k])]) as g:
        g.output(lin(g.inputs[0].tensor))
    got = InferenceSession().load(g, weights_registry=lin.state_dict()).execute(x)[0].to_numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)


def test_gptq_linear_errors():
    cfg = QuantizationConfig(quant_method="gptq", bits=4, group_size=32, sym=True)
    with pytest.raises(ValueError, match="float8_config is not supported"):
        nn.GPTQLinear(64, 8, DType.float32, CPU0, quantization_config=cfg, float8_config=object())
    with pytest.raises(ValueError, match="group_size dividing in_dim=40"):
        nn.GPTQLinear(40, 8, DType.float32, CPU0, quantization_config=cfg)
    with pytest.raises(ValueError, match="must be QuantizationEncoding.GPTQ"):
        nn.GPTQLinear(
            64, 8, DType.float32, CPU0, quantization_encoding=QuantizationEncoding.Q4_0, quantization_config=cfg
        )
