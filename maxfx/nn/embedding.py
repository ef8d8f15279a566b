"""``max.nn.embedding``: `Embedding` and the deprecated `EmbeddingV1`."""

from maxfx.nn._basic import Embedding
from maxfx.nn._parallel import VocabParallelEmbedding
from maxfx.nn._v1 import EmbeddingV1

__all__ = ["Embedding", "EmbeddingV1", "VocabParallelEmbedding"]
