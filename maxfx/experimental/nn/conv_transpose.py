"""``max.experimental.nn.conv_transpose``: `ConvTranspose2d` (defined in `maxfx.experimental.nn.conv`)."""

from maxfx.experimental.nn.conv import ConvTranspose2d

__all__ = ["ConvTranspose2d"]
