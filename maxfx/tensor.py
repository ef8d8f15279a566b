"""``maxfx.tensor``: the same module object as ``maxfx.experimental.tensor`` (MAX's ``max.tensor`` alias)."""

import sys

from maxfx.experimental import tensor as _module

sys.modules[__name__] = _module
