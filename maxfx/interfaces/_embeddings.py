"""Embeddings: the context protocol, the step inputs and the per-request output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from ._context import BaseContext, context_state, register_state_types
from ._pipeline import PipelineInputs
from ._request import RequestID
from ._text_generation import _merge_batches

__all__ = [
    "EmbeddingsContext",
    "EmbeddingsGenerationContextType",
    "EmbeddingsGenerationInputs",
    "EmbeddingsGenerationOutput",
]


@runtime_checkable
class EmbeddingsContext(BaseContext, Protocol):
    """Protocol of an embeddings request: the token ids to embed and the model name (one step, no decoding state).

    Defaults read ``_tokens`` and ``_model_name`` (plus the :class:`BaseContext` state).

    Example::

        >>> import numpy as np
        >>> from maxfx.interfaces import GenerationStatus
        >>> class Ctx(EmbeddingsContext):
        ...     def __init__(self, ids):
        ...         self._request_id, self._status = RequestID(), GenerationStatus.ACTIVE
        ...         self._tokens, self._model_name = np.asarray(ids, np.int32), "bert"
        >>> Ctx([101, 7, 102]).active_length
        3
    """

    @property
    def tokens(self) -> npt.NDArray[np.integer[Any]]:
        """Token ids to embed."""
        return context_state(self, "tokens")

    @property
    def active_length(self) -> int:
        """Number of tokens to embed."""
        return len(self.tokens)

    @property
    def model_name(self) -> str:
        """The embedding model's name."""
        return context_state(self, "model_name")


register_state_types(EmbeddingsContext, {"_tokens": np.ndarray, "_model_name": str})

EmbeddingsGenerationContextType = TypeVar("EmbeddingsGenerationContextType", bound=EmbeddingsContext)
"""Type variable for any :class:`EmbeddingsContext` implementation."""

_ContextT = TypeVar("_ContextT")


@dataclass(eq=True)
class EmbeddingsGenerationInputs(PipelineInputs, Generic[_ContextT]):  # noqa: UP046 - typing.get_type_hints (msgpack decoding) must resolve the type variables on 3.12
    """Per-replica batches ``{RequestID: EmbeddingsContext}`` for one embeddings step.

    Example::

        >>> EmbeddingsGenerationInputs([{RequestID("a"): "ctx-a"}, {RequestID("b"): "ctx-b"}]).batch
        {RequestID('a'): 'ctx-a', RequestID('b'): 'ctx-b'}
    """

    batches: list[dict[RequestID, _ContextT]]
    """Per-replica batches."""

    def __post_init__(self) -> None:
        if isinstance(self.batches, dict):
            raise TypeError(
                "EmbeddingsGenerationInputs.batches must be a list of per-replica dicts, e.g. batches=[{request_id: "
                "context}]"
            )
        self.batches = list(self.batches)
        for i, batch in enumerate(self.batches):
            if not isinstance(batch, dict):
                raise TypeError(
                    f"EmbeddingsGenerationInputs.batches[{i}] must be a dict {{RequestID: context}}, got "
                    f"{type(batch).__name__}"
                )

    @property
    def batch(self) -> dict[RequestID, _ContextT]:
        """All replica batches merged into one dict."""
        return _merge_batches(self.batches)


@dataclass
class EmbeddingsGenerationOutput:
    """The embedding(s) of one request: ``[hidden]`` when pooled, ``[tokens, hidden]`` otherwise.

    Example::

        >>> import numpy as np
        >>> out = EmbeddingsGenerationOutput(np.ones(4, np.float32))
        >>> out.is_done, out.embeddings.shape
        (True, (4,))
    """

    embeddings: npt.NDArray[np.floating[Any]]
    """The embedding array."""

    def __post_init__(self) -> None:
        if not isinstance(self.embeddings, np.ndarray):
            self.embeddings = np.asarray(self.embeddings)
        if self.embeddings.dtype.kind in "biuOSUcMm":
            raise TypeError(
                "EmbeddingsGenerationOutput.embeddings must be a floating-point array, got dtype "
                f"{self.embeddings.dtype}"
            )

    @property
    def is_done(self) -> bool:
        """Always True: embeddings take a single step."""
        return True

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EmbeddingsGenerationOutput):
            return NotImplemented
        return self.embeddings.dtype == other.embeddings.dtype and np.array_equal(self.embeddings, other.embeddings)
