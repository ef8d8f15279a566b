"""The pipeline contract: inputs, outputs, the :class:`Pipeline` ABC and its factory alias."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from ._request import RequestID

__all__ = [
    "Pipeline",
    "PipelineInputs",
    "PipelineInputsType",
    "PipelineOutput",
    "PipelineOutputType",
    "PipelineOutputsDict",
    "PipelinesFactory",
]


class PipelineInputs:
    """Marker base class for everything a :meth:`Pipeline.execute` accepts.

    Example::

        >>> class MyInputs(PipelineInputs):
        ...     def __init__(self, data: str):
        ...         self.data = data
        >>> isinstance(MyInputs("x"), PipelineInputs)
        True
    """


@runtime_checkable
class PipelineOutput(Protocol):
    """Protocol of a per-request pipeline output: anything with an ``is_done`` flag.

    Example::

        >>> from maxfx.interfaces import EmbeddingsGenerationOutput
        >>> import numpy as np
        >>> isinstance(EmbeddingsGenerationOutput(np.zeros(3)), PipelineOutput)
        True
    """

    @property
    def is_done(self) -> bool:
        """Whether the request finished; by default read from a ``final_status`` attribute."""
        status = getattr(self, "final_status", None)
        if status is None:
            raise AttributeError(f"{type(self).__name__} must define is_done (or a final_status GenerationStatus)")
        return status.is_done


PipelineInputsType = TypeVar("PipelineInputsType", bound=PipelineInputs)
PipelineOutputType = TypeVar("PipelineOutputType", bound=PipelineOutput)
PipelineOutputsDict = dict[RequestID, PipelineOutputType]


class Pipeline(ABC, Generic[PipelineInputsType, PipelineOutputType]):  # noqa: UP046 - typing.get_type_hints (msgpack decoding) must resolve the type variables on 3.12
    """Abstract pipeline: ``execute(inputs) -> {RequestID: output}``, ``release(request_id)``.

    Example::

        >>> from maxfx.interfaces import EmbeddingsGenerationInputs, EmbeddingsGenerationOutput
        >>> import numpy as np
        >>> class Ones(Pipeline):
        ...     def execute(self, inputs):
        ...         return {rid: EmbeddingsGenerationOutput(np.ones(2)) for rid in inputs.batch}
        ...     def release(self, request_id):
        ...         pass
        >>> out = Ones().execute(EmbeddingsGenerationInputs([{RequestID("a"): None}]))
        >>> out["a"].embeddings.tolist()
        [1.0, 1.0]
    """

    @abstractmethod
    def execute(self, inputs: PipelineInputsType) -> dict[RequestID, PipelineOutputType]:
        """Run one step for a batch and return one output per request."""
        raise NotImplementedError(f"{type(self).__name__}.execute")

    @abstractmethod
    def release(self, request_id: RequestID) -> None:
        """Free what the pipeline holds for ``request_id`` (KV pages, caches)."""
        raise NotImplementedError(f"{type(self).__name__}.release")


PipelinesFactory = Callable[[], Pipeline[Any, Any]]
"""A zero-argument callable that builds a :class:`Pipeline` (used to build it inside a worker process)."""
