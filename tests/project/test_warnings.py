"""No warnings from maxfx's own code under plain ``jax.jit`` (issue 18 item 8).

Two halves. First, representative ops and a Module forward traced by a plain
``jax.jit`` with every warning turned into an error: before the fix, ``band_part``
and ``argmax`` printed JAX's int64-truncation ``UserWarning`` from inside maxfx.
Second, the pytest configuration that keeps the whole suite honest: a warning
attributed to a ``maxfx``, ``lowering`` or ``custom_calls`` module fails the
test that triggers it, while a warning attributed to user code does not.
Expected values come from numpy.
"""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

from maxfx.experimental import functional as F
from maxfx.experimental import nn
from maxfx.experimental.tensor import Tensor

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
X = (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0) * np.float32(0.5)
W = np.linspace(-1.0, 1.0, 20, dtype=np.float32).reshape(4, 5)
IDX = np.array([2, 0, 2], dtype=np.int32)

# (name, fn traced by jax.jit on X, numpy reference on X)
CASES = [
    ("band_part", lambda a: F.band_part(a, num_lower=1, num_upper=0), lambda x: np.tril(np.triu(x, -1), 0)),
    ("argmax", lambda a: F.argmax(a, axis=-1), lambda x: np.argmax(x, axis=-1)[:, None]),
    ("gather", lambda a: F.gather(a, Tensor(IDX), axis=0), lambda x: x[IDX]),
    ("matmul", lambda a: F.matmul(a, Tensor(W)), lambda x: x @ W),
]


@pytest.mark.parametrize("name,fn,ref", CASES, ids=[c[0] for c in CASES])
def test_op_under_plain_jax_jit_warns_nothing(name, fn, ref):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jax.jit(fn)(X)  # a fresh jit: the op is traced (where JAX would warn) here
    np.testing.assert_allclose(np.asarray(out), ref(X), rtol=1e-6)


def test_module_forward_under_plain_jax_jit_warns_nothing():
    layer = nn.Linear(4, 2)
    w, b = layer.weight.to_numpy(), layer.bias.to_numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jax.jit(lambda m, a: m(a))(layer, X)
    np.testing.assert_allclose(np.asarray(out), X @ w.T + b, rtol=1e-5, atol=1e-6)


# ─── the pytest configuration ─────────────────────────────────────────────


def test_pyproject_turns_maxfx_warnings_into_errors():
    filters = tomllib.loads(PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]
    for package in ("maxfx", "lowering", "custom_calls"):
        assert f"error:::{package}(\\..*)?$" in filters
    assert "error:Explicitly requested dtype:UserWarning" in filters


@pytest.mark.parametrize("module", ["maxfx", "maxfx.nn._basic", "lowering.ops.shape", "custom_calls.qmatmul.dispatch"])
def test_warning_attributed_to_maxfx_fails_the_test(module):
    # warn_explicit attributes the warning to `module`, as a warn() from that module's code would be.
    with pytest.raises(UserWarning, match="from inside"):
        warnings.warn_explicit("from inside", UserWarning, f"{module.replace('.', '/')}.py", 1, module=module)


def test_jax_truncation_warning_fails_the_test():
    # JAX attributes this one to its own frames, so the module filters alone miss it.
    with pytest.raises(UserWarning, match="Explicitly requested dtype int64"):
        warnings.warn_explicit(
            "Explicitly requested dtype int64 requested in astype is not available",
            UserWarning,
            "jax/_src/numpy/array_methods.py",
            1,
            module="jax._src.numpy.array_methods",
        )


@pytest.mark.parametrize("module", ["tests.user_code", "maxfx_plugin", "my_lowering"])
def test_warning_attributed_to_other_code_stays_a_warning(module):
    # Deliberate user-facing warnings point their stacklevel at the caller: they must stay warnings.
    with warnings.catch_warnings(record=True) as caught:  # keeps the configured filters
        warnings.warn_explicit("user level", UserWarning, "user.py", 1, module=module)
    assert [str(w.message) for w in caught] == ["user level"]
