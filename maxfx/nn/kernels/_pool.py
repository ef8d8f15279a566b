"""Reading and writing a `PagedCacheValues` block pool in either layout maxfx accepts.

The registry's paged ops (``ops.kv_cache_store``, ``ops.kv_cache_gather``,
``ops.paged_attention``) address the multi-layer pool
``[pages, kv_dim, num_layers, page_size, n_kv_heads, head_dim]`` (rank 6, what
`KVCacheParams.input_types` declares). MAX's tests also hand kernels a
single-layer pool ``[pages, kv_dim, n_kv_heads, page_size, head_dim]`` (rank
5, heads before page slots): one collection per layer, so ``layer_idx`` does
not select anything in it. Kernels read such a pool through a rank-6 view
(one layer, slots before heads) and write it by storing into a rank-6 copy
that is written back; the op math stays in the registry ops.

Example:
    >>> from maxfx.nn.kernels import _pool
    >>> _pool.SINGLE_LAYER_RANK, _pool.MULTI_LAYER_RANK
    (5, 6)
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from lowering.types import BufferType
from maxfx.graph import ops

MULTI_LAYER_RANK = 6
SINGLE_LAYER_RANK = 5

__all__ = ["check_pool", "read_pool", "layer_for", "store_rows"]


def check_pool(where: str, blocks: Any, n_kv_heads: int, head_dim: int) -> None:
    """Raise unless ``blocks`` is a rank-6 or rank-5 pool with these heads and head dim."""
    shape = list(blocks.shape)
    if blocks.rank == MULTI_LAYER_RANK:
        heads, dim = shape[4], shape[5]
    elif blocks.rank == SINGLE_LAYER_RANK:
        heads, dim = shape[2], shape[4]
    else:
        raise ValueError(
            f"{where}: kv_collection.kv_blocks must be [pages, kv_dim, num_layers, page_size, n_kv_heads, head_dim] "
            f"or a single layer's [pages, kv_dim, n_kv_heads, page_size, head_dim], got shape {shape}"
        )
    if int(heads) != int(n_kv_heads) or int(dim) != int(head_dim):
        raise ValueError(
            f"{where}: kv_collection.kv_blocks {shape} holds {heads} heads of dim {dim}; kv_params says {n_kv_heads} "
            f"of dim {head_dim}"
        )


def _as_multi_layer(pool: Any) -> Any:
    """``[P, kv, H, S, D]`` → ``[P, kv, 1, S, H, D]``."""
    return ops.unsqueeze(ops.permute(pool, [0, 1, 3, 2, 4]), 2)


def read_pool(blocks: Any) -> Any:
    """The pool as the registry ops address it (a rank-6 value)."""
    if blocks.rank == SINGLE_LAYER_RANK:
        return _as_multi_layer(ops.buffer_load(blocks))
    return blocks


def layer_for(blocks: Any, layer: Any) -> Any:
    """The layer index within the rank-6 view: ``layer`` for a multi-layer pool, 0 for a single-layer one."""
    if blocks.rank == SINGLE_LAYER_RANK:
        return ops.constant(0, DType.uint32, layer.device)
    return layer


def store_rows(
    blocks: Any, rows: Any, lookup_table: Any, layer: Any, offsets: Any, start: Any, batch_offset: Any, kv_index: int
) -> None:
    """``ops.kv_cache_store`` of ragged ``rows [n, n_kv_heads, head_dim]`` into either pool layout."""
    rows = rows.cast(blocks.dtype)
    if blocks.rank != SINGLE_LAYER_RANK:
        ops.kv_cache_store(blocks, rows, lookup_table, layer, offsets, start, batch_offset, kv_index=kv_index)
        return
    view = _as_multi_layer(ops.buffer_load(blocks))
    scratch = ops.buffer_create(BufferType(view.dtype, list(view.shape), view.device))
    ops.buffer_store(scratch, view)
    ops.kv_cache_store(
        scratch, rows, lookup_table, layer_for(blocks, layer), offsets, start, batch_offset, kv_index=kv_index
    )
    updated = ops.squeeze(ops.buffer_load(scratch), 2)  # [P, kv, S, H, D]
    ops.buffer_store(blocks, ops.permute(updated, [0, 1, 3, 2, 4]))
