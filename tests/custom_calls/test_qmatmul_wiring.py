"""ops.qmatmul inside a maxfx graph (traced and lowered with x64 on) runs the Pallas GGUF kernels.

The kernels' own tests call them directly; this checks the route from the
registry op through `custom_calls.qmatmul.dispatch` in interpret mode, against
the `gguf` package's dequantizer.
"""

import numpy as np
import pytest

from custom_calls.qmatmul import dispatch, pallas_gguf
from lowering.compile import clear_cache
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from maxfx.graph.quantization import QuantizationEncoding
from tests.custom_calls.test_qmatmul_reference import gguf_dequant, random_blocks


@pytest.fixture
def kernel_calls(monkeypatch):
    calls: list[str] = []
    real = pallas_gguf.qmatmul
    monkeypatch.setattr(pallas_gguf, "qmatmul", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
    clear_cache()  # compiled graphs are cached per structure, not per kernel mode
    yield calls
    clear_cache()


@pytest.mark.parametrize("encoding, blocks", [("Q4_0", 8), ("Q4_K", 1), ("Q5_K", 1), ("Q6_K", 1)])
def test_graph_qmatmul_runs_the_pallas_kernel(kernel_calls, rng, encoding, blocks):
    w = random_blocks(rng, encoding, 6, blocks)
    k = gguf_dequant(encoding, w).shape[1]
    x = rng.standard_normal((3, k)).astype(np.float32)
    with Graph(
        f"q_{encoding}",
        input_types=[
            TensorType(DType.float32, ["m", k], DeviceRef.CPU()),
            TensorType(DType.uint8, list(w.shape), DeviceRef.CPU()),
        ],
    ) as g:
        lhs, rhs = (v.tensor for v in g.inputs)
        g.output(ops.qmatmul(getattr(QuantizationEncoding, encoding), None, lhs, rhs))
    out = InferenceSession().load(g).execute(x, w)[0].to_numpy()
    assert kernel_calls, f"{encoding}: ops.qmatmul did not reach the Pallas kernel"
    np.testing.assert_allclose(out, x @ gguf_dequant(encoding, w).T, rtol=1e-4, atol=1e-4)
