"""``max.nn.conv_transpose``: `ConvTranspose1d` and `WeightNormConvTranspose1d`."""

from maxfx.nn._conv_transpose import ConvTranspose1d, WeightNormConvTranspose1d

__all__ = ["ConvTranspose1d", "WeightNormConvTranspose1d"]
