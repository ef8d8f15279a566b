"""The async tokenizer protocol the server and pipelines use."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["PipelineTokenizer"]


@runtime_checkable
class PipelineTokenizer(Protocol):
    """Async tokenizer: ``encode`` / ``decode`` / ``eos`` / ``new_context(request)``.

    Example::

        >>> import asyncio
        >>> class Chars(PipelineTokenizer):
        ...     eos = 0
        ...     async def encode(self, prompt, add_special_tokens=True):
        ...         return [ord(c) for c in prompt]
        ...     async def decode(self, encoded, **kwargs):
        ...         return "".join(map(chr, encoded))
        ...     async def new_context(self, request):
        ...         return request
        >>> asyncio.run(Chars().encode("hi")), Chars().expects_content_wrapping
        ([104, 105], False)
    """

    @property
    def eos(self) -> int:
        """The end-of-sequence token id."""
        raise NotImplementedError(f"{type(self).__name__}.eos")

    @property
    def expects_content_wrapping(self) -> bool:
        """Whether chat text parts are ``{"type": "text", "content": ...}`` instead of OpenAI's ``"text"`` key.

        ``False`` unless a tokenizer says otherwise.
        """
        return False

    async def encode(self, prompt: str, add_special_tokens: bool) -> Any:
        """Token ids of ``prompt``; raises ``ValueError`` past the configured maximum length."""
        raise NotImplementedError(f"{type(self).__name__}.encode")

    async def decode(self, encoded: Any, **kwargs: Any) -> str:
        """Text of the token ids ``encoded``."""
        raise NotImplementedError(f"{type(self).__name__}.decode")

    async def new_context(self, request: Any) -> Any:
        """A fresh context (e.g. a ``TextGenerationContext``) for ``request``."""
        raise NotImplementedError(f"{type(self).__name__}.new_context")
