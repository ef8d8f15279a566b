"""Profiling spans: `traced` (a decorator) and `Tracer` (a stack of spans), as ``jax.profiler.TraceAnnotation``s.

Spans are recorded only while ``MODULAR_ENABLE_PROFILING`` is on (``1``, ``on``,
``true`` or ``detailed``), read at each call as MAX asks its runtime each time;
otherwise a span costs one environment lookup and JAX is not even imported.
Record a trace with ``jax.profiler.trace(logdir)`` (TensorBoard / Perfetto).

Example:
    >>> @traced(message="tokenize")
    ... def tokenize(text):
    ...     return text.split()
    >>> tokenize("a b")
    ['a', 'b']
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["ENV_VAR", "Tracer", "is_profiling_enabled", "traced"]

ENV_VAR = "MODULAR_ENABLE_PROFILING"
_ON = ("1", "on", "true", "yes", "detailed")
_DEFAULT_COLOR = "modular_purple"


def is_profiling_enabled() -> bool:
    """Whether ``MODULAR_ENABLE_PROFILING`` turns spans on now (``1``, ``on``, ``true``, ``detailed``).

    Example:
        >>> import os
        >>> os.environ.pop("MODULAR_ENABLE_PROFILING", None) and None
        >>> is_profiling_enabled()
        False
    """
    return os.environ.get(ENV_VAR, "").strip().lower() in _ON


class _Span:
    """One open ``jax.profiler.TraceAnnotation`` (the span's color is recorded as its metadata)."""

    def __init__(self, message: str, color: str) -> None:
        import jax.profiler  # noqa: PLC0415 - JAX takes seconds to import; only an enabled span needs it

        self._profiler = jax.profiler
        self._message = message
        self._color = color
        self._annotation = jax.profiler.TraceAnnotation(message, color=color)

    def __enter__(self) -> _Span:
        self._annotation.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._annotation.__exit__(exc_type, exc_value, traceback)

    def mark(self) -> None:
        """Record an instant inside the span (a zero-length annotation named ``<message>:mark``)."""
        with self._profiler.TraceAnnotation(f"{self._message}:mark", color=self._color):
            pass


def traced(func: Callable[..., Any] | None = None, *, message: str | None = None, color: str = _DEFAULT_COLOR) -> Any:
    """Decorate a function (sync or async) so each call is a profiling span.

    Args:
        func: the function (``@traced``), or None (``@traced(message=...)``).
        message: the span's name (default: the function's ``__name__``).
        color: the span's color, kept as its metadata.

    Returns:
        the wrapped function, or a decorator when ``func`` is None.

    Example:
        >>> @traced
        ... async def fetch():
        ...     return 1
        >>> import asyncio
        >>> asyncio.run(fetch())
        1
    """
    if func is None:
        return lambda f: traced(f, message=message, color=color)
    name = message if message is not None else func.__name__

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if not is_profiling_enabled():
                return await func(*args, **kwargs)
            with _Span(name, color):
                return await func(*args, **kwargs)

        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_profiling_enabled():
            return func(*args, **kwargs)
        with _Span(name, color):
            return func(*args, **kwargs)

    return wrapper


class Tracer:
    """A stack of nested profiling spans, opened and closed by hand or by a ``with`` block.

    ``Tracer(message)`` opens a first span; `push` opens a nested one, `pop`
    closes the newest, `next` closes it and opens a sibling, `cleanup` (and the
    end of a ``with`` block) closes them all. With profiling off, or without a
    message, the stack holds placeholders and nothing is recorded.

    Example:
        >>> with Tracer("request") as tracer:
        ...     tracer.push("prefill")
        ...     tracer.next("decode")
        ...     tracer.mark()
        >>> tracer.trace_stack
        []
    """

    def __init__(self, message: str | None = None, color: str = _DEFAULT_COLOR) -> None:
        self.trace_stack: list[_Span | None] = []
        self.push(message, color)

    def push(self, message: str | None = None, color: str = _DEFAULT_COLOR) -> None:
        """Open a span named ``message`` nested in the current one (a placeholder when off or unnamed)."""
        if message is None or not is_profiling_enabled():
            self.trace_stack.append(None)
            return
        span = _Span(message, color)
        span.__enter__()
        self.trace_stack.append(span)

    def pop(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        """Close the newest span (passing on exception details, as a ``with`` block would).

        Raises:
            IndexError: the stack is empty.
        """
        if not self.trace_stack:
            raise IndexError("Tracer.pop: no open span (the stack is empty)")
        span = self.trace_stack.pop()
        if span is not None:
            span.__exit__(exc_type, exc_value, traceback)

    def next(self, message: str, color: str = _DEFAULT_COLOR) -> None:
        """Close the newest span and open a sibling named ``message``."""
        self.pop()
        self.push(message, color)

    def mark(self) -> None:
        """Record an instant in the newest span.

        Raises:
            AssertionError: the stack is empty (as in MAX).
        """
        assert self.trace_stack, "stack underflow in Tracer.mark()"
        if self.trace_stack[-1] is not None:
            self.trace_stack[-1].mark()

    def cleanup(self) -> None:
        """Close every open span, newest first."""
        while self.trace_stack:
            self.pop()

    def __enter__(self) -> Tracer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.cleanup()

    def __del__(self) -> None:
        self.cleanup()
