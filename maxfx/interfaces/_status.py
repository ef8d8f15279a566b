"""The generation status enum shared by contexts and outputs."""

from __future__ import annotations

from enum import Enum

__all__ = ["GenerationStatus"]


class GenerationStatus(str, Enum):
    """State of a generation request.

    ``END_OF_SEQUENCE`` maps to OpenAI's ``finish_reason="stop"``,
    ``MAXIMUM_LENGTH`` to ``"length"``.

    Example::

        >>> GenerationStatus.ACTIVE.is_done, GenerationStatus("maximum_length").is_done
        (False, True)
    """

    ACTIVE = "active"
    """The request is still generating."""
    END_OF_SEQUENCE = "end_of_sequence"
    """An EOS token or a stop criterion ended the request."""
    MAXIMUM_LENGTH = "maximum_length"
    """The request reached its token or sequence-length limit."""
    CANCELLED = "cancelled"
    """The client cancelled the request."""

    @property
    def is_done(self) -> bool:
        """True for every status except ``ACTIVE``."""
        return self is not GenerationStatus.ACTIVE
