"""Neural-network layers (``max.nn``).

So far: ``maxfx.nn.module_v3`` (the eager Module API, same classes as
``maxfx.experimental.nn``). The graph-API layers of ``max.nn`` (``Linear``,
attention, KV cache, ...) arrive with the Module-layer issue.
"""

from maxfx.nn import module_v3

__all__ = ["module_v3"]
