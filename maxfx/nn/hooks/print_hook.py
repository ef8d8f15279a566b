"""``max.nn.hooks.print_hook``: the module MAX keeps `PrintHook` in (defined in ``maxfx.nn._print_hook``).

Example:
    >>> from maxfx.nn.hooks.print_hook import PrintHook
    >>> hook = PrintHook()  # prints each layer's inputs and outputs while a graph is built
"""

from maxfx.nn._print_hook import PrintHook

__all__ = ["PrintHook"]
