"""Helpers shared by the Pallas kernel tests: GPU detection, warning filter, jaxpr and CUDA-export probes."""

from __future__ import annotations

import warnings

import jax
import pytest

from lowering.targets import has_local_gpu

HAS_GPU = has_local_gpu()


@pytest.fixture(autouse=True)
def quiet_triton():
    """Silence JAX's Triton-backend deprecation warning (import it into a test module to apply it there)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Triton backend is deprecated.*")
        yield


def uses_pallas(f, *args) -> bool:
    return "pallas_call" in str(jax.make_jaxpr(f)(*args))


def cuda_module(f, *args) -> str:
    """MLIR text of jitted ``f`` exported for CUDA from the CPU (`lowering.targets`: an abstract H100 stands in
    where no GPU is attached, Triton custom calls allowed)."""
    from jax import export

    from lowering.targets import export_checks, lowering_for

    with lowering_for(("cuda",)):
        exp = export.export(f, platforms=["cuda"], disabled_checks=export_checks(("cuda",)))(*args)
    return exp.mlir_module()
