"""``max.nn.conv``: `Conv1D`, `Conv2d`, `Conv3D` and the deprecated V1 forms."""

from maxfx.nn._conv import Conv1D, Conv1DV1, Conv2d, Conv2dV1, Conv3D, Conv3DV1

__all__ = ["Conv1D", "Conv1DV1", "Conv2d", "Conv2dV1", "Conv3D", "Conv3DV1"]
