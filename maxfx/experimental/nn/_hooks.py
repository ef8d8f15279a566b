"""Per-instance call hooks of eager modules (what `PrintHook.name_layers_v3` watches).

The hooks live beside the modules, keyed weakly by instance, so a module's
fields, pytree and repr do not change; `copy_call_hooks` carries them over to
the copies ``Module.compile`` traces.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["add_call_hook", "copy_call_hooks"]

_CALL_HOOKS: weakref.WeakKeyDictionary[Any, list[Callable[..., Any]]] = weakref.WeakKeyDictionary()
"""Per-instance hooks run after ``module(...)`` returns (kept out of the module so pytrees stay unchanged)."""


def add_call_hook(module: Any, hook: Callable[[Any, tuple, dict, Any], Any]) -> Callable[[], None]:
    """Run ``hook(module, args, kwargs, outputs)`` after each call of ``module``; returns the remover.

    MAX wraps each module's ``forward`` for this (``PrintHook.name_layers_v3``);
    maxfx keeps the hooks beside the module so its fields, pytree and repr do
    not change.

    Example:
        >>> from maxfx.experimental.nn import Linear
        >>> from maxfx.experimental.tensor import Tensor
        >>> seen = []
        >>> layer = Linear(2, 1)
        >>> remove = add_call_hook(layer, lambda m, args, kwargs, out: seen.append(list(out.shape)))
        >>> _ = layer(Tensor.ones([3, 2])); remove(); _ = layer(Tensor.ones([3, 2]))
        >>> seen
        [[Dim(3), Dim(1)]]
    """
    _CALL_HOOKS.setdefault(module, []).append(hook)

    def remove() -> None:
        hooks = _CALL_HOOKS.get(module, [])
        if hook in hooks:
            hooks.remove(hook)
        if not hooks:
            _CALL_HOOKS.pop(module, None)

    return remove


def copy_call_hooks(pairs: Any) -> None:
    """Give each ``copy`` the hooks of its ``original``, for ``(original, copy)`` in ``pairs``.

    ``Module.compile`` traces a copy of the module tree whose parameters are
    graph values; the copy's calls fire the hooks watching the original, so
    a named module's print ops land in the compiled graph.
    """
    if not _CALL_HOOKS:
        return
    for original, copy in pairs:
        hooks = _CALL_HOOKS.get(original)
        if hooks and copy is not original:
            _CALL_HOOKS.setdefault(copy, []).extend(hooks)
