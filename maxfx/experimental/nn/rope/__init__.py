"""``max.experimental.nn.rope``: rotary position embeddings (defined in `maxfx.experimental.nn.rope.rope`, MAX's module
path).

Example:
    >>> from maxfx.experimental.nn.rope import RotaryEmbedding
    >>> from maxfx.experimental.nn.rope.rope import RotaryEmbedding as R
    >>> RotaryEmbedding is R
    True
"""

from maxfx.experimental.nn.rope import rope, yarn
from maxfx.experimental.nn.rope.rope import (
    RotaryEmbedding,
    TransposedRotaryEmbedding,
    embed,
    positional_embedding,
    theta,
)

__all__ = ["RotaryEmbedding", "TransposedRotaryEmbedding", "embed", "positional_embedding", "rope", "theta", "yarn"]
