"""``max.nn.sampling``: `MinPSampler`, `RejectionSampler`, `RejectionSamplerWithResiduals`."""

from maxfx.nn._sampling import MinPSampler, RejectionSampler, RejectionSamplerWithResiduals

__all__ = ["MinPSampler", "RejectionSampler", "RejectionSamplerWithResiduals"]
