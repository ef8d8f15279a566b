"""``max.pipelines.lib.sampling``: the sampling graphs of the pipelines (`sampling`: `token_sampler`, the rejection
samplers).

Example:
    >>> from maxfx.pipelines.lib.sampling import token_sampler
    >>> callable(token_sampler)
    True
"""

from maxfx.pipelines.lib.sampling.sampling import (
    DEFAULT_MAX_K,
    rejection_sampler,
    rejection_sampler_with_residuals,
    token_sampler,
)

__all__ = ["DEFAULT_MAX_K", "rejection_sampler", "rejection_sampler_with_residuals", "token_sampler"]
