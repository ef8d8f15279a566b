"""``max.nn.kv_cache``: KV-cache configuration and maxfx's paged cache.

See ``docs/pages/attention.md`` for the paged design: one block pool buffer
``[pages, kv_dim, layers, page_size, kv_heads, head_dim]`` per model, a
lookup table per step, and `PagedKVCacheManager` handing out pages.

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.nn.kv_cache import KVCacheParams
    >>> KVCacheParams(DType.float32, n_kv_heads=2, head_dim=8, page_size=16).blocks_shape(num_layers=4,
    ...     total_num_pages=10)
    [10, 2, 4, 16, 2, 8]
"""

from maxfx.nn.kv_cache import cache_params, data_parallelism_utils, manager, utils
from maxfx.nn.kv_cache._attn_key import (
    AttnKey,
    AttnKeyInterface,
    MHAAttnKey,
    MLAAttnKey,
    MultiAttnKey,
    build_max_lengths_tensors,
)
from maxfx.nn.kv_cache._memory import (
    KVCacheBuffer,
    KVCacheQuantizationConfig,
    MultiKVCacheBuffer,
    MultiKVCacheParams,
    compute_max_seq_len_fitting_in_cache,
    compute_num_device_blocks,
    estimated_memory_size,
    spec_decode_cache_slack,
)
from maxfx.nn.kv_cache._page_manager import PagedKVCacheManager
from maxfx.nn.kv_cache._paged import KVCacheInputs, KVCacheInputsSequence, PagedCacheValues, RaggedKVCacheInputs
from maxfx.nn.kv_cache._params import KVCacheParams, KVCacheStrategy, MHAKVCacheParams, MLAKVCacheParams
from maxfx.nn.kv_cache._symbolic_inputs import (
    KVCacheInputsInterface,
    KVCacheInputsPerDevice,
    KVCacheLeafInputs,
    MultiKVCacheInputs,
)

__all__ = [
    "AttnKey",
    "AttnKeyInterface",
    "KVCacheBuffer",
    "KVCacheInputs",
    "KVCacheInputsInterface",
    "KVCacheInputsPerDevice",
    "KVCacheInputsSequence",
    "KVCacheLeafInputs",
    "KVCacheParams",
    "KVCacheQuantizationConfig",
    "KVCacheStrategy",
    "MHAAttnKey",
    "MHAKVCacheParams",
    "MLAAttnKey",
    "MLAKVCacheParams",
    "MultiAttnKey",
    "MultiKVCacheBuffer",
    "MultiKVCacheInputs",
    "MultiKVCacheParams",
    "PagedCacheValues",
    "PagedKVCacheManager",
    "RaggedKVCacheInputs",
    "build_max_lengths_tensors",
    "cache_params",
    "compute_max_seq_len_fitting_in_cache",
    "compute_num_device_blocks",
    "data_parallelism_utils",
    "estimated_memory_size",
    "manager",
    "spec_decode_cache_slack",
    "utils",
]
