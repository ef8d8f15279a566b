"""MAX's current eager-Module norms (``max.experimental.nn.norm``) against numpy."""

import ml_dtypes
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.experimental import nn
from maxfx.experimental.nn.norm import GemmaRMSNorm, GroupNorm, LayerNorm, RMSNorm, group_norm, rms_norm
from maxfx.experimental.tensor import Tensor
from maxfx.graph import TensorType


def _rms(x, eps):
    x32 = x.astype(np.float32)
    return x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + eps)


def test_the_norms_are_the_package_exports():
    assert (nn.RMSNorm, nn.GemmaRMSNorm, nn.GroupNorm, nn.LayerNorm) == (RMSNorm, GemmaRMSNorm, GroupNorm, LayerNorm)


def test_rms_norm_and_gemma_variant_match_numpy(rng):
    x = rng.standard_normal((2, 3, 8)).astype(np.float32)
    w = rng.uniform(-0.5, 0.5, 8).astype(np.float32)
    norm, gemma = RMSNorm(8, 1e-5), GemmaRMSNorm(8, eps=1e-5)  # eps positional, as in MAX
    norm.load_state_dict({"weight": w})
    gemma.load_state_dict({"weight": w})
    np.testing.assert_allclose(norm(Tensor(x)).to_numpy(), _rms(x, 1e-5) * w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gemma(Tensor(x)).to_numpy(), _rms(x, 1e-5) * (1 + w), rtol=1e-5, atol=1e-6)
    assert (
        sorted(norm.state_dict()) == ["weight"] and norm.dim == 8 and repr(norm) == "RMSNorm(dim=Dim(8), eps=1e-05)"
    )  # MAX: rich pretty_repr, dim a Dim


def test_bfloat16_rms_norm_casts_before_or_after_the_scale(rng):
    bf16 = ml_dtypes.bfloat16
    x = rng.standard_normal((4, 16)).astype(bf16)
    w = rng.uniform(0.5, 1.5, 16).astype(np.float32)
    llama = rms_norm(Tensor(x), Tensor(w), 1e-6)  # normalised value cast to bf16, then times the f32 weight
    gemma = rms_norm(Tensor(x), Tensor(w), 1e-6, weight_offset=1.0, multiply_before_cast=True)
    assert llama.dtype == DType.float32 and gemma.dtype == DType.bfloat16
    np.testing.assert_allclose(llama.to_numpy(), _rms(x, 1e-6).astype(bf16).astype(np.float32) * w, rtol=1e-6)
    np.testing.assert_allclose(
        gemma.to_numpy().astype(np.float32), (_rms(x, 1e-6) * (1 + w)).astype(bf16).astype(np.float32), rtol=1e-2
    )


@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_numpy(rng, affine):
    x = rng.standard_normal((2, 6, 3, 2)).astype(np.float32)
    norm = GroupNorm(3, 6, affine=affine)
    want = x.reshape(2, 3, -1)
    want = ((want - want.mean(-1, keepdims=True)) / np.sqrt(want.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    if affine:
        w, b = rng.uniform(0.5, 2, 6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
        norm.load_state_dict({"weight": w, "bias": b})
        want = want * w.reshape(1, 6, 1, 1) + b.reshape(1, 6, 1, 1)
        assert sorted(norm.state_dict()) == ["bias", "weight"]
    else:
        assert dict(norm.state_dict()) == {}
    np.testing.assert_allclose(norm(Tensor(x)).to_numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        group_norm(Tensor(x), Tensor(np.ones(6, np.float32)), Tensor(np.zeros(6, np.float32)), 3, 1e-5)
        .to_numpy()
        .std(),
        1.0,
        rtol=1e-3,
    )


def test_norm_errors_and_compile():
    with pytest.raises(ValueError, match=r"num_channels\(6\) should be divisible by num_groups\(4\)"):
        GroupNorm(4, 6)
    with pytest.raises(ValueError, match="Expected 6 channels"):
        GroupNorm(3, 6)(Tensor.ones([2, 4, 3]))
    with pytest.raises(ValueError, match=r"RMSNorm: input .* must end in dim 4"):
        RMSNorm(4)(Tensor.ones([2, 3]))
    with pytest.raises(ValueError, match=r"GemmaRMSNorm: input .* must end in dim 4"):
        GemmaRMSNorm(4)(Tensor.ones([2, 3]))
    model = GemmaRMSNorm(4).compile(TensorType(DType.float32, ["batch", 4]))
    x = np.arange(8, dtype=np.float32).reshape(2, 4) + 1
    np.testing.assert_allclose(np.asarray(model(Tensor(x)).to_numpy()), _rms(x, 1e-6) * 2, rtol=1e-5)
