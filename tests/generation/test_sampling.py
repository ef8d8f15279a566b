"""The engine's per-row sampling filters and penalties against numpy written from their definitions."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.generation._sampling import SamplingRows, choose, filter_logits, penalize, seed_key


def np_filter(x, top_k, top_p, min_p):
    """Hugging Face's order: top-k, then top-p (nucleus), then min-p; ties at a threshold kept."""
    out = x.astype(np.float64).copy()
    v = x.shape[-1]
    for b in range(x.shape[0]):
        row = out[b]
        k = v if top_k[b] <= 0 else min(top_k[b], v)
        kth = np.sort(row)[::-1][k - 1]
        row[row < kth] = -np.inf
        order = np.argsort(-row, kind="stable")
        ranked = row[order][:k]
        p = np.exp(ranked - ranked.max())
        p /= p.sum()
        before = np.cumsum(p) - p
        kept = ranked[before < top_p[b]]
        row[row < kept.min()] = -np.inf
        q = np.exp(row - row.max())
        q /= q.sum()
        row[q < min_p[b] * q.max()] = -np.inf
    return out


@pytest.mark.parametrize("seed", range(4))
def test_filters_equal_numpy(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((6, 50)).astype(np.float32) * 3
    top_k = np.array([-1, 1, 5, 50, 10, 3], np.int32)
    top_p = np.array([1.0, 1.0, 0.9, 0.5, 0.3, 1.0], np.float32)
    min_p = np.array([0.0, 0.0, 0.0, 0.1, 0.0, 0.5], np.float32)
    got = np.asarray(filter_logits(jnp.asarray(x), jnp.asarray(top_k), jnp.asarray(top_p), jnp.asarray(min_p)))
    want = np_filter(x, top_k, top_p, min_p)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[~np.isinf(got)], want[~np.isinf(want)], rtol=1e-6)


def test_penalties_equal_numpy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 20)).astype(np.float32) * 2
    counts = rng.integers(0, 3, (3, 20))
    seen = (counts > 0) | (rng.random((3, 20)) < 0.2)
    freq, pres, rep = np.array([0.5, 0.0, 1.0]), np.array([0.0, 1.5, 0.2]), np.array([1.3, 1.0, 2.0], np.float32)
    bias = (-(freq[:, None] * counts) - pres[:, None] * (counts > 0)).astype(np.float32)
    got = np.asarray(penalize(jnp.asarray(x), jnp.asarray(bias), jnp.asarray(rep), jnp.asarray(seen)))
    want = x.astype(np.float64).copy()
    for b in range(3):
        for t in range(20):
            if seen[b, t]:
                want[b, t] = want[b, t] / rep[b] if want[b, t] > 0 else want[b, t] * rep[b]
            want[b, t] -= freq[b] * counts[b, t] + pres[b] * (counts[b, t] > 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_greedy_rows_take_the_argmax_and_sampled_rows_stay_in_their_set():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 30)).astype(np.float32)
    rows = [
        dict(temperature=0.0),
        dict(temperature=1.0, top_k=3, seed=1),
        dict(temperature=0.7, top_p=0.5, seed=2),
        dict(temperature=1.2, min_p=0.3, seed=3),
    ]
    allowed = np_filter(
        x / np.array([1, 1, 0.7, 1.2])[:, None],
        np.array([-1, 3, -1, -1]),
        np.array([1, 1, 0.5, 1]),
        np.array([0, 0, 0, 0.3]),
    )
    for step in range(20):
        params = SamplingRows.build(rows, [step] * 4)
        tok = np.asarray(choose(jnp.asarray(x), [jnp.asarray(a) for a in params.arrays()], filters=True, sample=True))
        assert tok[0] == np.argmax(x[0])
        for b in (1, 2, 3):
            assert np.isfinite(allowed[b, tok[b]])


def test_sampling_frequencies_follow_the_softmax():
    x = np.log(np.array([[0.5, 0.3, 0.2]], np.float32))
    draws = []
    for step in range(3000):
        params = SamplingRows.build([dict(temperature=1.0, seed=11)], [step])
        draws.append(
            int(
                np.asarray(
                    choose(jnp.asarray(x), [jnp.asarray(a) for a in params.arrays()], filters=False, sample=True)
                )[0]
            )
        )
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.03)


def test_seed_key_folds_64_bit_seeds():
    assert seed_key(5) == np.uint32(5)
    assert seed_key((1 << 32) + 5) == np.uint32(4)
    assert seed_key(-1) == np.uint32(0)
