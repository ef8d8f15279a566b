"""Compile and run graphs (``max.engine``).

Example:
    >>> from maxfx.engine import InferenceSession
    >>> session = InferenceSession()  # host CPU
"""

from lowering.debug import DebugConfig
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
    "DebugConfig",
    "GPUProfilingMode",
    "InferenceSession",
    "LogLevel",
    "Model",
    "MojoValue",
    "PrintStyle",
    "TensorSpec",
]
