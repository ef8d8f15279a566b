"""The one kernel dispatcher of `custom_calls`: which path runs a call, and the record of each choice.

Every kernel family (`custom_calls.attention.dispatch`, `custom_calls.qmatmul.dispatch`)
hands its call to `run` with the paths it has: a Pallas kernel, the jnp
reference, optionally a CPU C++ kernel, and the reason (if any) the kernel
cannot take these operands. The rule (``shared/design/PALLAS_NOTES.md`` §9):

* ``impl="reference"`` / ``"pallas"`` / ``"pallas_interpret"`` force a path.
* ``impl=None`` (default): ``MAXFX_PALLAS_INTERPRET=1`` (any value but
  ``""``/``"0"``; read on every call, by `interpret_requested` only) → the
  kernel in interpret mode on any backend (how CPU tests exercise kernels);
  else, when JAX's default backend is a GPU or the program is being lowered for
  CUDA (`custom_calls._target.lowering_for`) → ``lax.platform_dependent`` with
  the Pallas (Triton) kernel for ``cuda`` and the reference as the default (a
  computation placed on the CPU of a GPU machine still lowers); else the
  reference, or the CPU C++ kernel where the family has one that applies
  (`custom_calls.cpu.callable_here`).
* A kernel that would run but cannot take the operands (the family's reason):
  the reference, logged on ``maxfx.kernels`` at INFO on every trace, with a
  ``UserWarning`` the first time per (function, reason) (`reset_warnings`
  forgets them).

Example:
    >>> from custom_calls import _dispatch
    >>> _dispatch.kernel_mode("pallas_interpret"), _dispatch.kernel_mode("reference")
    ('interpret', None)
    >>> _dispatch.run("double", "reference", (3,), kernel=None, reference=lambda x: 2 * x)
    6
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

from jax import lax

from custom_calls._target import gpu_target

__all__ = ["ENV_INTERPRET", "IMPLS", "LOG", "interpret_requested", "kernel_mode", "reset_warnings", "fallback", "run"]

ENV_INTERPRET = "MAXFX_PALLAS_INTERPRET"
IMPLS = (None, "reference", "pallas", "pallas_interpret")
# Named like lowering.logs' loggers (custom_calls cannot import lowering): records each path taken.
LOG = logging.getLogger("maxfx.kernels")

_warned: set[tuple[str, str]] = set()


def interpret_requested() -> bool:
    """Whether ``MAXFX_PALLAS_INTERPRET`` asks for interpreted kernels (the one place it is read)."""
    return os.environ.get(ENV_INTERPRET, "") not in ("", "0")


def kernel_mode(impl: str | None = None) -> str | None:
    """``"interpret"``, ``"pallas"`` (compiled kernel), ``"gpu"`` (kernel on cuda, reference elsewhere) or None
    (reference).

    Raises:
        ValueError: ``impl`` not one of `IMPLS`.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if impl == "reference":
        return None
    if impl == "pallas_interpret":
        return "interpret"
    if impl == "pallas":
        return "pallas"
    if interpret_requested():
        return "interpret"
    return "gpu" if gpu_target() else None


def reset_warnings() -> None:
    """Forget which fallback warnings were shown (tests)."""
    _warned.clear()


def fallback(fn: str, reason: str, *, stacklevel: int = 2) -> None:
    """Record that ``fn`` runs the reference where a kernel would have run: logged each time, warned once per reason.

    ``stacklevel`` is `warnings.warn`'s, counted from the caller of `fallback`.
    """
    LOG.info("%s: %s; jnp reference instead of the Pallas kernel", fn, reason)
    if (fn, reason) not in _warned:
        _warned.add((fn, reason))
        warnings.warn(
            f"{fn}: {reason}; using the jnp reference instead of the Pallas kernel",
            UserWarning,
            stacklevel=stacklevel + 1,
        )


def run(
    fn: str,
    impl: str | None,
    args: tuple,
    kernel: Callable[..., Any] | None,
    reference: Callable[..., Any],
    why: str | Callable[[], str | None] | None = None,
    *,
    cpu: Callable[..., Any] | None = None,
    cpu_label: str = "",
    depth: int = 0,
) -> Any:
    """``kernel(*args, interpret=...)``, ``cpu(*args)`` or ``reference(*args)``, per `kernel_mode` and ``why``.

    Args:
        fn: the public function's name (logs and warnings).
        impl: the caller's ``impl`` (one of `IMPLS`).
        args: the operands every path takes positionally.
        kernel: the Pallas kernel, called with ``interpret=True/False``; None:
            the family has none for this call (the reference runs, or ``cpu``
            where no kernel mode is on).
        reference: the jnp reference.
        why: the reason the kernel cannot take these operands (None: it can),
            or a function computing it, called only where a kernel would run.
        cpu: a CPU C++ kernel tried wherever the reference would run with
            ``impl=None`` (also the ``default`` branch on a GPU machine):
            returns the result, or None where it does not apply.
        cpu_label: what the log calls that kernel.
        depth: the frames between ``fn`` and `run` (a family's shared helper),
            so that the fallback warning points at the caller of ``fn``.
    """
    mode = kernel_mode(impl)

    def ref_path(*a, log: bool = False):
        if impl is None and cpu is not None:
            out = cpu(*a)
            if out is not None:
                LOG.debug("%s: CPU kernel%s", fn, f" ({cpu_label})" if cpu_label else "")
                return out
        if log:
            LOG.debug("%s: jnp reference (no Pallas kernel for this backend, or impl='reference')", fn)
        return reference(*a)

    if mode is None:
        return ref_path(*args, log=True)
    if kernel is None:
        LOG.debug("%s: jnp reference (no Pallas kernel for this call)", fn)
        return reference(*args)
    reason = why() if callable(why) else why
    if reason:
        fallback(fn, reason, stacklevel=3 + depth)
        return ref_path(*args)
    LOG.debug("%s: Pallas kernel (%s)", fn, mode)
    if mode in ("interpret", "pallas"):
        return kernel(*args, interpret=mode == "interpret")
    return lax.platform_dependent(*args, cuda=lambda *a: kernel(*a, interpret=False), default=ref_path)
