"""``max.nn.norm.rms_norm``: `RMSNorm` (and the V1 `RMSNormV1`)."""

from maxfx.nn._basic import RMSNorm
from maxfx.nn._v1 import RMSNormV1

__all__ = ["RMSNorm", "RMSNormV1"]
