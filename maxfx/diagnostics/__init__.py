"""``max.diagnostics``: machine diagnostics (``maxfx.diagnostics.gpu``: GPU memory and utilization).

Example:
    >>> from maxfx.diagnostics import gpu
    >>> gpu.GPUDiagContext().get_stats()
    {}
"""

from maxfx.diagnostics import gpu

__all__ = ["gpu"]
