"""MAX's sampling kernels called by name (``ops.custom("sampler.fused_token_sampling", ...)`` and the others), against
numpy.

The graphs are written as MAX's own tests and pipelines write them (operand
lists of each MAX version); results are checked against numpy: greedy rows equal
``argmax``, sampled tokens stay inside the row's top-k / min-p set, and the
penalty kernels equal a numpy loop over the frequency data.
"""

from __future__ import annotations

import numpy as np
import pytest

from maxfx.driver import Buffer
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops

CPU = DeviceRef.CPU()
B, V = 4, 32


def _fused_graph(layout: str):
    types = [
        TensorType(DType.float32, [B, V], CPU),
        TensorType(DType.uint64, [B], CPU),
        TensorType(DType.float32, [B], CPU),
        TensorType(DType.int64, [B], CPU),
        TensorType(DType.int64, [], CPU),
        TensorType(DType.float32, [B], CPU),
        TensorType(DType.float32, [B], CPU),
    ]
    with Graph("fused_" + layout, input_types=types) as g:
        logits, seed, top_p, top_k, max_k, temperature, min_p = (x.tensor for x in g.inputs)
        one = ops.constant(1.0, DType.float32, CPU)
        values = {
            "5": [top_k, temperature, top_p, seed, logits],
            "6": [top_k, max_k, temperature, top_p, seed, logits],
            "7": [top_k, max_k, temperature, top_p, one, seed, logits],
            "8": [top_k, max_k, temperature, top_p, one, min_p, seed, logits],
        }[layout]
        out = ops.custom(
            "sampler.fused_token_sampling", device=CPU, values=values, out_types=[TensorType(DType.int64, [B, 1], CPU)]
        )[0]
        g.output(out)
    return InferenceSession().load(g)


@pytest.mark.parametrize("layout", ["5", "6", "7", "8"])
def test_fused_token_sampling_stays_in_each_rows_top_k(rng, layout):
    model = _fused_graph(layout)
    logits = rng.standard_normal((B, V)).astype(np.float32)
    top_k = np.array([1, 3, 5, 1], np.int64)
    for seed in range(6):
        out = model.execute(logits, np.full(B, seed, np.uint64), np.ones(B, np.float32), top_k, np.array(5, np.int64),
                            np.ones(B, np.float32), np.zeros(B, np.float32))[0].to_numpy()  # fmt: skip
        assert out.shape == (B, 1) and out.dtype == np.int64
        for row in range(B):
            best = np.argsort(-logits[row])[: top_k[row]]
            assert out[row, 0] in best
        assert out[0, 0] == logits[0].argmax() and out[3, 0] == logits[3].argmax()  # top_k 1: greedy


def test_fused_token_sampling_min_p_keeps_only_likely_tokens(rng):
    model = _fused_graph("8")
    logits = rng.standard_normal((B, V)).astype(np.float32) * 3
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    min_p = np.array([0.5, 0.9, 0.0, 0.2], np.float32)
    seen = [set() for _ in range(B)]
    for seed in range(20):
        out = model.execute(
            logits,
            np.full(B, seed, np.uint64),
            np.ones(B, np.float32),
            np.full(B, V, np.int64),
            np.array(V, np.int64),
            np.ones(B, np.float32),
            min_p,
        )[0].to_numpy()
        for row in range(B):
            seen[row].add(int(out[row, 0]))
    for row in range(B):
        allowed = set(np.nonzero(probs[row] >= min_p[row] * probs[row].max())[0].tolist())
        assert seen[row] <= allowed
    assert len(seen[2]) > 1  # min_p 0: the whole vocabulary, so 20 seeds give several tokens


def test_min_p_sampling_kernel(rng):
    with Graph("min_p", input_types=[TensorType(DType.float32, [B], CPU), TensorType(DType.float32, [B, V], CPU)]) as g:
        min_ps, logits = (x.tensor for x in g.inputs)
        out = ops.custom(
            "min_p_sampling",
            device=CPU,
            values=[min_ps, logits, ops.constant(1.0, DType.float32, CPU)],
            out_types=[TensorType(DType.int64, [B, 1], CPU)],
        )[0]
        g.output(out)
    lg = rng.standard_normal((B, V)).astype(np.float32) * 4
    out = InferenceSession().load(g).execute(np.full(B, 0.99, np.float32), lg)[0].to_numpy()
    probs = np.exp(lg - lg.max(-1, keepdims=True))
    for row in range(B):
        assert probs[row, out[row, 0]] >= 0.99  # only the top token (or ties) passes min_p 0.99


def _numpy_penalties(logits, fd, fo, fp, pp, rp):
    out = logits.copy()
    for b in range(logits.shape[0]):
        for tok, count in fd[fo[b] : fo[b + 1]]:
            if tok < 0:
                continue
            x = out[b, tok]
            x = x / rp[b] if x > 0 else x * rp[b]
            out[b, tok] = x - fp[b] * count - pp[b]
    return out


@pytest.mark.parametrize("per_row", [False, True])
def test_apply_penalties_kernel_in_place(rng, per_row):
    fd = np.array([[3, 2], [7, 1], [-1, 0], [3, 1], [9, 4], [0, 1], [5, 2], [-1, 0]], np.int32)
    fo = np.array([0, 3, 5, 7, 8], np.uint32)
    pen_shape = [B] if per_row else []
    types = [
        BufferType(DType.float32, [B, V], CPU),
        TensorType(DType.int32, [8, 2], CPU),
        TensorType(DType.uint32, [B + 1], CPU),
        *(TensorType(DType.float32, pen_shape, CPU) for _ in range(3)),
    ]
    with Graph("penalties", input_types=types) as g:
        buf, fdv, fov, *pens = g.inputs
        ops.inplace_custom(
            "sampler.apply_penalties", device=CPU, values=[buf, fdv.tensor, fov.tensor, *(p.tensor for p in pens)]
        )
        g.output(buf)
    logits = rng.standard_normal((B, V)).astype(np.float32)
    fp, pp, rp = (
        np.array([0.5, 0.1, 0.0, 1.0], np.float32),
        np.array([0.25, 0.0, 0.5, 0.1], np.float32),
        np.array([2.0, 1.5, 1.0, 1.2], np.float32),
    )
    if not per_row:
        fp, pp, rp = (np.full(B, x[0], np.float32) for x in (fp, pp, rp))
    given = (fp, pp, rp) if per_row else tuple(np.array(x[0], np.float32) for x in (fp, pp, rp))
    out = InferenceSession().load(g).execute(Buffer.from_numpy(logits.copy()), fd, fo, *given)[0].to_numpy()
    np.testing.assert_allclose(out, _numpy_penalties(logits, fd, fo, fp, pp, rp), rtol=1e-6, atol=1e-6)


def test_update_frequency_data_kernel_in_place():
    fd = np.array([[3, 2], [7, 1], [-1, 0], [3, 1], [-1, 0]], np.int32)
    fo = np.array([0, 3, 5], np.uint32)
    with Graph(
        "freq",
        input_types=[
            BufferType(DType.int32, [5, 2], CPU),
            TensorType(DType.uint32, [3], CPU),
            TensorType(DType.int64, [2], CPU),
        ],
    ) as g:
        buf, fov, tokens = g.inputs
        ops.inplace_custom("sampler.update_frequency_data", device=CPU, values=[buf, fov.tensor, tokens.tensor])
        g.output(buf)
    out = (
        InferenceSession().load(g).execute(Buffer.from_numpy(fd.copy()), fo, np.array([7, 11], np.int64))[0].to_numpy()
    )
    expected = fd.copy()
    expected[1] = [7, 2]  # row 0 had token 7: its count grows
    expected[4] = [11, 1]  # row 1 had no 11: its first free slot takes it
    np.testing.assert_array_equal(out, expected)


def test_wrong_operand_count_names_the_kernel():
    with pytest.raises(Exception, match=r"sampler\.fused_token_sampling.*takes 5 or 6 or 7 or 8 values"):
        with Graph("bad", input_types=[TensorType(DType.float32, [B, V], CPU)]) as g:
            ops.custom(
                "sampler.fused_token_sampling",
                device=CPU,
                values=[g.inputs[0].tensor],
                out_types=[TensorType(DType.int64, [B, 1], CPU)],
            )


@pytest.mark.parametrize("fill_as", ["value", "parameter"])
def test_apply_packed_bitmask_by_mo_name(rng, fill_as):
    """``ops.custom("mo.apply_packed_bitmask", ...)`` (MAX's kernel name), fill as its scalar operand or a parameter."""
    vocab = 45
    types = [TensorType(DType.float32, [B, vocab], CPU), TensorType(DType.int32, [B, 2], CPU)]
    with Graph("mo_bitmask_" + fill_as, input_types=types) as g:
        logits, packed = (x.tensor for x in g.inputs)
        out_type = [TensorType(DType.float32, [B, vocab], CPU)]
        if fill_as == "value":
            fill = ops.constant(-9.0, DType.float32, CPU)
            out = ops.custom("mo.apply_packed_bitmask", device=CPU, values=[logits, packed, fill], out_types=out_type)[
                0
            ]
        else:
            out = ops.custom(
                "mo.apply_packed_bitmask",
                device=CPU,
                values=[logits, packed],
                out_types=out_type,
                parameters={"fill_value": -9.0},
            )[0]
        g.output(out)
    logits = rng.standard_normal((B, vocab)).astype(np.float32)
    logits[2, 7] = -np.inf
    packed = rng.integers(-(2**31), 2**31, size=(B, 2), dtype=np.int64).astype(np.int32)
    got = InferenceSession().load(g).execute(logits, packed)[0].to_numpy()
    keep = np.array([[(int(packed[b, t // 32]) >> (t % 32)) & 1 for t in range(vocab)] for b in range(B)], bool)
    keep[2, 7] = True  # -inf stays -inf, as MAX's kernel
    np.testing.assert_array_equal(got, np.where(keep, logits, np.float32(-9.0)))


def test_speculative_sampling_kernels_by_name(rng):
    """``sampler.topk_topp_masked_probs``, ``sampler.fused_token_sampling_with_dist`` and
    ``sampler.gumbel_argmax_from_probs`` by MAX's names.
    """
    f32 = DType.float32
    types = [
        TensorType(f32, [B, V], CPU),
        TensorType(DType.int64, [B], CPU),
        TensorType(f32, [B], CPU),
        TensorType(f32, [B], CPU),
        TensorType(DType.uint64, [B], CPU),
    ]
    with Graph("speculative_kernels", input_types=types) as g:
        logits, k, temperature, top_p, seed = (x.tensor for x in g.inputs)
        probs = ops.custom(
            "sampler.topk_topp_masked_probs",
            device=CPU,
            values=[k, temperature, top_p, logits],
            out_types=[TensorType(f32, [B, V], CPU)],
        )[0]
        max_k = ops.constant(V, DType.int64, CPU)
        tokens, dist = ops.custom(
            "sampler.fused_token_sampling_with_dist",
            device=CPU,
            values=[k, max_k, temperature, top_p, seed, logits],
            out_types=[TensorType(DType.int64, [B], CPU), TensorType(DType.bfloat16, [B, V], CPU)],
        )
        drawn = ops.custom(
            "sampler.gumbel_argmax_from_probs",
            device=CPU,
            values=[seed, probs],
            out_types=[TensorType(DType.int64, [B], CPU)],
        )[0]
        g.output(probs, tokens, dist, drawn)
    model = InferenceSession().load(g)
    logits = rng.standard_normal((B, V)).astype(np.float32) * 2
    k, temperature, top_p = (
        np.array([2, 5, -1, 1], np.int64),
        np.array([1.0, 0.5, 1.0, 1.0], np.float32),
        np.array([1.0, 1.0, 0.5, 1.0], np.float32),
    )
    for s in range(5):
        probs, tokens, dist, drawn = (
            o.to_numpy() for o in model.execute(logits, k, temperature, top_p, np.full(B, s, np.uint64))
        )
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
        for row in range(B):
            best = set(np.argsort(-logits[row])[: k[row] if k[row] > 0 else V].tolist())
            assert set(np.flatnonzero(probs[row]).tolist()) <= best  # top-k mask
            assert tokens[row] in best and probs[row, tokens[row]] > 0 and probs[row, drawn[row]] > 0
        np.testing.assert_allclose(dist.astype(np.float32), probs, atol=4e-3)  # the bfloat16 out_type
        assert tokens[3] == logits[3].argmax() and drawn[3] == logits[3].argmax()  # top_k 1: one token
