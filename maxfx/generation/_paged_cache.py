"""`PagedLayerCache`: what one attention layer sees of the engine's paged KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

__all__ = ["PagedLayerCache"]


@dataclass(frozen=True)
class PagedLayerCache:
    """One layer's view of the paged KV cache, passed to the model's attention as its cache.

    ``k`` and ``v`` are the layer's pages ``[num_pages, page_size, Hkv, D]``, the
    layout the paged attention kernels read in place (kept 4-D: a reshaped pool
    passed to a kernel makes XLA copy it whole); ``slots [B, T]`` says where each
    new token's keys and values go, as ``page * page_size + offset`` (padding goes
    to the scratch page 0) and ``pages [B, W]`` which pages hold row ``b``'s
    positions, in order (position ``s`` is in page ``pages[b, s // page_size]``, slot
    ``s % page_size``).
    A pytree, so a compiled step can return it. The attention that reads and
    writes it is the model's (`maxfx.models._layers.paged_attention`).
    """

    k: Any
    v: Any
    slots: Any
    pages: Any
    page_size: int


jax.tree_util.register_dataclass(PagedLayerCache, data_fields=["k", "v", "slots", "pages"], meta_fields=["page_size"])
