"""maxfx.losses against numpy: rank-0 results, reductions, grads (issue 18 item 5)."""

from __future__ import annotations

import numpy as np
import pytest

import maxfx
from maxfx import losses
from maxfx.experimental import nn
from maxfx.experimental.tensor import Tensor

RNG = np.random.default_rng(0)
P = RNG.standard_normal((4, 3)).astype(np.float32)
T = RNG.standard_normal((4, 3)).astype(np.float32)
LOGITS = RNG.standard_normal((5, 4)).astype(np.float32)
LABELS = np.array([0, 3, 1, 2, 3], np.int32)
BIN = (RNG.random((5, 4)) > 0.5).astype(np.float32)


def _log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _np_xent(logits, labels):
    return -_log_softmax(logits)[np.arange(len(labels)), labels]


def _np_bce(x, y):
    p = 1 / (1 + np.exp(-x))
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


CASES = [
    ("mse", losses.mean_squared_error, (P, T), (P - T) ** 2),
    ("l1", losses.l1_loss, (P, T), np.abs(P - T)),
    ("xent", losses.softmax_cross_entropy_with_integer_labels, (LOGITS, LABELS), _np_xent(LOGITS, LABELS)),
    ("bce", losses.sigmoid_binary_cross_entropy, (LOGITS, BIN), _np_bce(LOGITS, BIN)),
]


@pytest.mark.parametrize("name,fn,args,per", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_match_numpy(name, fn, args, per, reduction):
    out = fn(*[Tensor(a) for a in args], reduction=reduction)
    if reduction == "none":
        assert list(out.shape) == list(per.shape)
        np.testing.assert_allclose(out.to_numpy(), per, rtol=1e-5, atol=1e-6)
        return
    assert out.shape == [], "a loss must be rank 0 for maxfx.grad"
    expect = per.mean() if reduction == "mean" else per.sum()
    np.testing.assert_allclose(out.item(), expect, rtol=1e-5)


@pytest.mark.parametrize("name,fn,args,per", CASES, ids=[c[0] for c in CASES])
def test_losses_under_jit(name, fn, args, per):
    out = maxfx.jit(fn)(*[Tensor(a) for a in args])
    np.testing.assert_allclose(np.asarray(out), per.mean(), rtol=1e-5)


def test_reduce_mean_and_sum_are_rank0():
    x = Tensor(P)
    m, s = losses.reduce_mean(x), losses.reduce_sum(x)
    assert m.shape == [] and s.shape == []
    np.testing.assert_allclose(m.item(), P.mean(), rtol=1e-6)
    np.testing.assert_allclose(s.item(), P.sum(), rtol=1e-5)


def test_mse_grad_matches_numpy():
    g = maxfx.grad(lambda p: losses.mean_squared_error(p, Tensor(T)))(Tensor(P))
    np.testing.assert_allclose(g.to_numpy(), 2 * (P - T) / P.size, rtol=1e-5, atol=1e-7)


def test_xent_grad_matches_numpy():
    g = maxfx.grad(lambda z: losses.softmax_cross_entropy_with_integer_labels(z, Tensor(LABELS)))(Tensor(LOGITS))
    soft = np.exp(_log_softmax(LOGITS))
    expect = (soft - np.eye(4, dtype=np.float32)[LABELS]) / len(LABELS)
    np.testing.assert_allclose(g.to_numpy(), expect, rtol=1e-5, atol=1e-6)


def test_value_and_grad_of_a_module_loss():
    model = nn.Linear(3, 2)
    x, y = Tensor(P), Tensor(T[:, :2])

    def loss_fn(m, x, y):
        return losses.mean_squared_error(m(x), y)

    loss, grads = maxfx.value_and_grad(loss_fn)(model, x, y)
    w, b = model.weight.to_numpy(), model.bias.to_numpy()
    err = P @ w.T + b - T[:, :2]
    np.testing.assert_allclose(np.asarray(loss), (err**2).mean(), rtol=1e-5)
    np.testing.assert_allclose(grads.weight.to_numpy(), 2 * err.T @ P / err.size, rtol=1e-4, atol=1e-6)


def test_bad_inputs_are_named_errors():
    with pytest.raises(ValueError, match="mean_squared_error: predictions and targets must have the same shape"):
        losses.mean_squared_error(Tensor(P), Tensor(T[:2]))
    with pytest.raises(TypeError, match="softmax_cross_entropy_with_integer_labels: labels must be integer"):
        losses.softmax_cross_entropy_with_integer_labels(Tensor(LOGITS), Tensor(LABELS.astype(np.float32)))
    with pytest.raises(ValueError, match="reduction must be one of"):
        losses.l1_loss(Tensor(P), Tensor(T), reduction="avg")
