"""``max.nn.embedding``: `Embedding`."""

from maxfx.nn._basic import Embedding

__all__ = ["Embedding"]
