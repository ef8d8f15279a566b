"""maxfx.export(..., platforms=["cuda"]) on a CPU-only machine: the artifact carries the Pallas kernels.

The dispatchers emit the Triton kernels for a CUDA-only lowering target even
with no GPU attached (lowering.targets / custom_calls._target). CPU and
multi-platform artifacts take the portable jnp path, which runs here and must
match numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

import maxfx
from custom_calls.qmatmul import reference as qref
from maxfx.dtype import DType
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from maxfx.graph.quantization import QuantizationEncoding
from maxfx.nn import kernels
from maxfx.nn.attention import MHAMaskVariant
from tests.ops.test_attention_ops import np_attend

F32, CPU = DType.float32, DeviceRef.CPU()
TRITON = "__gpu$xla.gpu.triton"
B, S, H, HKV, D, K, N = 2, 8, 4, 2, 32, 64, 24


def _graph(rng):
    """Causal flash attention, then a Q4_0 projection of its first head: both ops have GPU kernels."""
    w = rng.integers(0, 256, size=(N, K // 32, 18), dtype=np.uint8)  # Q4_0 blocks: f16 scale, 16 bytes of nibbles
    w[:, :, 0:2] = np.full((N, K // 32), 0.01, np.float16).view(np.uint8).reshape(N, K // 32, 2)
    w = w.reshape(N, -1)
    types = [
        TensorType(F32, [B, S, H, D], CPU),
        TensorType(F32, [B, S, HKV, D], CPU),
        TensorType(F32, [B, S, HKV, D], CPU),
    ]
    with Graph("attn_q4", input_types=types) as g:
        q, k, v = (x.tensor for x in g.inputs)
        o = kernels.flash_attention_gpu(q, k, v, MHAMaskVariant.CAUSAL_MASK, 0.25)
        flat = ops.reshape(o, [B * S, H * D])
        proj = ops.qmatmul(
            QuantizationEncoding.Q4_0,
            None,
            ops.slice_tensor(flat, [slice(None), slice(0, K)]),
            ops.constant(w, DType.uint8, CPU),
        )
        g.output(o, proj)
    return g, w


def _numpy(q, k, v, w):
    o = np.stack([np_attend(q[b], k[b], v[b], np.arange(S), S, "causal", 0.25) for b in range(B)])
    deq = np.asarray(qref.dequantize("Q4_0", w), np.float64)
    return o, o.reshape(B * S, H * D)[:, :K] @ deq.T


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(7)


def _inputs(rng):
    q = rng.standard_normal((B, S, H, D)).astype(np.float32)
    k, v = (rng.standard_normal((B, S, HKV, D)).astype(np.float32) for _ in range(2))
    return q, k, v


def test_cuda_export_on_a_cpu_machine_carries_the_kernels(rng, tmp_path):
    g, _ = _graph(rng)
    cuda = maxfx.export(g, platforms=["cuda"])
    assert cuda.platforms == ("cuda",)
    assert cuda.stablehlo().count(TRITON) == 2  # the flash kernel and the Q4_0 kernel
    loaded = maxfx.load_exported(cuda.save(tmp_path / "attn.maxfx"))
    assert loaded.stablehlo().count(TRITON) == 2
    with pytest.raises(RuntimeError, match=r"lowered for \['cuda'\], not for cpu"):
        loaded(*_inputs(rng))


@pytest.mark.parametrize("platforms", [None, ["cpu", "cuda"]], ids=["cpu", "cpu+cuda"])
def test_cpu_and_multi_platform_artifacts_take_the_portable_path(rng, tmp_path, platforms):
    g, w = _graph(rng)
    art = maxfx.export(g, platforms=platforms)
    assert TRITON not in art.stablehlo()
    q, k, v = _inputs(rng)
    want_o, want_p = _numpy(q, k, v, w)
    for model in (art, maxfx.load_exported(art.save(tmp_path / "attn.maxfx"))):
        o, p = (t.to_numpy() for t in model(q, k, v))
        np.testing.assert_allclose(o, want_o, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(p, want_p, rtol=1e-4, atol=1e-4)


def test_an_artifact_disabling_other_checks_is_refused(rng):
    import dataclasses
    import io
    import zipfile

    import jax

    g, _ = _graph(rng)
    buf = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(maxfx.export(g, platforms=["cuda"]).serialize())) as src,
        zipfile.ZipFile(buf, "w") as dst,
    ):
        for name in src.namelist():
            content = src.read(name)
            if name == "program.jaxexport":  # the same program, re-serialized with one more check disabled
                program = jax.export.deserialize(bytearray(content))
                unvetted = jax.export.DisabledSafetyCheck.custom_call("some_unvetted_target")
                content = bytes(
                    dataclasses.replace(
                        program, disabled_safety_checks=(*program.disabled_safety_checks, unvetted)
                    ).serialize()
                )
            dst.writestr(name, content)
    with pytest.raises(ValueError, match="unsupported disabled safety check 'custom_call:some_unvetted_target'"):
        maxfx.load_exported(buf.getvalue())
