"""The minimal per-request context protocol, and the state its default members read."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

from ._request import RequestID
from ._status import GenerationStatus

__all__ = ["BaseContext", "BaseContextType"]


def context_state(ctx: object, name: str) -> Any:
    """Read the canonical state attribute ``_<name>`` of a context, with a clear error when it is absent.

    The context protocols (:class:`BaseContext`, ``TextGenerationContext``,
    ``EmbeddingsContext``, ``VLMTextGenerationContext``) give every member a
    default that works on this state; a class that subclasses a protocol either
    stores the state or overrides the members.
    """
    try:
        return getattr(ctx, "_" + name)
    except AttributeError:
        raise AttributeError(
            f"{type(ctx).__name__} must override {name!r} or store its state in the attribute '_{name}'"
        ) from None


_STATE_TYPES: dict[type, dict[str, Any]] = {}


def register_state_types(protocol: type, types: dict[str, Any]) -> None:
    """Declare the types of a context protocol's canonical state attributes (used to decode them from msgpack)."""
    _STATE_TYPES[protocol] = dict(types)


def state_types(cls: type) -> dict[str, Any]:
    """The canonical state attribute types of every context protocol ``cls`` derives from."""
    merged: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        merged.update(_STATE_TYPES.get(base, {}))
    return merged


@runtime_checkable
class BaseContext(Protocol):
    """Minimal contract of every per-request context: id, status, done flag.

    Subclasses get working defaults by storing ``_request_id`` and ``_status``.

    Example::

        >>> class Ctx(BaseContext):
        ...     def __init__(self):
        ...         self._request_id, self._status = RequestID("r"), GenerationStatus.ACTIVE
        >>> c = Ctx(); c.status = GenerationStatus.CANCELLED
        >>> c.request_id, c.is_done
        (RequestID('r'), True)
    """

    @property
    def request_id(self) -> RequestID:
        """The request's unique id."""
        return context_state(self, "request_id")

    @property
    def status(self) -> GenerationStatus:
        """The request's current :class:`GenerationStatus`."""
        return context_state(self, "status")

    @status.setter
    def status(self, status: GenerationStatus) -> None:
        self._status = GenerationStatus(status)

    @property
    def is_done(self) -> bool:
        """Whether the request finished (its status is not ACTIVE)."""
        return self.status.is_done


register_state_types(BaseContext, {"_request_id": RequestID, "_status": GenerationStatus})

BaseContextType = TypeVar("BaseContextType", bound=BaseContext)
"""Type variable for any :class:`BaseContext` implementation."""
