"""Log-probability payload attached to generated tokens."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LogProbabilities"]


@dataclass
class LogProbabilities:
    """Log probabilities of generated (or echoed) tokens; data only.

    ``token_log_probabilities[i]`` is the log probability of the token chosen
    at position ``i``; ``top_log_probabilities[i]`` maps the top-k token ids
    at that position to their log probabilities. Both lists have one entry per
    position.

    Example::

        >>> lp = LogProbabilities([-0.1], [{42: -0.1, 7: -2.5}])
        >>> lp.top_log_probabilities[0][7]
        -2.5
    """

    token_log_probabilities: list[float]
    """Log probability of each chosen token."""
    top_log_probabilities: list[dict[int, float]]
    """Per position: token id -> log probability for the top-k candidates."""

    def __post_init__(self) -> None:
        if len(self.token_log_probabilities) != len(self.top_log_probabilities):
            raise ValueError(
                "LogProbabilities: token_log_probabilities and top_log_probabilities must have one entry per "
                f"position, got {len(self.token_log_probabilities)} and {len(self.top_log_probabilities)}"
            )
