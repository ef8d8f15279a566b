"""Scheduler contract and the result envelope it sends back to clients."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Scheduler", "SchedulerResult"]

_OutputT = TypeVar("_OutputT")


class Scheduler(ABC):
    """Abstract scheduler: :meth:`run_iteration` builds one batch and runs it.

    Example::

        >>> class Counter(Scheduler):
        ...     def __init__(self):
        ...         self.iterations = 0
        ...     def run_iteration(self):
        ...         self.iterations += 1
        >>> s = Counter(); s.run_iteration(); s.iterations
        1
    """

    @abstractmethod
    def run_iteration(self) -> object:
        """Build the next batch from the queued requests, execute it and dispatch the outputs."""
        raise NotImplementedError(f"{type(self).__name__}.run_iteration")


@dataclass
class SchedulerResult(Generic[_OutputT]):  # noqa: UP046 - typing.get_type_hints (msgpack decoding) must resolve the type variables on 3.12
    """What the scheduler sends back per request: a done flag and the pipeline output (if any).

    Example::

        >>> SchedulerResult.cancelled()
        SchedulerResult(is_done=True, result=None)
    """

    is_done: bool
    """Whether the request is finished from the scheduler's point of view."""
    result: _OutputT | None
    """The pipeline output; ``None`` when cancelled."""

    @classmethod
    def cancelled(cls) -> SchedulerResult[_OutputT]:
        """A done result without output (the request was cancelled)."""
        return cls(is_done=True, result=None)

    @classmethod
    def create(cls, result: _OutputT) -> SchedulerResult[_OutputT]:
        """Wrap a pipeline output; ``is_done`` is taken from ``result.is_done``."""
        return cls(is_done=bool(result.is_done), result=result)
