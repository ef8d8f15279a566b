"""Helpers shared by the Pallas kernel tests: GPU detection, warning filter, jaxpr and CUDA-export probes."""

from __future__ import annotations

import warnings

import jax
import pytest


def _has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


HAS_GPU = _has_gpu()


@pytest.fixture(autouse=True)
def quiet_triton():
    """Silence JAX's Triton-backend deprecation warning (import it into a test module to apply it there)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Triton backend is deprecated.*")
        yield


def uses_pallas(f, *args) -> bool:
    return "pallas_call" in str(jax.make_jaxpr(f)(*args))


def cuda_module(f, *args) -> str:
    """MLIR text of jitted ``f`` exported for CUDA from the CPU (abstract H100; Triton custom calls allowed)."""
    from jax import export
    from jax.experimental.pallas import triton as pltriton
    from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

    h100 = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu")
    with use_abstract_mesh(AbstractMesh((1,), ("x",), (AxisType.Explicit,), abstract_device=h100)):
        exp = export.export(
            f, platforms=["cuda"], disabled_checks=[export.DisabledSafetyCheck.custom_call(pltriton.CUSTOM_CALL_TARGET_NAME)]
        )(*args)
    return exp.mlir_module()
