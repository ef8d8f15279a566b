"""Shared pytest setup: CPU only, deterministic numpy RNG."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MAXFX_DEFAULT_DEVICE", "cpu")
# Several xdist workers may share one GPU: allocate on demand instead of 75% each.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from maxfx import driver  # noqa: E402


@pytest.fixture
def rng():
    """A seeded numpy Generator (tests must not depend on global random state)."""
    return np.random.default_rng(0)


@pytest.fixture
def float_products(monkeypatch):
    """Programs traced in the test keep off the CPU kernels (``MAXFX_CPU_KERNELS=0``): float products throughout.

    The switch is read when a program is traced, so JAX's trace caches and
    maxfx's executables are dropped on the way in and out (no program made
    either way leaks across).
    """
    import jax  # noqa: PLC0415

    from lowering.compile import clear_cache  # noqa: PLC0415

    def clear():
        jax.clear_caches()
        clear_cache()

    monkeypatch.setenv("MAXFX_CPU_KERNELS", "0")
    clear()
    yield
    monkeypatch.delenv("MAXFX_CPU_KERNELS")
    clear()


@pytest.fixture
def virtual_cuda():
    """Virtual-device mode with one CUDA sm_80 device (``Accelerator(0)``); everything reset afterwards."""
    driver.set_virtual_device_api("cuda")
    driver.set_virtual_device_target_arch("sm_80")
    driver.set_virtual_device_count(1)
    try:
        yield
    finally:
        driver.set_virtual_device_count(0)
        driver.set_virtual_device_api("")
        driver.set_virtual_device_target_arch("")
