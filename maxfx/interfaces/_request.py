"""Request identity: :class:`RequestID` and the :class:`Request` base class."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

__all__ = ["Request", "RequestID"]


class RequestID(str):
    """A unique identifier for a request.

    A ``str`` subclass, so it hashes and compares equal to the plain string it
    wraps and can key dicts shared with code that only has the string.
    Called without a value it draws a fresh UUID4.

    Example::

        >>> rid = RequestID("req-1")
        >>> rid == "req-1", rid.value, {rid: 1}["req-1"]
        (True, 'req-1', 1)
        >>> len(RequestID())  # a fresh uuid4 string
        36
    """

    __slots__ = ()

    def __new__(cls, value: str | None = None) -> RequestID:
        if value is None:
            value = str(uuid.uuid4())
        elif type(value) is cls:
            return value
        elif not isinstance(value, str):
            raise TypeError(f"RequestID value must be a str, got {type(value).__name__} {value!r}")
        return super().__new__(cls, value)

    @property
    def value(self) -> str:
        """The id as a plain ``str``."""
        return str.__str__(self)

    def __str__(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"RequestID({str.__repr__(self)})"


@dataclass(frozen=True)
class Request:
    """Base class of every request: it carries a :class:`RequestID`.

    A plain ``str`` given as ``request_id`` is converted to a :class:`RequestID`.

    Example::

        >>> Request(request_id="abc").request_id
        RequestID('abc')
    """

    request_id: RequestID

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, RequestID):
            object.__setattr__(self, "request_id", RequestID(self.request_id))
