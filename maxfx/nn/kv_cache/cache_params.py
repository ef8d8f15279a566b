"""``max.nn.kv_cache.cache_params``: `KVCacheParams`, `MHAKVCacheParams`, `MLAKVCacheParams`, `KVCacheStrategy`."""

from maxfx.nn.kv_cache._params import KVCacheParams, KVCacheStrategy, MHAKVCacheParams, MLAKVCacheParams

__all__ = ["KVCacheParams", "KVCacheStrategy", "MHAKVCacheParams", "MLAKVCacheParams"]
