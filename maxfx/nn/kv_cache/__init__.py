"""``max.nn.kv_cache``: KV-cache configuration and maxfx's paged cache.

See ``docs/pages/attention.md`` for the paged design: one block pool buffer
``[pages, kv_dim, layers, page_size, kv_heads, head_dim]`` per model, a
lookup table per step, and `PagedKVCacheManager` handing out pages.

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.nn.kv_cache import KVCacheParams
    >>> KVCacheParams(DType.float32, n_kv_heads=2, head_dim=8, page_size=16).blocks_shape(num_layers=4, total_num_pages=10)
    [10, 2, 4, 16, 2, 8]
"""

from maxfx.nn.kv_cache import cache_params, manager
from maxfx.nn.kv_cache._page_manager import PagedKVCacheManager
from maxfx.nn.kv_cache._paged import KVCacheInputs, KVCacheInputsSequence, PagedCacheValues, RaggedKVCacheInputs
from maxfx.nn.kv_cache._params import KVCacheParams, KVCacheStrategy, MHAKVCacheParams, MLAKVCacheParams
from maxfx.nn.kv_cache._symbolic_inputs import KVCacheInputsInterface, KVCacheInputsPerDevice, KVCacheLeafInputs, MultiKVCacheInputs

__all__ = [
    "KVCacheInputs",
    "KVCacheInputsInterface",
    "KVCacheInputsPerDevice",
    "KVCacheInputsSequence",
    "KVCacheLeafInputs",
    "KVCacheParams",
    "KVCacheStrategy",
    "MHAKVCacheParams",
    "MLAKVCacheParams",
    "MultiKVCacheInputs",
    "PagedCacheValues",
    "PagedKVCacheManager",
    "RaggedKVCacheInputs",
    "cache_params",
    "manager",
]
