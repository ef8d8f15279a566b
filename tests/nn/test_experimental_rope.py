"""The eager Module-API RoPE layers (maxfx.experimental.nn.rope = max.experimental.nn.rope) against a numpy
reference.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from maxfx.driver import CPU
from maxfx.dtype import DType
from maxfx.experimental.nn import Module, rope
from maxfx.experimental.nn.rope import RotaryEmbedding, TransposedRotaryEmbedding, embed, positional_embedding, theta
from maxfx.experimental.tensor import Tensor, TensorType, default_device, default_dtype

# ─── numpy reference, written from the RoFormer formulas ────────────────────


def ref_inv_freq(dim: int, base: float) -> np.ndarray:
    """``base ** (-2i / dim)``, i < dim / 2 (float64, then float32 as the layer's table)."""
    return (base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)).astype(np.float32)


def ref_table(dim: int, base: float, length: int) -> np.ndarray:
    """``(length, dim / 2, 2)`` float32 (cos, sin) of ``p * inv_freq``."""
    angles = (np.arange(length, dtype=np.float64)[:, None] * ref_inv_freq(dim, base).astype(np.float64)).astype(
        np.float32
    )
    return np.stack([np.cos(angles.astype(np.float64)), np.sin(angles.astype(np.float64))], axis=-1).astype(np.float32)


def ref_rope(x: np.ndarray, base: float, start: int, *, interleaved: bool) -> np.ndarray:
    """Rotate ``x: (batch, seq, heads, d)``; pair i is (2i, 2i+1) when interleaved, else (i, i + d/2)."""
    d, seq = x.shape[-1], x.shape[1]
    angles = np.arange(start, start + seq, dtype=np.float64)[:, None] * ref_inv_freq(d, base).astype(np.float64)
    cos, sin = np.cos(angles)[None, :, None, :], np.sin(angles)[None, :, None, :]  # (1, seq, 1, d/2)
    x = x.astype(np.float64)
    if interleaved:
        re, im = x[..., 0::2], x[..., 1::2]
    else:
        re, im = x[..., : d // 2], x[..., d // 2 :]
    out_re, out_im = re * cos - im * sin, re * sin + im * cos
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = out_re, out_im
    else:
        out[..., : d // 2], out[..., d // 2 :] = out_re, out_im
    return out


def interleave_halves(d: int) -> np.ndarray:
    """The permutation taking the half-split layout to the interleaved one: ``[0, d/2, 1, d/2+1, ...]``."""
    return np.stack([np.arange(d // 2), np.arange(d // 2) + d // 2], axis=-1).reshape(-1)


@pytest.fixture(autouse=True)
def _cpu_float32():
    # The table's dtype is the default one (bfloat16 on an accelerator): pin the CPU's float32.
    with default_device(CPU()), default_dtype(DType.float32):
        yield


def rng_x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ─── the table ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("dim,base", [(2, 10000.0), (8, 10000.0), (64, 500000.0), (20, 1.0)])
def test_theta_matches_formula(dim: int, base: float) -> None:
    f = theta(dim, base)
    assert f.dtype == DType.float32 and list(f.shape) == [dim // 2]
    np.testing.assert_array_equal(f.to_numpy(), ref_inv_freq(dim, base))


def test_positional_embedding_matches_formula() -> None:
    t = positional_embedding(dim=16, base=10000.0, max_sequence_length=40)
    assert t.dtype == DType.float32 and [int(d) for d in t.shape] == [40, 8, 2]
    np.testing.assert_allclose(t.to_numpy(), ref_table(16, 10000.0, 40), rtol=1e-6, atol=1e-6)
    # MAX's module-level names, as its tests call them (rope.theta, rope.positional_embedding)
    assert [int(d) for d in rope.positional_embedding(dim=20, base=10000, max_sequence_length=5).shape] == [5, 10, 2]
    assert [int(d) for d in rope.theta(dim=20, base=10000).shape] == [10]


def test_embed_keeps_frequency_dtype() -> None:
    freqs = Tensor(np.array([1.0, 0.25], np.float32)).cast(DType.bfloat16)
    table = embed(freqs, 4)
    assert table.dtype == DType.bfloat16 and [int(d) for d in table.shape] == [4, 2, 2]
    expect = np.stack([np.cos(np.arange(4)[:, None] * [1.0, 0.25]), np.sin(np.arange(4)[:, None] * [1.0, 0.25])], -1)
    np.testing.assert_allclose(table.cast(DType.float32).to_numpy(), expect, atol=1e-2)


def test_theta_default_dtype_follows_defaults() -> None:
    with default_dtype(DType.bfloat16):
        assert theta(8, 10000.0).dtype == DType.bfloat16
        assert positional_embedding(8, 10000.0, 4).dtype == DType.bfloat16


# ─── the layers against the reference ───────────────────────────────────────


# Eager ops compile once per op and shape: the eager tests share one input shape (X) and table
# size, and the other head dims / sequence lengths run under jax.jit (one program per case).
D, L, X = 8, 16, (2, 5, 3, 8)


@functools.cache
def table(dim: int = D, length: int = L) -> Tensor:
    return positional_embedding(dim, 10000.0, length)


LAYOUTS = [(RotaryEmbedding, True), (TransposedRotaryEmbedding, False)]


@pytest.mark.parametrize("cls,interleaved", LAYOUTS)
@pytest.mark.parametrize("start", [0, 4, 11])
def test_forward_matches_reference_eagerly(cls: type, interleaved: bool, start: int) -> None:
    x = rng_x(X, seed=start)
    out = cls(table())(Tensor(x), start_pos=start)
    assert out.dtype == DType.float32 and [int(d) for d in out.shape] == list(X)
    np.testing.assert_allclose(
        out.to_numpy(), ref_rope(x, 10000.0, start, interleaved=interleaved), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("cls,interleaved", LAYOUTS)
@pytest.mark.parametrize("head_dim,seq,start,length", [(2, 1, 0, 4), (64, 7, 100, 128)])
def test_forward_matches_reference_jitted(
    cls: type, interleaved: bool, head_dim: int, seq: int, start: int, length: int
) -> None:
    x = rng_x((2, seq, 3, head_dim), seed=head_dim)
    out = jax.jit(lambda m, x: m(x, start))(cls(table(head_dim, length)), Tensor(x))
    assert [int(d) for d in out.shape] == list(x.shape)
    np.testing.assert_allclose(
        np.asarray(out.to_numpy()), ref_rope(x, 10000.0, start, interleaved=interleaved), rtol=1e-5, atol=1e-5
    )


def test_default_start_pos_is_zero_and_positional_arg() -> None:
    layer = RotaryEmbedding(table())
    x = rng_x(X)
    np.testing.assert_array_equal(layer(Tensor(x)).to_numpy(), layer(Tensor(x), 0).to_numpy())
    np.testing.assert_array_equal(layer(Tensor(x), 4).to_numpy(), layer.forward(Tensor(x), start_pos=4).to_numpy())
    # position 0 is the identity
    np.testing.assert_allclose(layer(Tensor(x), 0).to_numpy()[:, 0], x[:, 0], atol=1e-7)


@pytest.mark.parametrize("start", [0, 11])
def test_layouts_agree_after_permutation(start: int) -> None:
    x_half = rng_x(X, seed=start + 1)
    perm = interleave_halves(D)
    transposed = TransposedRotaryEmbedding(table())(Tensor(x_half), start_pos=start).to_numpy()
    interleaved = RotaryEmbedding(table())(Tensor(np.ascontiguousarray(x_half[..., perm])), start_pos=start).to_numpy()
    np.testing.assert_allclose(interleaved, transposed[..., perm], rtol=1e-6, atol=1e-6)


def test_relative_position_property() -> None:
    # <rope(q, m), rope(k, n)> depends only on m - n.
    layer = RotaryEmbedding(table())
    # the same vector at every sequence index, so row i of rope(v, start) is v at position start + i
    q = np.broadcast_to(rng_x((2, 1, 3, D), 1), X).copy()
    k = np.broadcast_to(rng_x((2, 1, 3, D), 2), X).copy()
    rq0, rq4 = layer(Tensor(q), 0).to_numpy(), layer(Tensor(q), 4).to_numpy()
    rk4, rk11 = layer(Tensor(k), 4).to_numpy(), layer(Tensor(k), 11).to_numpy()

    def dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.sum(a.astype(np.float64) * b, axis=-1)

    np.testing.assert_allclose(
        dot(rq0[:, 4], rk11[:, 0]), dot(rq0[:, 1], rk4[:, 4]), rtol=1e-4, atol=1e-5
    )  # (4, 11) vs (1, 8)
    np.testing.assert_allclose(
        dot(rq4[:, 4], rk11[:, 0]), dot(rq0[:, 1], rk4[:, 0]), rtol=1e-4, atol=1e-5
    )  # (8, 11) vs (1, 4)
    assert not np.allclose(
        dot(rq0[:, 4], rk11[:, 0]), dot(rq0[:, 0], rk11[:, 0]), rtol=1e-3
    )  # other distance, other score
    np.testing.assert_allclose(np.linalg.norm(rk11, axis=-1), np.linalg.norm(k, axis=-1), rtol=1e-5)


def test_custom_weight_is_used_as_given() -> None:
    # A table of all-(0, 1) pairs rotates every pair by 90 degrees: (re, im) -> (-im, re).
    weight = np.zeros((L, D // 2, 2), np.float32)
    weight[..., 1] = 1.0
    x = rng_x(X)
    out = RotaryEmbedding(Tensor(weight))(Tensor(x)).to_numpy()
    np.testing.assert_allclose(out[..., 0::2], -x[..., 1::2])
    np.testing.assert_allclose(out[..., 1::2], x[..., 0::2])
    out_t = TransposedRotaryEmbedding(Tensor(weight))(Tensor(x)).to_numpy()
    np.testing.assert_allclose(out_t, np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], axis=-1))


# ─── module contract (as MAX's tests state it) ──────────────────────────────


def test_attributes_parameters_and_repr() -> None:
    layer = RotaryEmbedding(Tensor.zeros([2, 3, 2]))
    assert layer.dim == 6 and layer.max_sequence_length == 2
    assert repr(layer) == "RotaryEmbedding(dim=6, max_sequence_length=2)"
    assert (
        repr(TransposedRotaryEmbedding(Tensor.zeros([2, 3, 2])))
        == "TransposedRotaryEmbedding(dim=6, max_sequence_length=2)"
    )
    assert dict(layer.parameters) == {"weight": layer.weight}
    assert list(layer.state_dict()) == ["weight"]
    assert isinstance(TransposedRotaryEmbedding(Tensor.zeros([2, 3, 2])), RotaryEmbedding)
    assert isinstance(layer, Module)
    assert RotaryEmbedding(weight=layer.weight).weight is layer.weight
    assert [int(d) for d in layer(Tensor.ones([1, 2, 1, 6]), 0).shape] == [1, 2, 1, 6]


def test_load_state_dict_round_trip() -> None:
    a = RotaryEmbedding(table())
    b = RotaryEmbedding(Tensor.zeros([L, D // 2, 2]))
    b.load_state_dict(a.state_dict())
    x = Tensor(rng_x(X))
    np.testing.assert_array_equal(a(x, 4).to_numpy(), b(x, 4).to_numpy())


# ─── dtypes ─────────────────────────────────────────────────────────────────


def test_dtype_of_result_is_maxs_promotion() -> None:
    x = rng_x(X)
    f32 = RotaryEmbedding(table())
    bf16 = RotaryEmbedding(f32.weight.cast(DType.bfloat16))
    assert bf16(Tensor(x).cast(DType.bfloat16), 1).dtype == DType.bfloat16
    assert f32(Tensor(x).cast(DType.bfloat16), 1).dtype == DType.float32  # bfloat16 x float32 -> float32
    assert bf16(Tensor(x), 1).dtype == DType.float32
    ref = ref_rope(x, 10000.0, 1, interleaved=True)
    np.testing.assert_allclose(
        bf16(Tensor(x).cast(DType.bfloat16), 1).cast(DType.float32).to_numpy(), ref, rtol=5e-2, atol=5e-2
    )


# ─── jax.jit and Module.compile ─────────────────────────────────────────────


@pytest.mark.parametrize("cls", [RotaryEmbedding, TransposedRotaryEmbedding])
def test_runs_under_jax_jit(cls: type) -> None:
    layer = cls(table())
    x = rng_x(X)
    out = jax.jit(lambda m, x: m(x, start_pos=5))(layer, Tensor(x))
    np.testing.assert_allclose(
        np.asarray(out.to_numpy()), ref_rope(x, 10000.0, 5, interleaved=cls is RotaryEmbedding), rtol=1e-5, atol=1e-5
    )
    # the table is a pytree leaf (a parameter), not static metadata
    assert len(jax.tree_util.tree_leaves(layer)) == 1


@pytest.mark.parametrize("cls", [RotaryEmbedding, TransposedRotaryEmbedding])
def test_compile_with_symbolic_seqlen(cls: type) -> None:
    layer = cls(positional_embedding(6, 10000.0, 4))
    compiled = layer.compile(
        TensorType(layer.weight.dtype, ["batch", "seqlen", "n_kv_heads", layer.dim], layer.weight.device)
    )
    assert [int(d) for d in compiled(Tensor.zeros([1, 1, 1, 6])).shape] == [1, 1, 1, 6]
    x = rng_x((3, 4, 5, 6))
    np.testing.assert_allclose(
        compiled(Tensor(x)).to_numpy(),
        ref_rope(x, 10000.0, 0, interleaved=cls is RotaryEmbedding),
        rtol=1e-5,
        atol=1e-5,
    )
    with pytest.raises(ValueError):  # head_dim differs from the compiled type
        compiled(Tensor.zeros([1, 2, 1, 5]))
    with pytest.raises(ValueError):  # more positions than the table has
        compiled(Tensor.zeros([1, 5, 1, 6]))


# ─── errors ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("cls", [RotaryEmbedding, TransposedRotaryEmbedding])
def test_bad_inputs_raise_typed_errors(cls: type) -> None:
    layer = cls(table(D, 8))
    with pytest.raises(ValueError, match="rank 3"):
        layer(Tensor.zeros([2, 3, 8]))
    with pytest.raises(ValueError, match="rank 5"):
        layer(Tensor.zeros([1, 2, 3, 2, 8]))
    with pytest.raises(ValueError, match="even"):
        layer(Tensor.zeros([1, 2, 1, 7]))
    with pytest.raises(ValueError, match="table's dim 8"):
        layer(Tensor.zeros([1, 2, 1, 6]))
    with pytest.raises(ValueError, match="max_sequence_length=8"):
        layer(Tensor.zeros([1, 3, 1, 8]), start_pos=6)
    with pytest.raises(ValueError, match=">= 0"):
        layer(Tensor.zeros([1, 3, 1, 8]), start_pos=-1)
    with pytest.raises(TypeError):
        layer(Tensor.zeros([1, 3, 1, 8]), start_pos=1.5)
    with pytest.raises(ValueError, match="no common dtype"):  # MAX refuses bfloat16 with float16
        RotaryEmbedding(layer.weight.cast(DType.bfloat16))(Tensor.zeros([1, 2, 1, 8], dtype=DType.float16))
    with pytest.raises(ValueError):  # int32 does not promote exactly to float32
        layer(Tensor.zeros([1, 2, 1, 8], dtype=DType.int32))


def test_bad_weight_and_table_arguments() -> None:
    with pytest.raises(TypeError, match="must be a Tensor"):
        RotaryEmbedding(np.zeros((2, 3, 2), np.float32))
    with pytest.raises(ValueError, match="shape"):
        RotaryEmbedding(Tensor.zeros([2, 6]))
    with pytest.raises(ValueError, match="shape"):
        TransposedRotaryEmbedding(Tensor.zeros([2, 3, 3]))
    with pytest.raises(ValueError, match="even"):
        theta(7, 10000.0)
    with pytest.raises(ValueError, match="positive"):
        theta(0, 10000.0)
    with pytest.raises(TypeError):
        theta(8.0, 10000.0)
    with pytest.raises(ValueError, match="positive"):
        theta(8, -2.0)
    with pytest.raises(ValueError, match="positive"):
        positional_embedding(8, 10000.0, 0)
    with pytest.raises(ValueError, match="1-D"):
        embed(Tensor.zeros([2, 2]), 4)
