"""``max.nn.module_v3``: the same classes as ``maxfx.experimental.nn``.

Example:
    >>> from maxfx.nn.module_v3 import Linear
    >>> from maxfx.experimental.nn import Linear as L2
    >>> Linear is L2
    True
"""

from maxfx.experimental.nn import Embedding, LayerNorm, Linear, Module, ModuleList, Sequential, StaticFieldWarning, module_dataclass, static_field

__all__ = ["Embedding", "LayerNorm", "Linear", "Module", "ModuleList", "Sequential", "StaticFieldWarning", "module_dataclass", "static_field"]
