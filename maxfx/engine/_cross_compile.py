"""Compiling a graph for a virtual device: lowering it for a platform this machine lacks.

In virtual-device mode (``maxfx.driver.set_virtual_device_count``) a graph
placed on a GPU is lowered with ``jax.export`` for the virtual device's
platform (``"cuda"`` or ``"rocm"``), its symbolic dims kept symbolic, its
weights as arguments: the StableHLO that device would run, GPU kernels
included, built on a CPU-only machine. Nothing is allocated and nothing runs.

Example:
    >>> from maxfx.graph import DeviceRef, Graph, TensorType
    >>> from maxfx.dtype import DType
    >>> with Graph("double", input_types=[TensorType(DType.float32, ["n"], DeviceRef.GPU())]) as g:
    ...     g.output(g.inputs[0] * 2)
    >>> exported = lower_for_platform(g._ir, {}, "cuda")
    >>> exported.platforms
    ('cuda',)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from lowering.compile import block_program
from lowering.ir import Block
from lowering.targets import export_for, symbolic_input_specs

__all__ = ["lower_for_platform"]


def lower_for_platform(
    block: Block,
    weights: Mapping[str, tuple[Any, tuple[int, ...]]],
    platform: str,
    where: str = "InferenceSession.compile",
) -> jax.export.Exported:
    """``block`` lowered for the JAX ``platform``: a ``jax.export.Exported`` of `block_program` taking (inputs, None,
    weights by name).

    Args:
        block: the graph's top-level block.
        weights: weight name → (its type, its full shape), as `InferenceSession.compile` finds them.
        platform: a JAX platform name (``"cuda"``, ``"rocm"``).

    Returns:
        The exported program: ``mlir_module()`` is its StableHLO; it returns the
        outputs and the final values of the buffer inputs.

    Raises:
        TypeError / ValueError: an input JAX cannot give an abstract shape.
    """
    specs = symbolic_input_specs([v.type for v in block.inputs], where, "inputs compiled for a virtual device")
    weight_specs = {n: jax.ShapeDtypeStruct(full, t.dtype.to_numpy()) for n, (t, full) in weights.items()}
    # export_for: traced with 64-bit types, inside lowering_for (GPU kernels are emitted for the target even where no
    # GPU is attached).
    return export_for(block_program(block), (platform,), specs, None, weight_specs)
