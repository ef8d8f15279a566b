"""`SpeculativeConfig`: how a draft model proposes tokens (`PipelineConfig.speculative_config`, set with a draft model).

Example:
    >>> spec = SpeculativeConfig(num_speculative_tokens=4)
    >>> spec.is_standalone(), spec.num_speculative_tokens
    (True, 4)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from maxfx.pipelines.lib.config._base import MAXConfig, check_int, coerce_enum, option

__all__ = ["SpeculativeConfig", "SpeculativeMethod"]


class SpeculativeMethod(str, enum.Enum):
    """Where draft tokens come from: a standalone small model, or an EAGLE head."""

    STANDALONE = "standalone"
    EAGLE = "eagle"


@dataclass
class SpeculativeConfig(MAXConfig):
    """Speculative decoding: the method and how many tokens the draft proposes per step."""

    speculative_method: SpeculativeMethod = option(
        SpeculativeMethod.STANDALONE,
        doc="Speculative decoding method: 'standalone' (a draft model) or 'eagle' ('standalone').",
    )
    num_speculative_tokens: int = option(
        2, doc="Tokens the draft model proposes per step, verified by the target in one forward (2)."
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check both options.

        Raises:
            ConfigError: an unknown method, or ``num_speculative_tokens`` below 1.
        """
        self.speculative_method = coerce_enum(
            "SpeculativeConfig", "speculative_method", self.speculative_method, SpeculativeMethod
        )
        self.num_speculative_tokens = check_int(
            "SpeculativeConfig", "num_speculative_tokens", self.num_speculative_tokens, minimum=1
        )

    def is_standalone(self) -> bool:
        """True for a standalone draft model."""
        return self.speculative_method is SpeculativeMethod.STANDALONE

    def is_eagle(self) -> bool:
        """True for an EAGLE draft head."""
        return self.speculative_method is SpeculativeMethod.EAGLE
