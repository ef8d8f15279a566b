"""``max.profiler``: profiling spans around Python code, recorded as JAX profiler annotations.

`traced` wraps a function in a span; `Tracer` keeps a stack of nested spans.
Both are no-ops unless ``MODULAR_ENABLE_PROFILING=1`` (read at each call); when on,
each span is a ``jax.profiler.TraceAnnotation``, visible in a trace recorded with
``jax.profiler.trace(logdir)``.

Example:
    >>> from maxfx.profiler import Tracer, traced
    >>> @traced
    ... def step():
    ...     with Tracer("inner"):
    ...         return 3
    >>> step()
    3
"""

from maxfx.profiler._tracing import ENV_VAR, Tracer, is_profiling_enabled, traced

__all__ = ["ENV_VAR", "Tracer", "is_profiling_enabled", "traced"]
