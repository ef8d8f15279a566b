"""Arguments handed to logits processors (``SamplingParams.logits_processors``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchLogitsProcessor", "BatchProcessorInputs", "LogitsProcessor", "ProcessorInputs"]


@dataclass
class ProcessorInputs:
    """What a per-request logits processor receives: that request's logits and its context.

    ``logits`` is the array the sampler will read (edit it in place, or return
    nothing and let the pipeline read it back); ``context`` is the request's
    :class:`TextGenerationContext`.

    Example::

        >>> import numpy as np
        >>> def ban_token_0(inputs: ProcessorInputs) -> None:
        ...     inputs.logits[..., 0] = -np.inf
        >>> x = ProcessorInputs(logits=np.zeros((1, 4), np.float32), context=None)
        >>> ban_token_0(x); float(x.logits[0, 0])
        -inf
    """

    logits: Any
    """The request's logits (``[n, vocab]``)."""
    context: Any
    """The request's ``TextGenerationContext``."""


@dataclass
class BatchProcessorInputs:
    """What a batch-level logits processor receives.

    ``logits`` is float32 ``[N, vocab]`` for the whole batch; when the model
    returns several logits per sequence, ``logit_offsets`` (``[batch + 1]``)
    says which rows belong to which sequence, else it is ``None``.

    Example::

        >>> import numpy as np
        >>> b = BatchProcessorInputs(np.zeros((3, 5), np.float32), np.array([0, 1, 3]), ["ctx0", "ctx1"])
        >>> [int(b.logit_offsets[i + 1] - b.logit_offsets[i]) for i in range(len(b.context_batch))]
        [1, 2]
    """

    logits: Any
    """Float32 ``[N, vocab]`` logits of the batch."""
    logit_offsets: Any | None
    """Row offsets per sequence (``[batch + 1]``), or ``None`` for one row per sequence."""
    context_batch: Sequence[Any]
    """The contexts of the batch, in row order."""


LogitsProcessor = Callable[[ProcessorInputs], None]
"""A per-request logits processor: called with :class:`ProcessorInputs`."""

BatchLogitsProcessor = Callable[[BatchProcessorInputs], None]
"""A batch logits processor: called with :class:`BatchProcessorInputs`."""
