"""``max.engine.api``: the module MAX's engine classes are defined in (same objects as `maxfx.engine`).

Example:
    >>> from maxfx.engine.api import InferenceSession
    >>> from maxfx.engine import InferenceSession as Same
    >>> InferenceSession is Same
    True
"""

from maxfx.engine._model import Model, MojoValue, TensorSpec
from maxfx.engine._session import (
    CompiledModel,
    CustomExtensionsType,
    GPUProfilingMode,
    InferenceSession,
    LogLevel,
    PrintStyle,
)

__all__ = [
    "CompiledModel",
    "CustomExtensionsType",
    "GPUProfilingMode",
    "InferenceSession",
    "LogLevel",
    "Model",
    "MojoValue",
    "PrintStyle",
    "TensorSpec",
]
