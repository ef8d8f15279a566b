"""Resolved decode-attention dispatch shapes (MAX's ``max.nn.kv_cache.utils``): `AttnKey` and kin.

MAX's decode kernels read a small int64 "dispatch metadata" input: batch size,
longest prompt, the kernel's partition count and (for MHA) the longest cache.
An `AttnKey` is that shape without the cache length, so two steps that differ
only in cache length share one identity (a graph-capture key); `pack_into_buffer`
adds the cache length and gives the buffer a graph input takes
(``KVCacheParams.get_symbolic_inputs``: int64 ``[4]`` on the host for MHA,
``[3]`` on the device for MLA). maxfx's kernels do not need the partition
count; the inputs keep MAX's layout.

Example:
    >>> from maxfx.driver import CPU
    >>> from maxfx.nn.kv_cache import MHAAttnKey
    >>> MHAAttnKey(batch_size=2, max_prompt_length=1, num_partitions=1).pack_into_buffer(CPU(), 37).to_numpy().tolist()
    [2, 1, 1, 37]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from maxfx.driver._tensor import Buffer

__all__ = ["AttnKey", "AttnKeyInterface", "MHAAttnKey", "MLAAttnKey", "MultiAttnKey", "build_max_lengths_tensors"]


@dataclass(frozen=True)
class AttnKeyInterface:
    """Base of the resolved attention keys (a leaf `AttnKey` or a `MultiAttnKey` tree)."""

    def pack_into_buffer(self, device: Any, max_cache_valid_length: int) -> Buffer:
        """This key with ``max_cache_valid_length`` as a kernel dispatch-metadata buffer."""
        raise TypeError(
            f"{type(self).__name__} has no buffer layout of its own: use MHAAttnKey or MLAAttnKey (or pack each leaf "
            "of a MultiAttnKey)"
        )


@dataclass(frozen=True)
class AttnKey(AttnKeyInterface):
    """A decode dispatch shape: ``batch_size``, ``max_prompt_length`` and the kernel grid's ``num_partitions``."""

    batch_size: int
    max_prompt_length: int
    num_partitions: int


@dataclass(frozen=True)
class MHAAttnKey(AttnKey):
    """Multi-head attention's key: packs ``[batch, prompt, partitions, cache_length]`` (int64, on the host)."""

    def pack_into_buffer(self, device: Any, max_cache_valid_length: int) -> Buffer:
        """The 4-int64 host buffer (``device`` is not used: MHA's metadata input is on the CPU)."""
        return Buffer.from_numpy(
            np.array([self.batch_size, self.max_prompt_length, self.num_partitions, max_cache_valid_length], np.int64)
        )


@dataclass(frozen=True)
class MLAAttnKey(AttnKey):
    """Multi-latent attention's key: packs ``[batch, prompt, partitions]`` (int64) on ``device``."""

    def pack_into_buffer(self, device: Any, max_cache_valid_length: int) -> Buffer:
        """The 3-int64 buffer on ``device`` (the cache length travels in ``max_cache_length``)."""
        return Buffer.from_numpy(np.array([self.batch_size, self.max_prompt_length, self.num_partitions], np.int64)).to(
            device
        )


@dataclass(frozen=True)
class MultiAttnKey(AttnKeyInterface):
    """A tree of keys mirroring a `MultiKVCacheParams` tree; ``children`` is a tuple of ``(name, key)`` (hashable)."""

    children: tuple[tuple[str, AttnKeyInterface], ...]

    @classmethod
    def from_dict(cls, children: dict[str, AttnKeyInterface]) -> MultiAttnKey:
        """A `MultiAttnKey` from a name -> key mapping (in its order)."""
        return cls(children=tuple(children.items()))


def build_max_lengths_tensors(max_prompt_length: int, max_cache_length: int) -> tuple[Buffer, Buffer]:
    """The two ``[1]`` uint32 buffers ``(max_prompt_length, max_cache_length)`` a step's cache inputs take.

    Example:
        >>> [b.to_numpy().tolist() for b in build_max_lengths_tensors(5, 40)]
        [[5], [40]]
    """
    return Buffer.from_numpy(np.array([max_prompt_length], np.uint32)), Buffer.from_numpy(
        np.array([max_cache_length], np.uint32)
    )
