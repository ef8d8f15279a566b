"""Compile and run graphs (``max.engine``).

Example:
    >>> from maxfx.engine import InferenceSession
    >>> session = InferenceSession()  # host CPU
"""

from maxfx.engine._session import CustomExtensionsType, GPUProfilingMode, InferenceSession, LogLevel, Model, MojoValue, TensorSpec

__all__ = ["CustomExtensionsType", "GPUProfilingMode", "InferenceSession", "LogLevel", "Model", "MojoValue", "TensorSpec"]
