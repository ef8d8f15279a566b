"""The functional API (``max.experimental.functional``, also ``maxfx.functional``; ``F``).

Every function here is an op front of the registry (the same function as
``maxfx.graph.ops.X``) wrapped by `functional`: called on eager `Tensor`\\ s it
records lazily and returns Tensors; called on graph values inside a ``Graph``
(or while ``Module.compile`` traces) it records graph ops; called on tracers
inside ``jax.jit`` it runs directly. No op math lives here.

Example:
    >>> from maxfx import functional as F
    >>> from maxfx.tensor import Tensor
    >>> print(F.relu(Tensor.constant([1.0, -2.0, 3.0, -4.0, 5.0])))
    TensorType(dtype=float32, shape=[Dim(5)], device=cpu:0): [1.0, 0.0, 3.0, 0.0, 5.0]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import lowering.ops  # noqa: F401  (registers every op)
from lowering.context import current_context, use_context
from lowering.eager import EAGER
from lowering.registry import fronts as _fronts

# The 89 documented ops of max.experimental.functional (plus `functional` itself).
_DOCUMENTED = (
    "abs add argmax argmin argsort as_interleaved_complex atanh avg_pool2d band_part broadcast_to buffer_store "
    "buffer_store_slice cast chunk concat constant constant_external conv2d conv2d_transpose conv3d cos cumsum custom "
    "div equal erf exp flatten floor fold gather gather_nd gelu greater greater_equal hann_window irfft is_inf is_nan "
    "layer_norm log log1p logical_and logical_not logical_or logical_xor logsoftmax masked_scatter matmul max "
    "max_pool2d mean min mod mul negate nonzero not_equal outer pad permute pow range relu repeat_interleave reshape "
    "round rsqrt scatter scatter_nd sigmoid silu sin slice_tensor softmax split sqrt squeeze stack sub sum tanh tile "
    "top_k transfer_to transpose trunc unsqueeze where"
).split()

# maxfx extensions: registry fronts MAX's functional module lacks (docs/pages/kernels.md). Module
# attributes like the rest, but kept out of __all__, which lists MAX's documented names.
_EXTENSIONS = ("flash_attention",)

__all__ = ["functional", *_DOCUMENTED]


def functional(op: Callable[..., Any]) -> Callable[..., Any]:
    """Make a graph-building function usable on eager Tensors too.

    Outside any ``Graph`` the wrapped function runs in the eager realization
    context (results are lazy `Tensor`\\ s); inside a Graph, or on graph values,
    it records graph ops as before.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> @functional
        ... def swish(x):
        ...     return x * ops.sigmoid(x)
        >>> swish(Tensor.constant([0.0])).item()
        0.0
    """

    @functools.wraps(op)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_context() is None:
            with use_context(EAGER):
                return op(*args, **kwargs)
        return op(*args, **kwargs)

    return wrapper


def _eager_constant(value: Any, dtype: Any = None, device: Any = None) -> Any:
    """A constant tensor from a scalar, nested list or DLPack array (a Tensor outside a Graph).

    Outside a Graph this is `Tensor.constant` (default dtype and device from
    ``defaults()``); inside one it records ``ops.constant``.
    """
    if current_context() is None:
        from maxfx.experimental._tensor import Tensor  # noqa: PLC0415

        return Tensor.constant(value, dtype=dtype, device=device)
    return _fronts()["constant"](value, dtype, device)


def _generate() -> dict[str, Callable[..., Any]]:
    table = _fronts()
    names = [n for n in (*_DOCUMENTED, *_EXTENSIONS) if n != "constant"]
    missing = [n for n in names if n not in table]
    if missing:
        raise ImportError(f"maxfx.functional: no registry front for {missing}")
    out = {name: functional(table[name]) for name in names}
    out["constant"] = functools.update_wrapper(_eager_constant, table["constant"], assigned=("__module__", "__name__", "__qualname__"))
    return out


globals().update(_generate())
