"""``max.nn.module_v3``: the same classes as ``maxfx.experimental.nn``.

MAX 26.1 kept the eager Module API here; 26.2 moved it to
``max.experimental.nn``. Every name of ``maxfx.experimental.nn`` is importable
from both paths, so examples written for either release run.

Example:
    >>> from maxfx.nn.module_v3 import Conv3d, Linear
    >>> from maxfx.experimental.nn import Conv3d as C2, Linear as L2
    >>> Linear is L2 and Conv3d is C2
    True
"""

from maxfx.experimental import nn as _experimental_nn
from maxfx.experimental.nn import *  # noqa: F403 - this module is that one under its old path

__all__ = list(_experimental_nn.__all__)
