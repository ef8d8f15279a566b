"""``max.driver.buffer``: MAX's module of `Buffer`, `DevicePinnedBuffer` and `load_max_buffer` (also in ``max.driver``).

Example:
    >>> from maxfx.driver.buffer import Buffer
    >>> from maxfx.driver import Buffer as B
    >>> Buffer is B
    True
"""

from maxfx.driver._dump import load_max_buffer
from maxfx.driver._tensor import Buffer, DevicePinnedBuffer

__all__ = ["Buffer", "DevicePinnedBuffer", "load_max_buffer"]
