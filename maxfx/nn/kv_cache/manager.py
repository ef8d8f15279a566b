"""``max.nn.kv_cache.manager``: per-step cache inputs, plus maxfx's paged cache manager."""

from maxfx.nn.kv_cache._page_manager import PagedKVCacheManager
from maxfx.nn.kv_cache._paged import KVCacheInputs, KVCacheInputsSequence, PagedCacheValues, RaggedKVCacheInputs

__all__ = ["KVCacheInputs", "KVCacheInputsSequence", "RaggedKVCacheInputs", "PagedCacheValues", "PagedKVCacheManager"]
