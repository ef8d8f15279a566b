"""``max.nn.kv_cache.cache_params``: the cache's parameters, buffers and memory estimation."""

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
from maxfx.nn.kv_cache._params import KVCacheParams, KVCacheStrategy, MHAKVCacheParams, MLAKVCacheParams

__all__ = [
    "KVCacheBuffer",
    "KVCacheParams",
    "KVCacheQuantizationConfig",
    "KVCacheStrategy",
    "MHAKVCacheParams",
    "MLAKVCacheParams",
    "MultiKVCacheBuffer",
    "MultiKVCacheParams",
    "compute_max_seq_len_fitting_in_cache",
    "compute_num_device_blocks",
    "estimated_memory_size",
    "spec_decode_cache_slack",
]
