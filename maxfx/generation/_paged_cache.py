"""`PagedLayerCache`: what one attention layer sees of the engine's paged KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

__all__ = ["PagedLayerCache"]


@dataclass(frozen=True)
class PagedLayerCache:
    """One layer's view of the paged KV cache, passed to the model's attention as its cache.

    ``k`` and ``v`` are the layer's token slots, ``[num_pages * page_size, Hkv, D]``;
    ``slots [B, T]`` says where each new token's keys and values go (padding goes
    to the scratch page) and ``gather [B, S]`` which slot holds position ``s`` of
    row ``b`` (the row's pages in order). A pytree, so a compiled step can return
    it. The attention that reads and writes it is the model's
    (`maxfx.models._layers.attention_with_cache`).
    """

    k: Any
    v: Any
    slots: Any
    gather: Any


jax.tree_util.register_dataclass(PagedLayerCache, data_fields=["k", "v", "slots", "gather"], meta_fields=[])
