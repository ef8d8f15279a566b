"""``max._core``: in MAX, the C++ bindings under the Python API.

maxfx has one piece of it, the safetensors reader (`maxfx._core.safetensors`),
because MAX's weight-loading code and tests open checkpoints through it. The
rest of MAX's ``_core`` (MLIR dialect bindings such as ``_core.dialects.mo``,
the Mojo kernel library) describes MAX's own compiler; maxfx compiles through
JAX and XLA instead and does not provide it.
"""
