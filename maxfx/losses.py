"""``maxfx.losses``: scalar losses and all-axis reductions built from MAX ops.

MAX's reductions keep the reduced axis (``F.mean(x, axis=0)`` of a ``[2, 3]``
tensor is ``[1, 3]``) and have no "all axes" form, so a loss that
``maxfx.grad`` can differentiate needs an explicit reduction to rank 0:
`reduce_mean` / `reduce_sum` do that in one call. Every loss here returns a
rank-0 tensor (``reduction="mean"`` or ``"sum"``) or the per-element losses
(``reduction="none"``) and is composed of `maxfx.functional` ops only, so it
runs eagerly, in graphs and under ``maxfx.jit`` / ``maxfx.grad`` alike.

Example:
    >>> import numpy as np
    >>> import maxfx
    >>> from maxfx import losses
    >>> from maxfx.experimental.tensor import Tensor
    >>> pred = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    >>> target = Tensor(np.zeros((2, 2), np.float32))
    >>> losses.mean_squared_error(pred, target).item()
    7.5
    >>> losses.reduce_mean(pred).shape
    []
    >>> maxfx.grad(lambda p: losses.mean_squared_error(p, target))(pred).to_numpy().tolist()
    [[0.5, 1.0], [1.5, 2.0]]
"""

from __future__ import annotations

from typing import Any

from maxfx.experimental import functional as F

__all__ = [
    "reduce_mean",
    "reduce_sum",
    "mean_squared_error",
    "l1_loss",
    "softmax_cross_entropy_with_integer_labels",
    "sigmoid_binary_cross_entropy",
]

_REDUCTIONS = ("mean", "sum", "none")


def reduce_sum(x: Any) -> Any:
    """Sum over all axes as a rank-0 tensor (MAX's ``sum`` keeps one axis per call).

    Example:
        >>> import numpy as np
        >>> from maxfx.losses import reduce_sum
        >>> from maxfx.experimental.tensor import Tensor
        >>> reduce_sum(Tensor(np.ones((2, 3), np.float32))).item()
        6.0
    """
    return F.reshape(F.sum(F.reshape(x, [-1]), axis=0), [])


def reduce_mean(x: Any) -> Any:
    """Mean over all axes as a rank-0 tensor: the one-call scalar for a loss.

    Example:
        >>> import numpy as np
        >>> from maxfx.losses import reduce_mean
        >>> from maxfx.experimental.tensor import Tensor
        >>> m = reduce_mean(Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)))
        >>> m.shape, m.item()
        ([], 2.5)
    """
    return F.reshape(F.mean(F.reshape(x, [-1]), axis=0), [])


def _reduce(name: str, per_element: Any, reduction: str) -> Any:
    if reduction == "mean":
        return reduce_mean(per_element)
    if reduction == "sum":
        return reduce_sum(per_element)
    if reduction == "none":
        return per_element
    raise ValueError(f"{name}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _check_same_shape(name: str, a: Any, b: Any, what: str) -> None:
    sa, sb = list(a.shape), list(b.shape)
    if sa != sb:
        raise ValueError(f"{name}: {what} must have the same shape, got {sa} and {sb}")


def mean_squared_error(predictions: Any, targets: Any, reduction: str = "mean") -> Any:
    """Mean of ``(predictions - targets) ** 2`` over all elements (rank 0).

    Args:
        predictions: a tensor.
        targets: a tensor of the same shape.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per element).

    Example:
        >>> import numpy as np
        >>> from maxfx.losses import mean_squared_error
        >>> from maxfx.experimental.tensor import Tensor
        >>> mean_squared_error(Tensor(np.array([1.0, 3.0], np.float32)), Tensor(np.zeros(2, np.float32))).item()
        5.0
    """
    _check_same_shape("mean_squared_error", predictions, targets, "predictions and targets")
    diff = predictions - targets
    return _reduce("mean_squared_error", diff * diff, reduction)


def l1_loss(predictions: Any, targets: Any, reduction: str = "mean") -> Any:
    """Mean absolute error ``|predictions - targets|`` over all elements (rank 0).

    Example:
        >>> import numpy as np
        >>> from maxfx.losses import l1_loss
        >>> from maxfx.experimental.tensor import Tensor
        >>> l1_loss(Tensor(np.array([1.0, -3.0], np.float32)), Tensor(np.zeros(2, np.float32))).item()
        2.0
    """
    _check_same_shape("l1_loss", predictions, targets, "predictions and targets")
    return _reduce("l1_loss", F.abs(predictions - targets), reduction)


def softmax_cross_entropy_with_integer_labels(logits: Any, labels: Any, reduction: str = "mean") -> Any:
    """Cross-entropy of ``softmax(logits)`` against integer class ``labels`` (rank 0).

    ``-log_softmax(logits)[..., label]`` per example, averaged over the batch
    (``optax.softmax_cross_entropy_with_integer_labels`` followed by a mean).

    Args:
        logits: ``[..., num_classes]`` float tensor.
        labels: ``[...]`` integer tensor of class indices in ``[0, num_classes)``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per example, shape ``[...]``).

    Example:
        >>> import numpy as np
        >>> from maxfx.losses import softmax_cross_entropy_with_integer_labels as xent
        >>> from maxfx.experimental.tensor import Tensor
        >>> logits = Tensor(np.array([[0.0, 0.0], [0.0, 0.0]], np.float32))
        >>> round(xent(logits, Tensor(np.array([0, 1], np.int32))).item(), 6)
        0.693147
    """
    name = "softmax_cross_entropy_with_integer_labels"
    if not labels.dtype.is_integral():
        raise TypeError(f"{name}: labels must be integer class indices, got {labels.dtype.name}")
    if list(labels.shape) != list(logits.shape)[:-1]:
        raise ValueError(
            f"{name}: labels shape {list(labels.shape)} must be logits shape without its class axis, "
            f"{list(logits.shape)[:-1]}"
        )
    num_classes = int(logits.shape[-1])
    classes = F.range(0, num_classes, 1, dtype=labels.dtype, device=labels.device)
    # One-hot by comparison (no gather): differentiable in the logits, and the same ops in every mode.
    one_hot = F.cast(F.equal(F.unsqueeze(labels, -1), classes), logits.dtype)
    per_example = -F.reshape(F.sum(one_hot * F.logsoftmax(logits), axis=-1), list(labels.shape))
    return _reduce(name, per_example, reduction)


def sigmoid_binary_cross_entropy(logits: Any, labels: Any, reduction: str = "mean") -> Any:
    """Binary cross-entropy of ``sigmoid(logits)`` against ``labels`` in ``[0, 1]`` (rank 0).

    Computed stably from the logits: ``max(x, 0) - x * y + log1p(exp(-|x|))``.

    Example:
        >>> import numpy as np
        >>> from maxfx.losses import sigmoid_binary_cross_entropy as bce
        >>> from maxfx.experimental.tensor import Tensor
        >>> round(bce(Tensor(np.zeros(2, np.float32)), Tensor(np.array([0.0, 1.0], np.float32))).item(), 6)
        0.693147
    """
    _check_same_shape("sigmoid_binary_cross_entropy", logits, labels, "logits and labels")
    per_element = F.relu(logits) - logits * labels + F.log1p(F.exp(-F.abs(logits)))
    return _reduce("sigmoid_binary_cross_entropy", per_element, reduction)
