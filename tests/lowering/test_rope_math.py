"""RoPE computes in float32 on every path (issue 35 item 1b).

The ``rope_ragged`` kernel (`lowering.ops.attention`) rotated in float32 while
the RoPE layers (`maxfx._rope_math.apply_rope`, both module APIs) rotated in the
input's dtype; both are now `lowering.rope_math.rotate_pairs`. In bfloat16 the
eager layer, the graph layer run by an InferenceSession and the kernel must
all be the float64 numpy rotation rounded once to bfloat16 (within half a
bfloat16 ulp, the error of that one rounding), and so agree with each other.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from maxfx import nn
from maxfx._rope_math import apply_rope
from maxfx.dtype import DType
from maxfx.experimental.nn.rope import RotaryEmbedding as EagerRope
from maxfx.experimental.nn.rope import TransposedRotaryEmbedding as EagerTransposedRope
from maxfx.experimental.nn.rope import positional_embedding
from maxfx.experimental.tensor import Tensor
from maxfx.graph import TensorType, ops
from tests.graph_run import run_graph

BF16 = ml_dtypes.bfloat16
B, S, H, D, THETA, MAX_SEQ = 2, 64, 3, 16, 10000.0, 64


def _x() -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((B, S, H, D)) * 4).astype(BF16)


def _reference(x: np.ndarray, interleaved: bool) -> np.ndarray:
    """float64 rotation of ``x`` at positions 0..S-1."""
    xf = x.astype(np.float64)
    inv = 1.0 / THETA ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.outer(np.arange(S, dtype=np.float64), inv)[None, :, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    if interleaved:
        re, im = xf[..., 0::2], xf[..., 1::2]
        return np.stack([re * cos - im * sin, re * sin + im * cos], -1).reshape(xf.shape)
    re, im = xf[..., : D // 2], xf[..., D // 2 :]
    return np.concatenate([re * cos - im * sin, re * sin + im * cos], -1)


def _assert_rounded_once(out: np.ndarray, ref: np.ndarray, where: str) -> None:
    assert out.dtype == BF16, f"{where}: dtype {out.dtype}"
    err = np.abs(out.astype(np.float64) - ref)
    bound = 2.0**-8 * np.abs(ref) + 1e-5  # half a bfloat16 ulp, plus float32's own error
    bad = err > bound
    assert not bad.any(), (
        f"{where}: {int(bad.sum())} of {bad.size} values off by more than half a bfloat16 ulp (worst {err.max():.4g})"
    )


def _eager_layer(x: np.ndarray, interleaved: bool) -> np.ndarray:
    """The eager layer: its float32 table promotes x to float32 (MAX's rule); round the result to bfloat16 once."""
    layer = (EagerRope if interleaved else EagerTransposedRope)(positional_embedding(D, THETA, MAX_SEQ))
    out = layer(Tensor.from_dlpack(x))
    assert out.dtype == DType.float32
    return np.asarray(out.cast(DType.bfloat16).to_numpy())


def _eager_apply(x: np.ndarray, interleaved: bool) -> np.ndarray:
    """`apply_rope` on eager Tensors: bfloat16 x, float32 cos/sin, a bfloat16 result."""
    inv = 1.0 / THETA ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.outer(np.arange(S, dtype=np.float64), inv)[:, None, :].astype(np.float32)
    out = apply_rope(
        Tensor.from_dlpack(x), Tensor.from_dlpack(np.cos(ang)), Tensor.from_dlpack(np.sin(ang)), interleaved=interleaved
    )
    return np.asarray(out.to_numpy())


def _graph(x: np.ndarray, interleaved: bool) -> np.ndarray:
    rope = nn.RotaryEmbedding(D * H, H, THETA, MAX_SEQ, interleaved=interleaved)
    return run_graph(rope, x, types=[TensorType(DType.bfloat16, list(x.shape))])[0]


def _kernel(x: np.ndarray, interleaved: bool) -> np.ndarray:
    inv = 1.0 / THETA ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.outer(np.arange(MAX_SEQ, dtype=np.float64), inv)
    freqs = np.stack([np.cos(ang), np.sin(ang)], -1).reshape(MAX_SEQ, D).astype(np.float32)
    ragged = Tensor.from_dlpack(np.ascontiguousarray(x.reshape(B * S, H, D)))
    offsets = Tensor.from_dlpack(np.arange(0, B * S + 1, S, dtype=np.uint32))
    start = Tensor.from_dlpack(np.zeros(B, np.uint32))
    out = ops.rope_ragged(ragged, Tensor.from_dlpack(freqs), offsets, start, interleaved=interleaved)
    return np.asarray(out.to_numpy()).reshape(x.shape)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "rotate_half"])
def test_bfloat16_rope_is_float32_math_on_every_path(interleaved):
    x = _x()
    ref = _reference(x, interleaved)
    outs = {
        "eager layer": _eager_layer(x, interleaved),
        "eager apply_rope": _eager_apply(x, interleaved),
        "graph layer": _graph(x, interleaved),
        "rope_ragged kernel": _kernel(x, interleaved),
    }
    for where, out in outs.items():
        _assert_rounded_once(out, ref, where)
    eager = outs["eager layer"].astype(np.float64)
    for where in ("eager apply_rope", "graph layer", "rope_ragged kernel"):
        np.testing.assert_allclose(
            outs[where].astype(np.float64), eager, rtol=2.0**-7, atol=1e-5, err_msg=f"{where} vs eager layer"
        )


def test_one_rotation_for_layers_and_kernel():
    import lowering.ops.attention as attention
    import maxfx._rope_math as rope_math
    from lowering.rope_math import rotate_pairs

    assert attention.rotate_pairs is rotate_pairs and rope_math.rotate_pairs is rotate_pairs
