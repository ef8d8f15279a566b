"""``swish_glu`` of ``max.nn.kernels``: the gated MLP product ``silu(a @ b0.T) * (a @ b1.T)``.

Example:
    >>> from maxfx.nn import kernels
    >>> callable(kernels.swish_glu)
    True
"""

from __future__ import annotations

from typing import Any

from maxfx.graph import ops

__all__ = ["swish_glu"]


def swish_glu(a: Any, b0: Any, b1: Any) -> Any:
    """``silu(a @ b0.T) * (a @ b1.T)`` with ``b0``, ``b1`` of shape ``[N, K]``.

    Example:
        >>> y = swish_glu(x, gate_w, up_w)  # doctest: +SKIP
    """
    a, b0, b1 = (ops.constant(v, None, None) if getattr(v, "type", None) is None else v for v in (a, b0, b1))
    if b0.rank != 2 or b1.rank != 2 or list(b0.shape) != list(b1.shape) or b0.shape[1] != a.shape[-1]:
        raise ValueError(
            f"swish_glu: b0 and b1 must both be [N, {a.shape[-1]}], got {list(b0.shape)} and {list(b1.shape)}"
        )
    return ops.silu(a @ b0.T) * (a @ b1.T)
