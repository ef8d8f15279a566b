"""max.experimental.nn.dropout.Dropout (MAX keeps it at that path only): pass-through at inference, inverted dropout
given a PRNG key.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.experimental.nn import Linear, Sequential
from maxfx.experimental.nn.dropout import Dropout
from maxfx.experimental.tensor import Tensor


def test_inference_returns_the_input_as_max_does():
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert Dropout(0.3)(x) is x
    assert Dropout()(x) is x and Dropout().p == 0.5


def test_a_key_drops_with_probability_p_and_rescales():
    p = 0.3
    x_np = np.random.default_rng(0).standard_normal((200, 100)).astype(np.float32)
    key = jax.random.key(7)
    out = Dropout(p)(Tensor(x_np), key=key).to_numpy()
    keep = np.asarray(jax.random.bernoulli(key, 1 - p, x_np.shape))  # the mask, drawn independently
    np.testing.assert_allclose(out, np.where(keep, x_np / (1 - p), 0.0), rtol=1e-6)
    assert abs((out == 0).mean() - p) < 0.02
    jitted = jax.jit(lambda x, k: Dropout(p)(x, key=k))
    np.testing.assert_allclose(jitted(Tensor(x_np), key).to_numpy(), out, rtol=1e-6)


def test_gradients_flow_through_kept_elements_only():
    p = 0.5
    net = Sequential(Linear(4, 4), Dropout(p))
    x = Tensor(np.ones((3, 4), np.float32))
    key = jax.random.key(3)

    def loss(x):
        return jnp.sum(net[1](net[0](x), key=key))

    grad = np.asarray(jax.grad(loss)(x))
    w = net[0].weight.to_numpy()
    keep = np.asarray(jax.random.bernoulli(key, 1 - p, (3, 4)))
    np.testing.assert_allclose(grad, (keep / (1 - p)) @ w, rtol=1e-5)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, "0.5", True])
def test_p_must_be_a_probability_below_one(p):
    with pytest.raises(ValueError, match=r"Dropout: p must be a probability in \[0, 1\)"):
        Dropout(p)


@pytest.mark.parametrize(
    "module", ["maxfx.experimental.nn.dropout", "maxfx.experimental.nn.rope", "maxfx.experimental.nn.rope.rope"]
)
def test_docstring_examples_run(module):
    """Also MAX's module paths: ``max.experimental.nn.dropout`` and the ``rope`` package with its ``rope`` module."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
