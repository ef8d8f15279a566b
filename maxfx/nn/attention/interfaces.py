"""``max.nn.attention.interfaces``: the distributed attention interface."""

from __future__ import annotations

from maxfx.nn._layer import Module

__all__ = ["DistributedAttentionImpl"]


class DistributedAttentionImpl(Module):
    """Base of attention layers that run over several devices.

    Subclasses take per-device lists (inputs, KV collections, ``freqs_cis``,
    row offsets) and return one output per device:
    `TensorParallelAttentionWithRope`, `DataParallelAttentionWithRope`, and the
    latent-attention variants.
    """
