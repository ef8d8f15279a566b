"""``max.nn.hooks``: `PrintHook`, which prints or exports layer inputs and outputs."""

from maxfx.nn._print_hook import PrintHook

__all__ = ["PrintHook"]
