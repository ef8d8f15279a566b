"""``max.nn.kv_cache.cache_params``: `KVCacheParams`, `KVCacheStrategy`."""

from maxfx.nn.kv_cache._params import KVCacheParams, KVCacheStrategy

__all__ = ["KVCacheParams", "KVCacheStrategy"]
