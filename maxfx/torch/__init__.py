"""``max.torch``: MAX's PyTorch custom ops, which need Mojo and so are not available on maxfx.

MAX's `CustomOpLibrary` compiles a folder of Mojo kernels into PyTorch custom ops,
and `graph_op` turns a MAX graph function into a ``torch.compile``-able PyTorch op
run by MAX's Mojo kernels. maxfx runs graphs on JAX and has no Mojo compiler, so
both raise `MojoKernelsUnavailableError`, saying so. The maxfx ways to the same
ends: a custom op written as a JAX function (``maxfx.graph.ops.custom`` with an op
registered in ``lowering.registry``), and tensors exchanged with PyTorch through
DLPack (``Tensor.from_dlpack``, ``torch.from_dlpack``) with the dtype helpers of
``maxfx.experimental.torch``.

Example:
    >>> CustomOpLibrary("my_kernels")
    Traceback (most recent call last):
    maxfx.torch.MojoKernelsUnavailableError: max.torch.CustomOpLibrary needs Mojo: ...
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["CustomOpLibrary", "MojoKernelsUnavailableError", "graph_op"]

_ALTERNATIVES = (
    "maxfx runs on JAX and has no Mojo compiler. Write the kernel as a JAX function and call it through "
    "maxfx.graph.ops.custom "
    "(an op registered in lowering.registry), and pass tensors to and from PyTorch with DLPack (Tensor.from_dlpack, "
    "torch.from_dlpack)"
)


class MojoKernelsUnavailableError(RuntimeError):
    """A MAX feature that compiles or runs Mojo kernels, which maxfx (on JAX) cannot do."""


class CustomOpLibrary:
    """MAX: the Mojo custom ops of ``kernel_library`` as PyTorch ops (``CustomOpLibrary("my_library").grayscale``).

    Args:
        kernel_library: a folder of Mojo kernels, or a compiled ``.mojopkg`` / kernel library.

    Raises:
        MojoKernelsUnavailableError: always: loading Mojo kernels needs the Mojo compiler and MAX's runtime.
    """

    def __init__(self, kernel_library: str | os.PathLike[str] | Any) -> None:
        raise MojoKernelsUnavailableError(
            f"max.torch.CustomOpLibrary needs Mojo: it compiles the Mojo kernels of {str(kernel_library)!r} into "
            f"PyTorch custom ops. {_ALTERNATIVES}"
        )


def graph_op(
    fn: Callable[..., Any] | None = None,
    name: str | None = None,
    kernel_library: Any = None,
    input_types: Any = None,
    output_types: Any = None,
    num_outputs: int | None = None,
) -> Any:
    """MAX: a decorator making a MAX graph function a PyTorch custom op (destination-passing, ``torch.compile``-able).

    Used bare (``@graph_op``) or with options (``@graph_op(name=..., num_outputs=2)``);
    the error comes when a function is given, i.e. when the op would be built.

    Raises:
        MojoKernelsUnavailableError: MAX compiles the graph with its Mojo kernels (and ``kernel_library``'s) for PyTorch
        to call.
        ValueError: ``num_outputs`` below 1, or disagreeing with ``output_types``.
    """
    if num_outputs is not None and (
        isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs < 1
    ):
        raise ValueError(f"graph_op: num_outputs must be an int >= 1, got {num_outputs!r}")
    if num_outputs is not None and output_types is not None and len(output_types) != num_outputs:
        raise ValueError(f"graph_op: num_outputs ({num_outputs}) must match the {len(output_types)} output_types")
    if fn is None:
        return lambda f: graph_op(
            f,
            name=name,
            kernel_library=kernel_library,
            input_types=input_types,
            output_types=output_types,
            num_outputs=num_outputs,
        )
    op = name or getattr(fn, "__name__", repr(fn))
    raise MojoKernelsUnavailableError(
        f"max.torch.graph_op needs Mojo: MAX compiles the graph of {op!r} with its Mojo kernels into a PyTorch custom "
        f"op. {_ALTERNATIVES}"
    )
