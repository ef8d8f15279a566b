"""``maxfx.random``: the same module object as ``maxfx.experimental.random`` (MAX's ``max.random`` alias)."""

import sys

from maxfx.experimental import random as _module

sys.modules[__name__] = _module
