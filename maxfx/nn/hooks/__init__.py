"""``max.nn.hooks``: `PrintHook`, which prints or exports layer inputs and outputs.

As in MAX, the hook also lives in its own module, ``maxfx.nn.hooks.print_hook``.
"""

from maxfx.nn.hooks.print_hook import PrintHook

__all__ = ["PrintHook"]
