"""``max.graph.ops.irfft``: the inverse real FFT and its `Normalization` modes.

``maxfx.graph.ops.irfft`` is the function (as in MAX, whose ``ops`` package
imports it over this module's name); ``from maxfx.graph.ops.irfft import
Normalization`` reaches the enum. Defined in `lowering.ops.nn`.

The module itself is callable as `irfft`: an import system that loads it
under another name (an alias package, ``importlib.reload``) rebinds
``ops.irfft`` to the module, and ``ops.irfft(x, ...)`` must still work.
"""

import sys
import types

from lowering.ops.nn import Normalization, irfft

__all__ = ["Normalization", "irfft"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return irfft(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
