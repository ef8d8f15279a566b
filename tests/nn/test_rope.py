"""max.nn.rotary_embedding: every RoPE variant against numpy versions of the Hugging Face formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from maxfx import nn
from maxfx.dtype import DType
from maxfx.graph import DeviceRef, Graph, TensorType
from maxfx.nn import rotary_embedding as re_mod
from tests.graph_run import execute, run_graph

CPU = DeviceRef.CPU()


# ─── numpy references (HF transformers' modeling_rope_utils formulas) ─────


def hf_inv_freq(theta, d):
    return 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)


def hf_llama3(theta, d, factor, low_ff, high_ff, old_ctx):
    inv = hf_inv_freq(theta, d)
    low_wavelen, high_wavelen = old_ctx / low_ff, old_ctx / high_ff
    wavelen = 2 * math.pi / inv
    out = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, out)


def hf_dynamic(theta, d, seq_len, max_pos, factor):
    base = theta * ((factor * seq_len / max_pos) - (factor - 1)) ** (d / (d - 2))
    return hf_inv_freq(base, d)


def hf_yarn(theta, d, factor, beta_fast, beta_slow, orig, truncate=True, mscale=None, mscale_all_dim=None):
    def get_mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    def corr_dim(rot):
        return (d * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrap = 1 - ramp
    pos_freqs = theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    inv = (1 / (factor * pos_freqs)) * (1 - extrap) + (1 / pos_freqs) * extrap
    if mscale is not None:
        attn = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    else:
        attn = get_mscale(factor)
    return inv, attn


def table(inv, n, scale=1.0, start=0):
    f = np.outer(np.arange(start, n, dtype=np.float64), inv)
    return np.stack([np.cos(f) * scale, np.sin(f) * scale], -1)


def np_rope(x, tab, interleaved):
    """HF-style application: x * cos + rotate(x) * sin with cos/sin expanded to head_dim."""
    cos, sin = tab[..., 0][None, :, None, :], tab[..., 1][None, :, None, :]
    if interleaved:  # GPT-J: rotate_every_two, cos/sin repeat_interleave
        cos, sin = np.repeat(cos, 2, -1), np.repeat(sin, 2, -1)
        rot = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
    else:  # rotate_half, cos/sin concatenated twice
        cos, sin = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rot * sin


# ─── graph helpers ────────────────────────────────────────────────────────


def run_table(rope, flat=False):
    return run_graph(lambda: rope.freqs_cis if flat else rope.freqs_cis_base())[0]


def run_apply(rope, x, start_pos=None, symbolic=False):
    shape = list(x.shape)
    if symbolic:
        shape[1] = "seq"
    return run_graph(lambda v: rope(v, start_pos=start_pos), x, types=[TensorType(DType.from_numpy(x.dtype), shape)])[0]


# ─── tests ────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("interleaved", [True, False])
def test_default_rope_matches_hf(rng, interleaved):
    rope = nn.RotaryEmbedding(dim=32, n_heads=4, theta=10000.0, max_seq_len=16, interleaved=interleaved)
    assert (rope.head_dim, rope.interleaved, rope.max_seq_len) == (8, interleaved, 16)
    ref = table(hf_inv_freq(10000.0, 8), 32)
    got = run_table(rope)
    assert got.shape == (32, 4, 2)
    np.testing.assert_allclose(got, ref, atol=2e-5)
    np.testing.assert_allclose(run_table(rope, flat=True), ref.reshape(32, 8), atol=2e-5)

    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(run_apply(rope, x), np_rope(x, ref[:5], interleaved), rtol=1e-5, atol=1e-5)
    # start_pos offsets the angles; a symbolic sequence length works too.
    np.testing.assert_allclose(
        run_apply(rope, x, start_pos=7, symbolic=True), np_rope(x, ref[7:12], interleaved), rtol=1e-5, atol=1e-5
    )


def test_interleaved_and_half_layouts_differ_and_preserve_norm(rng):
    x = rng.normal(size=(1, 4, 2, 8)).astype(np.float32)
    a = run_apply(nn.RotaryEmbedding(16, 2, 10000.0, 8, interleaved=True), x, start_pos=1)
    b = run_apply(nn.RotaryEmbedding(16, 2, 10000.0, 8, interleaved=False), x, start_pos=1)
    assert not np.allclose(a, b)
    # A rotation keeps each pair's norm, so the vector norm per head is unchanged.
    np.testing.assert_allclose(np.linalg.norm(a, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(b, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


def test_bfloat16_input_keeps_dtype(rng):
    import ml_dtypes

    x = rng.normal(size=(1, 3, 2, 8)).astype(ml_dtypes.bfloat16)
    out = run_apply(nn.RotaryEmbedding(16, 2, 10000.0, 8, interleaved=False), x)
    assert out.dtype == x.dtype
    ref = np_rope(x.astype(np.float32), table(hf_inv_freq(10000.0, 8), 3), False)
    np.testing.assert_allclose(out.astype(np.float32), ref, atol=3e-2)


def test_llama3_scaling_matches_hf(rng):
    p = nn.Llama3RopeScalingParams(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, orig_max_position=64)
    rope = nn.Llama3RotaryEmbedding(
        dim=64, n_heads=2, theta=500000.0, max_seq_len=32, scaling_params=p, interleaved=False
    )
    inv = hf_llama3(500000.0, 32, 8.0, 1.0, 4.0, 64)
    # The chosen sizes put frequencies in all three bands (kept, blended, divided).
    wavelen = 2 * math.pi / hf_inv_freq(500000.0, 32)
    assert (wavelen < 16).any() and (wavelen > 64).any() and ((wavelen >= 16) & (wavelen <= 64)).any()
    np.testing.assert_allclose(run_table(rope), table(inv, 64), atol=3e-5)
    x = rng.normal(size=(1, 6, 2, 32)).astype(np.float32)
    np.testing.assert_allclose(
        run_apply(rope, x, start_pos=20), np_rope(x, table(inv, 26)[20:], False), rtol=1e-4, atol=1e-4
    )
    # No scaling_params: plain RoPE.
    plain = nn.Llama3RotaryEmbedding(dim=64, n_heads=2, theta=500000.0, max_seq_len=32)
    np.testing.assert_allclose(run_table(plain), table(hf_inv_freq(500000.0, 32), 64), atol=3e-5)


def test_linear_scaling_matches_hf():
    rope = nn.Llama3RotaryEmbedding(32, 4, 10000.0, 8, scaling_params=nn.LinearScalingParams(factor=4.0))
    # HF linear: positions / factor, i.e. inv_freq / factor.
    np.testing.assert_allclose(run_table(rope), table(hf_inv_freq(10000.0, 8) / 4.0, 16), atol=2e-5)


def test_dynamic_ntk_updates_and_reverts():
    rope = nn.DynamicRotaryEmbedding(32, 4, 10000.0, 8, factor=2.0)
    np.testing.assert_allclose(run_table(rope), table(hf_inv_freq(10000.0, 8), 16), atol=2e-5)
    rope.maybe_update_freqs(np.arange(20))  # longer than 8: grow and NTK-scale the base
    assert rope.max_seq_len_cached == 20
    got = run_table(rope)
    assert got.shape == (40, 4, 2)
    np.testing.assert_allclose(got, table(hf_dynamic(10000.0, 8, 20, 8, 2.0), 40), atol=5e-5)
    rope.maybe_update_freqs(np.arange(12))  # shorter than the cached 20 but above 8: unchanged
    assert rope.max_seq_len_cached == 20
    rope.maybe_update_freqs(np.arange(4))  # back below the original: restore
    assert rope.max_seq_len_cached == 8
    np.testing.assert_allclose(run_table(rope), table(hf_inv_freq(10000.0, 8), 16), atol=2e-5)
    # A graph value's length is its last dim.
    with Graph("p", input_types=[TensorType(DType.int64, [30])]) as g:
        rope.maybe_update_freqs(g.inputs[0].tensor)
        g.output(rope.freqs_cis)
    assert rope.max_seq_len_cached == 30
    assert execute(g, np.arange(30))[0].shape == (60, 8)


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_matches_hf(rng, truncate):
    p = nn.YarnScalingParams(
        factor=4.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=64, truncate=truncate
    )
    rope = nn.YarnRotaryEmbedding(dim=64, n_heads=2, theta=10000.0, max_seq_len=32, scaling_params=p, interleaved=False)
    inv, attn = hf_yarn(10000.0, 32, 4.0, 32.0, 1.0, 64, truncate)
    assert attn > 1
    np.testing.assert_allclose(run_table(rope), table(inv, 64, attn), atol=3e-5)
    x = rng.normal(size=(2, 4, 2, 32)).astype(np.float32)
    np.testing.assert_allclose(
        run_apply(rope, x, start_pos=3), np_rope(x, table(inv, 7, attn)[3:], False), rtol=1e-4, atol=1e-4
    )


def test_deepseek_yarn_matches_hf(rng):
    p = nn.DeepseekYarnRopeScalingParams(
        scaling_factor=40.0,
        original_max_position_embeddings=64,
        beta_fast=32,
        beta_slow=1,
        mscale=0.707,
        mscale_all_dim=1.0,
    )
    rope = nn.DeepseekYarnRotaryEmbedding(
        dim=16, n_heads=4, theta=10000.0, max_seq_len=24, head_dim=24, scaling_params=p
    )
    inv, attn = hf_yarn(10000.0, 16, 40.0, 32, 1, 64, True, mscale=0.707, mscale_all_dim=1.0)
    got = run_table(rope)
    assert got.shape == (24, 8, 2)  # (max_seq_len, rope_dim // 2, 2)
    np.testing.assert_allclose(got, table(inv, 24, attn), atol=3e-5)
    m = 0.1 * 1.0 * math.log(40.0) + 1.0
    assert rope.compute_scale() == pytest.approx(24**-0.5 * m * m)
    x = rng.normal(size=(1, 5, 3, 16)).astype(np.float32)
    np.testing.assert_allclose(run_apply(rope, x), np_rope(x, table(inv, 5, attn), True), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="scaling_params"):
        nn.DeepseekYarnRotaryEmbedding(16, 4, 10000.0, 8).compute_scale()


def test_longrope_stitched_table_and_scale():
    short = list(np.linspace(1.0, 1.5, 4))
    long = list(np.linspace(2.0, 8.0, 4))
    p = nn.LongRoPEScalingParams(
        short_factor=short, long_factor=long, original_max_position=10, max_position_embeddings=40
    )
    rope = nn.LongRoPERotaryEmbedding(32, 4, 10000.0, 16, scaling_params=p)
    inv = hf_inv_freq(10000.0, 8)
    ref = np.concatenate([table(inv / np.array(short), 10), table(inv / np.array(long), 32, start=10)])
    np.testing.assert_allclose(run_table(rope), ref, atol=3e-5)
    attn = math.sqrt(1 + math.log(4.0) / math.log(10))
    # HF scales cos and sin (so q and k) by attn: logits scale by attn**2.
    assert rope.compute_scale() == pytest.approx(8**-0.5 * attn * attn)
    assert rope.compute_scale(0.5) == 0.5
    with pytest.raises(ValueError, match="short_factor needs head_dim // 2 = 4"):
        nn.LongRoPERotaryEmbedding(32, 4, 10000.0, 16, scaling_params=nn.LongRoPEScalingParams([1.0], long, 10, 40))


def test_precomputed_freqs_and_scale():
    pre = table(hf_inv_freq(10000.0, 8), 6).astype(np.float32).reshape(6, 8)  # flat layout is accepted too
    rope = nn.RotaryEmbedding(32, 4, 10000.0, 3, _freqs_cis=pre)
    np.testing.assert_allclose(run_table(rope), pre.reshape(6, 4, 2))
    assert rope.compute_scale() == pytest.approx(1 / math.sqrt(8)) and rope.compute_scale(0.1) == 0.1


def test_table_is_rebuilt_for_each_graph():
    rope = nn.RotaryEmbedding(32, 4, 10000.0, 4)
    a, b = run_table(rope), run_table(rope)
    np.testing.assert_array_equal(a, b)


def test_bad_inputs_raise_clear_errors(rng):
    rope = nn.RotaryEmbedding(32, 4, 10000.0, 8)
    for shape, msg in [([2, 5, 8], "rank 3"), ([2, 5, 3, 6], r"head_dim=8")]:
        with (
            Graph("bad", input_types=[TensorType(DType.float32, shape)]) as g,
            pytest.raises(ValueError, match=f"RotaryEmbedding: .*{msg}"),
        ):
            rope(g.inputs[0].tensor)
    with (
        Graph("int", input_types=[TensorType(DType.int32, [1, 2, 3, 8])]) as g,
        pytest.raises(ValueError, match="floating-point"),
    ):
        rope(g.inputs[0].tensor)
    with pytest.raises(ValueError, match="head_dim must be even"):
        nn.RotaryEmbedding(30, 2, 10000.0, 8)
    with pytest.raises(ValueError, match="n_heads must be a positive int"):
        nn.RotaryEmbedding(32, 0, 10000.0, 8)
    with pytest.raises(TypeError, match="scaling_params"):
        nn.Llama3RotaryEmbedding(32, 4, 10000.0, 8, scaling_params=nn.YarnScalingParams(2.0, 32, 1, 8, True))


def test_public_module_names():
    for name in re_mod.__all__:
        assert getattr(nn, name) is getattr(re_mod, name)
