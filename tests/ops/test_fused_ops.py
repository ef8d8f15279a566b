"""The serving ops (lowering/ops/float8.py, moe.py, lora.py, ragged.py, sampling.py) against numpy loops."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import Graph, TensorType, ops
from tests.ops.harness import run_op

F8 = ml_dtypes.float8_e4m3fn
F8_MAX = 448.0


def np_expand(s, shape):
    """Numpy reference of block-scale broadcasting: element ``(i, j)`` takes the scale of its block.

    A block covers ``ceil(rows / s_rows)`` rows and ``ceil(cols / s_cols)`` columns
    (the last block may be partial), so the scale index is ``(i // block_rows, j // block_cols)``.
    """
    rows, cols = shape[-2], shape[-1]
    block_rows, block_cols = -(-rows // s.shape[-2]), -(-cols // s.shape[-1])
    i = np.arange(rows)[:, None] // block_rows
    j = np.arange(cols)[None, :] // block_cols
    return s[..., i, j]


def test_quantize_static(rng):
    x = rng.normal(size=(3, 8)).astype(np.float32) * 100
    s = np.array([0.5], np.float32)
    got = run_op(lambda a, b: ops.quantize_static_float8(a, b), x, s)
    assert got.dtype == F8
    np.testing.assert_array_equal(
        got.astype(np.float32), np.clip(x * 0.5, -F8_MAX, F8_MAX).astype(F8).astype(np.float32)
    )
    got = run_op(lambda a, b: ops.quantize_static_float8(a, b, scale_is_inverted=False), x, s)
    np.testing.assert_array_equal(
        got.astype(np.float32), np.clip(x / 0.5, -F8_MAX, F8_MAX).astype(F8).astype(np.float32)
    )


@pytest.mark.parametrize("group", [-1, 4])
def test_quantize_dynamic(rng, group):
    x = rng.normal(size=(5, 8)).astype(np.float32)
    x[2] = 0.0  # all-zero group: scale 0, q 0
    q, s = run_op(lambda a: ops.quantize_dynamic_float8(a, group, scale_ub=2.0), x)
    g = 8 if group == -1 else group
    xr = x.reshape(5, 8 // g, g)
    ref_s = (np.minimum(np.abs(xr).max(-1), 2.0) / F8_MAX).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(s, ref_s)
    safe = np.where(ref_s.astype(np.float32) == 0, 1, ref_s.astype(np.float32))
    ref_q = np.clip(xr / safe[..., None], -F8_MAX, F8_MAX).astype(F8).reshape(5, 8)
    np.testing.assert_array_equal(q.astype(np.float32), ref_q.astype(np.float32))
    deq = q.astype(np.float32).reshape(5, 8 // g, g) * s.astype(np.float32)[..., None]
    clipped = np.clip(xr, -2.0, 2.0)  # scale_ub caps the representable range
    np.testing.assert_allclose(deq, clipped, atol=0.07 * 2.0)


@pytest.mark.parametrize(
    "sa_shape,sb_shape",
    [((1, 1), (1, 1)), ((6, 1), (5, 1)), ((6, 2), (2, 2)), ((1, 16), (5, 16))],
    ids=["tensor", "row", "block", "col"],
)
def test_scaled_matmul(rng, sa_shape, sb_shape):
    a = rng.normal(size=(6, 16)).astype(F8)
    b = rng.normal(size=(5, 16)).astype(F8)
    sa = rng.uniform(0.5, 2, size=sa_shape).astype(np.float32)
    sb = rng.uniform(0.5, 2, size=sb_shape).astype(np.float32)
    got = run_op(lambda *v: ops.scaled_matmul(*v, out_dtype=DType.float32), a, b, sa, sb)
    ref = (a.astype(np.float32) * np_expand(sa, a.shape)) @ (b.astype(np.float32) * np_expand(sb, b.shape)).T
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_scaled_matmul_batched_and_ragged_blocks(rng):
    a = rng.normal(size=(2, 3, 10)).astype(F8)
    b = rng.normal(size=(2, 7, 10)).astype(F8)
    sa = rng.uniform(0.5, 2, size=(2, 3, 3)).astype(np.float32)  # blocks of 4 over K=10: 4+4+2
    sb = rng.uniform(0.5, 2, size=(2, 2, 3)).astype(np.float32)  # blocks of 4 over N=7
    got = run_op(lambda *v: ops.scaled_matmul(*v, out_dtype=DType.float32), a, b, sa, sb)
    da = a.astype(np.float32) * np.stack([np_expand(s, a.shape[1:]) for s in sa])
    db = b.astype(np.float32) * np.stack([np_expand(s, b.shape[1:]) for s in sb])
    np.testing.assert_allclose(got, da @ np.swapaxes(db, 1, 2), rtol=1e-5, atol=1e-4)


def np_moe_indices(ids, n_exp):
    order = np.argsort(np.minimum(ids, n_exp), kind="stable")
    counts = np.bincount(ids[ids < n_exp], minlength=n_exp)
    active = np.nonzero(counts)[0]
    starts = np.concatenate([[0], np.cumsum(counts[active])])
    starts = np.concatenate([starts, np.full(n_exp + 1 - len(starts), starts[-1])])
    eids = np.concatenate([active, np.full(n_exp - len(active), 0xFFFFFFFF)])
    return order, starts, np.argsort(order), eids, np.array([counts.max(), len(active)])


def test_moe_create_indices_and_grouped_matmul(rng):
    ids = np.array([3, 1, 3, 0, 1, 3, 7], np.uint32)  # 7 is another device's expert
    outs = run_op(lambda t: ops.moe_create_indices(t, 4), ids)
    for got, ref in zip(outs, np_moe_indices(ids.astype(np.int64), 4)):
        assert got.dtype == np.uint32
        np.testing.assert_array_equal(got, ref)
    order, starts, _, eids, stats = outs
    h = rng.normal(size=(7, 6)).astype(np.float32)
    w = rng.normal(size=(4, 5, 6)).astype(np.float32)
    got = run_op(lambda *v: ops.grouped_matmul_ragged(*v), h, w, starts, eids, stats)
    ref = np.zeros((7, 5), np.float32)
    for g in range(int(stats[1])):
        ref[starts[g] : starts[g + 1]] = h[starts[g] : starts[g + 1]] @ w[eids[g]].T
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert not got[6].any()  # the non-local token's row

    hq, wq = h.astype(F8), w.astype(F8)
    hs = rng.uniform(0.5, 2, size=(7, 1)).astype(np.float32)
    ws = rng.uniform(0.5, 2, size=(4, 5, 1)).astype(np.float32)
    got = run_op(
        lambda *v: ops.grouped_scaled_matmul_ragged(*v, out_dtype=DType.float32), hq, wq, hs, ws, starts, eids, stats
    )
    hd, wd = hq.astype(np.float32) * hs, wq.astype(np.float32) * ws
    ref = np.zeros((7, 5), np.float32)
    for g in range(int(stats[1])):
        ref[starts[g] : starts[g + 1]] = hd[starts[g] : starts[g + 1]] @ wd[eids[g]].T
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_sgmv(rng):
    x = rng.normal(size=(7, 6)).astype(np.float32)
    lora = rng.normal(size=(3, 4, 6)).astype(np.float32)
    bias = rng.normal(size=(3, 4)).astype(np.float32)
    ids = np.array([2, -1, 0], np.int32)
    ranks = np.array([2, 4, 4], np.int32)
    offsets = np.array([0, 2, 3, 6], np.uint32)  # row 6 has no LoRA
    got = run_op(lambda *v: ops.sgmv(*v, mask_rank=True), x, lora, ids, ranks, offsets, bias)
    ref = np.zeros((7, 4), np.float32)
    for g in range(3):
        if ids[g] < 0:
            continue
        r = slice(offsets[g], offsets[g + 1])
        y = x[r] @ lora[ids[g]].T
        y[:, ranks[g] :] = 0
        ref[r] = y + bias[ids[g]]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _sample(logits, k, temp, p, seed, max_k, use_top_p=True):
    b = logits.shape[0]
    arrs = [logits, np.full(b, k, np.int64), np.full(b, temp, np.float32), np.full(b, p, np.float32), seed]
    return run_op(lambda *v: ops.topk_sampling(*v, max_k=max_k, use_top_p=use_top_p), *arrs)


def test_topk_sampling_greedy_topk_and_distribution(rng):
    logits = rng.normal(size=(4, 10)).astype(np.float32)
    seeds = np.arange(4, dtype=np.uint64)
    np.testing.assert_array_equal(_sample(logits, 1, 1.0, 1.0, seeds, 1), logits.argmax(-1)[:, None])
    np.testing.assert_array_equal(_sample(logits, 5, 0.0, 1.0, seeds, 5), logits.argmax(-1)[:, None])
    n = 4000
    row = np.array([[2.0, 1.0, 0.5, 0.0, -1.0]], np.float32)
    many = np.repeat(row, n, axis=0)
    seeds = np.arange(n, dtype=np.uint64)
    toks = _sample(many, 3, 0.5, 1.0, seeds, 3)[:, 0]
    top3 = np.exp(row[0, :3] / 0.5)
    freq = np.bincount(toks, minlength=5) / n
    np.testing.assert_allclose(freq[:3], top3 / top3.sum(), atol=0.03)
    assert freq[3:].sum() == 0
    # top_p = 0.7: probabilities of the top 3 at T=1 are .63/.23/.14 -> keep 2 tokens.
    toks = _sample(many, 5, 1.0, 0.7, seeds, 5)[:, 0]
    p = np.exp(row[0]) / np.exp(row[0]).sum()
    freq = np.bincount(toks, minlength=5) / n
    np.testing.assert_allclose(freq[:2], p[:2] / p[:2].sum(), atol=0.03)
    assert freq[2:].sum() == 0
    again = _sample(many[:16], 5, 1.0, 1.0, seeds[:16], 5)
    np.testing.assert_array_equal(again, _sample(many[:16], 5, 1.0, 1.0, seeds[:16], 5))  # seeded


def test_merge_ragged_tensors_doc_example():
    a = np.array([1, 2, 3, 4, 5, 6], np.float32)
    b = np.array([7, 8, 9, 10], np.float32)
    merged, off = run_op(ops.merge_ragged_tensors, a, np.array([0, 2, 6], np.uint32), b, np.array([0, 3, 4], np.uint32))
    np.testing.assert_array_equal(merged, [1, 2, 7, 8, 9, 3, 4, 5, 6, 10])
    np.testing.assert_array_equal(off, [0, 5, 10])


def np_penalties(logits, fd, fo, fp, pp, rp):
    out = logits.copy()
    for bi in range(len(fo) - 1):
        for tok, cnt in fd[fo[bi] : fo[bi + 1]]:
            if tok < 0 or cnt <= 0:
                continue
            v = out[bi, tok]
            v = v / rp if v > 0 else v * rp
            out[bi, tok] = v - fp * cnt - pp
    return out


def test_penalties_and_frequency_update(rng):
    logits = rng.normal(size=(2, 6)).astype(np.float32)
    fd = np.array([[1, 2], [4, 1], [-1, 0], [0, 3], [-1, 0], [-1, 0]], np.int32)
    fo = np.array([0, 3, 6], np.uint32)
    scal = [np.array(v, np.float32) for v in (0.5, 0.25, 1.3)]
    got = run_op(ops.apply_penalties, logits, fd, fo, *scal)
    np.testing.assert_allclose(got, np_penalties(logits, fd, fo, 0.5, 0.25, 1.3), rtol=1e-6)
    tokens = np.array([4, 5], np.int64)
    got = run_op(ops.update_frequency_data, fd, fo, tokens)
    ref = fd.copy()
    ref[1] = [4, 2]  # seen: count + 1
    ref[4] = [5, 1]  # new: first empty slot of sequence 1
    np.testing.assert_array_equal(got, ref)
    full = np.array([[1, 1], [2, 1]], np.int32)
    got = run_op(ops.update_frequency_data, full, np.array([0, 2], np.uint32), np.array([3], np.int64))
    np.testing.assert_array_equal(got, full)  # no free slot: dropped


def test_min_p_mask_against_numpy(rng):
    """min_p_mask (the min-p filter of MAX's sampling kernels): tokens below min_p x the row's top probability become
    -inf.
    """
    from lowering.context import bind  # noqa: PLC0415
    from lowering.ops.sampling import min_p_mask_p  # noqa: PLC0415

    logits = (rng.normal(size=(3, 8)) * 2).astype(np.float32)
    min_p, temp = (
        np.array([0.5, 0.0, 0.9], np.float32),
        np.array([1.5, 2.0, 0.0], np.float32),
    )  # row 1: min_p 0, row 2: greedy
    got = run_op(lambda lg, m, t: bind(min_p_mask_p, lg, m, t), logits, min_p, temp)
    probs = np.exp((logits[0] - logits[0].max()) / temp[0])
    np.testing.assert_array_equal(got[0], np.where(probs >= min_p[0], logits[0], -np.inf))
    np.testing.assert_array_equal(got[1:], logits[1:])  # min_p 0 and temperature 0 keep every token


def _np_unpack(packed: np.ndarray, vocab: int) -> np.ndarray:
    """numpy's own bit order (``unpackbits``, little-endian bytes and bits): token t is bit t % 32 of word t // 32."""
    bits = np.unpackbits(packed.astype("<i4").view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab].astype(bool)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16", np.int32])
def test_apply_packed_bitmask_against_numpy(rng, dtype):
    """apply_packed_bitmask (MAX's ``mo.apply_packed_bitmask``): clear bits take the fill value; a logit already -inf
    stays -inf.
    """
    from lowering.context import bind  # noqa: PLC0415
    from lowering.ops.sampling import apply_packed_bitmask_p  # noqa: PLC0415

    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    logits = (rng.normal(size=(2, 3, 70)) * 4).astype(dt)
    if np.dtype(dt).kind == "f":
        logits[0, 1, [3, 40, 69]] = -np.inf  # the model's own exclusions
    packed = rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, size=(2, 3, 3), dtype=np.int32, endpoint=True)
    packed[1, 2] = [
        -1,
        0,
        -(1 << 31),
    ]  # all of word 0, none of word 1, only bit 31 of word 2 (token 95: past the vocab)
    fill = np.array(-5, dt)
    got = run_op(lambda lg, pk, f: bind(apply_packed_bitmask_p, lg, pk, f), logits, packed, fill)
    keep = _np_unpack(packed, 70)
    if np.dtype(dt).kind == "f":
        keep |= np.isneginf(logits.astype(np.float32))
    np.testing.assert_array_equal(got, np.where(keep, logits, fill))
    assert keep[1, 2, :32].all() and not keep[1, 2, 32:].any()


def test_apply_packed_bitmask_errors_name_the_mask():
    from lowering.context import bind  # noqa: PLC0415
    from lowering.ops.sampling import apply_packed_bitmask_p  # noqa: PLC0415

    types = [
        TensorType(DType.float32, [2, 70]),
        TensorType(DType.int32, [2, 2]),
        TensorType(DType.uint32, [2, 3]),
        TensorType(DType.int32, [3, 3]),
    ]
    with Graph("bitmask_errors", input_types=[*types, TensorType(DType.float32, [])]) as g:
        logits, short, unsigned, rows, fill = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError, match=r"apply_packed_bitmask: packed_bitmask's last dim must be ceil\(70 / 32\) = 3"
        ):
            bind(apply_packed_bitmask_p, logits, short, fill)
        with pytest.raises(ValueError, match=r"apply_packed_bitmask: packed_bitmask must be int32"):
            bind(apply_packed_bitmask_p, logits, unsigned, fill)
        with pytest.raises(
            ValueError, match=r"apply_packed_bitmask: packed_bitmask's leading dims must equal the logits'"
        ):
            bind(apply_packed_bitmask_p, logits, rows, fill)


def _np_masked_probs(logits, top_k, temperature, top_p):
    """numpy: softmax(logits / T) over the top-k, then the smallest best set reaching top_p; one-hot argmax when T <=
    0.
    """
    out = np.zeros(logits.shape, np.float64)
    for r, x in enumerate(logits.astype(np.float64)):
        if temperature[r] <= 0:
            out[r, x.argmax()] = 1.0
            continue
        z = x / temperature[r]
        order = np.argsort(-z, kind="stable")[: top_k[r] if top_k[r] > 0 else len(z)]
        p = np.exp(z[order] - z[order].max())
        p /= p.sum()
        keep = order[: int(np.searchsorted(np.cumsum(p), top_p[r] - 1e-12) + 1)] if top_p[r] < 1 else order
        e = np.exp(z[keep] - z[keep].max())
        out[r, keep] = e / e.sum()
    return out


def test_topk_topp_masked_probs_against_numpy(rng):
    """topk_topp_masked_probs (MAX's ``sampler.topk_topp_masked_probs``): the distribution each row samples from."""
    from lowering.context import bind  # noqa: PLC0415
    from lowering.ops.sampling import masked_probs_p  # noqa: PLC0415

    logits = (rng.normal(size=(5, 12)) * 2).astype(np.float32)
    top_k = np.array([3, -1, 12, 5, 1], np.int64)
    temperature = np.array([0.7, 1.0, 2.0, 0.0, 1.0], np.float32)
    top_p = np.array([1.0, 0.6, 0.9, 1.0, 1.0], np.float32)
    got = run_op(lambda *a: bind(masked_probs_p, *a), logits, top_k, temperature, top_p)
    np.testing.assert_allclose(got, _np_masked_probs(logits, top_k, temperature, top_p), atol=1e-6)
    assert got.dtype == np.float32 and np.allclose(got.sum(-1), 1.0, atol=1e-6)


def test_gumbel_argmax_draws_in_proportion_and_repeats_per_seed():
    """gumbel_argmax (MAX's ``sampler.gumbel_argmax_from_probs``): frequencies follow the (unnormalised) probs; a seed
    repeats its draw.
    """
    from lowering.context import bind  # noqa: PLC0415
    from lowering.ops.sampling import gumbel_argmax_p  # noqa: PLC0415

    n = 4000
    weights = np.array([4.0, 0.0, 2.0, 1.0, 1.0], np.float32)  # unnormalised; token 1 impossible
    probs = np.tile(weights, (n, 1))
    seeds = np.arange(n, dtype=np.uint64)
    got = run_op(lambda p, s: bind(gumbel_argmax_p, p, s), probs, seeds)
    assert got.shape == (n,) and got.dtype == np.int64
    freq = np.bincount(got, minlength=5) / n
    assert freq[1] == 0
    np.testing.assert_allclose(freq, weights / weights.sum(), atol=0.03)  # 4000 draws: 3 sigma is about 0.024
    again = run_op(lambda p, s: bind(gumbel_argmax_p, p, s), probs[:8], np.full(8, 17, np.uint64))
    assert len(set(again.tolist())) == 1  # equal seeds draw with equal noise


def test_errors_name_the_op():
    f32, u32 = DType.float32, DType.uint32
    with Graph(
        "e", input_types=[TensorType(f32, [3, 8]), TensorType(DType.float8_e4m3fn, [4, 8]), TensorType(u32, [5])]
    ) as g:
        x, w, ids = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"quantize_static_scaled_float8: scale must be a scalar"):
            ops.quantize_static_float8(x, x)
        with pytest.raises(
            ValueError,
            match=r"quantize_dynamic_scaled_float8: group_size_or_per_token=3 must be -1 or a positive divisor",
        ):
            ops.quantize_dynamic_float8(x, 3)
        with pytest.raises(ValueError, match=r"scaled_matmul: a must have a float8 dtype"):
            ops.scaled_matmul(x, w, x, x)
        with pytest.raises(
            ValueError, match=r"scaled_matmul: scale dim 1 has 5 entries, which is not ceil\(8 / block\)"
        ):
            sw = ops.constant(np.ones((4, 5), np.float32), f32, x.device)
            ops.scaled_matmul(w, w, sw, sw)
        with pytest.raises(ValueError, match=r"moe_create_indices: topk_ids must have rank 1, got float32\[3, 8\]"):
            ops.moe_create_indices(x, 4)
        with pytest.raises(ValueError, match=r"topk_fused_sampling: max_k must be in \[1, vocab_size=8\]"):
            k = ops.constant(np.ones(3, np.int64), DType.int64, x.device)
            t = ops.constant(np.ones(3, np.float32), f32, x.device)
            ops.topk_sampling(x, k, t, t, k, max_k=9)
        with pytest.raises(ValueError, match=r"grouped_matmul_ragged: weight must be \[num_experts, N, 8\]"):
            ops.grouped_matmul_ragged(x, ops.constant(np.ones((2, 4, 6), np.float32), f32, x.device), ids, ids, ids)
        with pytest.raises(ValueError, match=r"merge_ragged_tensors: a and b must have the same dtype"):
            ops.merge_ragged_tensors(x, ids, w, ids)
