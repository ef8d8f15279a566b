"""Shared pytest setup: CPU only, deterministic numpy RNG."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MAXFX_DEFAULT_DEVICE", "cpu")
# Several xdist workers may share one GPU: allocate on demand instead of 75% each.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    """A seeded numpy Generator (tests must not depend on global random state)."""
    return np.random.default_rng(0)
