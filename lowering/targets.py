"""Lowering for platforms other than the local one: a CUDA artifact built on a CPU-only machine.

`lowering_for` wraps the tracing of a program that will be lowered for
``platforms``:

* the kernel dispatchers emit the Pallas (Triton) kernels when ``"cuda"`` is
  the only target (`custom_calls._target`), also with no GPU attached; a
  multi-platform program (``("cpu", "cuda")``) takes the portable jnp path
  everywhere, since JAX cannot lower a Pallas call for the CPU branch;
* with no local GPU, an abstract H100 stands in for the device the Triton
  lowering asks about (XLA recompiles the Triton module for the real GPU when
  the artifact is loaded there);
* JAX's notice that its Pallas Triton backend is deprecated is silenced (it
  names no action for users of maxfx).

`export_checks` lists the ``jax.export`` safety checks such a program needs
disabled: Triton custom calls carry no cross-version compatibility guarantee,
so an artifact with them is tied to the jaxlib that built it. `export_for` is the
one ``jax.export`` entry that does both, traced with 64-bit types.

Example:
    >>> from lowering.targets import lowering_for, export_checks
    >>> with lowering_for(("cpu",)):
    ...     pass
    >>> export_checks(("cpu",))
    []
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import jax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

from custom_calls import _target
from lowering.dims import StaticDim, SymbolicDim
from lowering.types import BufferType, TensorType
from lowering.x64 import traced

__all__ = ["lowering_for", "export_checks", "has_local_gpu", "symbolic_input_specs", "ABSTRACT_GPU"]

# What the Triton lowering reads off the device: compute capability (from the kind) and SM count.
ABSTRACT_GPU = {"device_kind": "NVIDIA H100 80GB HBM3", "num_cores": 132}


def has_local_gpu() -> bool:
    """Whether JAX sees a GPU on this machine."""
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@contextlib.contextmanager
def _abstract_gpu() -> Iterator[None]:
    device = AbstractDevice(platform="gpu", **ABSTRACT_GPU)
    with use_abstract_mesh(AbstractMesh((1,), ("_target",), (AxisType.Auto,), abstract_device=device)):
        yield


@contextlib.contextmanager
def lowering_for(platforms: Sequence[str]) -> Iterator[None]:
    """Trace programs inside the block for lowering on ``platforms`` (JAX names: ``"cpu"``, ``"cuda"``)."""
    platforms = tuple(platforms)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_target.lowering_for(platforms))
        if "cuda" in platforms:
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=".*Pallas Triton backend is deprecated.*")
            if not has_local_gpu():
                stack.enter_context(_abstract_gpu())
        yield


def export_checks(platforms: Sequence[str]) -> list:
    """``jax.export`` ``disabled_checks`` for a program lowered for ``platforms`` by `lowering_for`."""
    if "cuda" not in tuple(platforms):
        return []
    from jax.experimental.pallas import triton as pltriton  # noqa: PLC0415 - Pallas' Triton backend loads only for a CUDA export

    return [jax.export.DisabledSafetyCheck.custom_call(pltriton.CUSTOM_CALL_TARGET_NAME)]


def export_for(
    fun: Any, platforms: Sequence[str], *specs: Any, retarget: bool = True, **jit_kwargs: Any
) -> jax.export.Exported:
    """``jax.export`` of ``jax.jit(fun, **jit_kwargs)`` for ``platforms`` on ``specs``, traced with 64-bit types.

    ``retarget``: trace inside `lowering_for` (GPU kernels emitted for a ``"cuda"``
    target with no GPU attached); False for a program lowered for the local device only.
    """
    platforms = tuple(platforms)
    exporter = jax.export.export(
        jax.jit(fun, **jit_kwargs), platforms=platforms, disabled_checks=export_checks(platforms)
    )
    with lowering_for(platforms) if retarget else contextlib.nullcontext():
        return traced(exporter, *specs)


def symbolic_input_specs(types: Sequence[Any], where: str, inputs: str) -> list[jax.ShapeDtypeStruct]:
    """One ``jax.ShapeDtypeStruct`` per input type, for ``jax.export``; symbolic dims are shared by name.

    Args:
        types: tensor or buffer types of the inputs.
        where: the caller, for error messages (``"maxfx.export"``).
        inputs: how the caller's inputs are called in errors (``"exported inputs"``).

    Raises:
        TypeError: an input is neither a tensor nor a buffer.
        ValueError: an input has an algebraic dim (``batch * 2``); only static
            sizes and bare symbols can be exported.
    """
    scope = jax.export.SymbolicScope()
    symbols: dict[str, Any] = {}
    specs = []
    for i, t in enumerate(types):
        if not isinstance(t, (TensorType, BufferType)):
            raise TypeError(f"{where}: input {i} has type {t}; only tensor and buffer {inputs} are supported")
        dims = []
        for d in t.shape:
            if isinstance(d, StaticDim):
                dims.append(d.dim)
            elif isinstance(d, SymbolicDim):
                if d.name not in symbols:
                    (symbols[d.name],) = jax.export.symbolic_shape(d.name, scope=scope)
                dims.append(symbols[d.name])
            else:
                raise ValueError(
                    f"{where}: input {i} has the algebraic dim {d} ({t}); {inputs} take static sizes or bare symbols "
                    "('batch')"
                )
        specs.append(jax.ShapeDtypeStruct(tuple(dims), t.dtype.to_numpy()))
    return specs
