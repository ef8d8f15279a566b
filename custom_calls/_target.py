"""Which platforms the program being traced is lowered for: decides whether the GPU kernels are emitted.

The dispatchers (`custom_calls.attention.dispatch`, `custom_calls.qmatmul.dispatch`)
emit ``lax.platform_dependent(cuda=<Pallas kernel>, default=<jnp reference>)``
when the program may run on a GPU. By default that means "JAX's default
backend is a GPU". An exporter that lowers for other platforms than the local
one says so with `lowering_for`: a CUDA artifact built on a CPU-only machine
gets the kernels although no GPU is here.

Example:
    >>> from custom_calls import _target
    >>> with _target.lowering_for(("cuda",)):
    ...     _target.gpu_target()
    True
    >>> with _target.lowering_for(("cpu", "cuda")):   # one artifact for both: the portable jnp path
    ...     _target.gpu_target()
    False
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import jax

__all__ = ["lowering_for", "gpu_target", "exporting"]

_TARGETS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "custom_calls_lowering_targets", default=None
)


@contextlib.contextmanager
def lowering_for(platforms: Sequence[str]) -> Iterator[None]:
    """Within the block, programs are traced to be lowered for ``platforms`` (JAX names: ``"cpu"``, ``"cuda"``)."""
    token = _TARGETS.set(tuple(platforms))
    try:
        yield
    finally:
        _TARGETS.reset(token)


def gpu_target() -> bool:
    """Whether the program being traced is lowered for CUDA only (`lowering_for`), else whether the default backend is a
    GPU.

    A program lowered for CUDA *and* another platform gets no Pallas kernel:
    JAX lowers every branch of ``lax.platform_dependent`` for every target
    platform there, and a (non-interpret) ``pallas_call`` has no CPU lowering.
    """
    targets = _TARGETS.get()
    if targets is not None:
        return bool(targets) and all(t == "cuda" for t in targets)
    return jax.default_backend() == "gpu"


def exporting() -> bool:
    """Whether the program being traced will be lowered for named platforms (an export or a cached block,
    `lowering_for`).

    Such programs must be portable: they get no call into a library built on this machine.
    """
    return _TARGETS.get() is not None
