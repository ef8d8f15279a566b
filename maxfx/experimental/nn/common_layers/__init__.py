"""``max.experimental.nn.common_layers``: shared building blocks of eager (module_v3) models.

Example:
    >>> from maxfx.experimental.nn.common_layers.activation import activation_function_from_name
    >>> activation_function_from_name("swish").__name__
    'silu'
"""

from maxfx.experimental.nn.common_layers import activation

__all__ = ["activation"]
