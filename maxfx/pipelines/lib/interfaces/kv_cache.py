"""`KVCacheMixin` (the KV-cache side of a `PipelineModel`) and `get_paged_manager`.

A model with a paged KV cache implements three class methods: `get_kv_params`
(the cache's `KVCacheParams`), `get_num_layers` and `estimate_kv_cache_size`.
`load_kv_manager` then builds the host-side page allocator
(`maxfx.nn.kv_cache.PagedKVCacheManager`) sized to the memory it is given.

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.nn.kv_cache import KVCacheParams
    >>> params = KVCacheParams(DType.float32, n_kv_heads=2, head_dim=8, page_size=16)
    >>> kv_cache_bytes_per_token(params, num_layers=4)  # K and V, 4 layers, 2 heads of 8 float32s
    512
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any, Protocol, runtime_checkable

from maxfx.nn.kv_cache import KVCacheParams, PagedKVCacheManager

__all__ = ["KVCacheMixin", "get_paged_manager", "kv_cache_bytes_per_token"]

# What a paged KV manager offers (maxfx's PagedKVCacheManager); duck-typed managers need all of it.
_PAGED_MANAGER_METHODS = ("claim", "fetch", "step", "release")


def kv_cache_bytes_per_token(params: KVCacheParams, num_layers: int) -> int:
    """Bytes one cached token takes on one device: ``kv_dim * num_layers * n_kv_heads_per_device * head_dim * dtype size``."""
    return int(params.kv_dim) * int(num_layers) * int(params.n_kv_heads_per_device) * int(params.head_dim) * int(params.dtype.size_in_bytes)


@runtime_checkable
class KVCacheMixin(Protocol):
    """The KV-cache side of a `PipelineModel` (MAX's protocol; subclass it to get `load_kv_manager`).

    Implement `get_kv_params`, `get_num_layers` and `estimate_kv_cache_size` (class
    methods: the registry and memory planning call them before a model exists).
    """

    @classmethod
    @abstractmethod
    def get_kv_params(cls, huggingface_config: Any, n_devices: int, kv_cache_config: Any, cache_dtype: Any) -> KVCacheParams:
        """The `KVCacheParams` of the model's cache (heads, head size, page size, dtype)."""

    @classmethod
    @abstractmethod
    def get_num_layers(cls, huggingface_config: Any) -> int:
        """How many layers keep a KV cache."""

    @classmethod
    @abstractmethod
    def estimate_kv_cache_size(cls, pipeline_config: Any, available_cache_memory: int, devices: list[Any], huggingface_config: Any, kv_cache_config: Any, cache_dtype: Any) -> int:
        """Bytes the KV cache will take, at most ``available_cache_memory``."""

    def load_kv_manager(self, session: Any, available_cache_memory: int | None) -> PagedKVCacheManager:
        """A `PagedKVCacheManager` for this model, with as many pages as ``available_cache_memory`` holds.

        Reads ``self.pipeline_config``, ``self.huggingface_config``, ``self.devices``,
        ``self.kv_cache_config`` and ``self.encoding`` (what `PipelineModel` sets).
        With ``available_cache_memory=None`` the pool holds ``max_batch_size``
        sequences of the model's longest length (``max_batch_size`` 1 when unset).

        Raises:
            ValueError: the memory holds no page, or the cache params have no page size.
        """
        del session  # maxfx's page allocator lives on the host; the session compiles nothing for it
        pipeline_config, hf_config = self.pipeline_config, self.huggingface_config  # type: ignore[attr-defined]
        devices = list(self.devices)  # type: ignore[attr-defined]
        encoding = self.encoding if getattr(self, "encoding", None) is not None else pipeline_config.model_config.quantization_encoding  # type: ignore[attr-defined]
        params = type(self).get_kv_params(huggingface_config=hf_config, n_devices=len(devices), kv_cache_config=self.kv_cache_config, cache_dtype=encoding.cache_dtype)  # type: ignore[attr-defined]
        if params.page_size is None:
            raise ValueError(f"{type(self).__name__}.load_kv_manager: get_kv_params returned no page_size (the paged cache needs one)")
        num_layers = type(self).get_num_layers(huggingface_config=hf_config)
        max_seq_len = type(self).calculate_max_seq_len(pipeline_config, huggingface_config=hf_config)  # type: ignore[attr-defined]
        max_batch_size = pipeline_config.max_batch_size or 1
        page_bytes = kv_cache_bytes_per_token(params, num_layers) * int(params.page_size)
        if available_cache_memory is None:
            total_pages = max_batch_size * math.ceil(max_seq_len / params.page_size)
        else:
            total_pages = int(available_cache_memory) // page_bytes
            if total_pages < 1:
                raise ValueError(f"{type(self).__name__}.load_kv_manager: {available_cache_memory} bytes hold no KV page ({page_bytes} bytes each)")
        return PagedKVCacheManager(params, num_layers=num_layers, total_num_pages=total_pages, max_batch_size=max_batch_size, max_seq_len=max_seq_len, device=devices[0] if devices else None)


def _is_paged_manager(manager: Any) -> bool:
    return isinstance(manager, PagedKVCacheManager) or (manager is not None and all(callable(getattr(manager, m, None)) for m in _PAGED_MANAGER_METHODS))


def get_paged_manager(pipeline: Any) -> Any:
    """The paged KV manager of a pipeline, or None when it has none.

    Looks at ``pipeline._pipeline_model.kv_manager`` (MAX's layout), then
    ``pipeline.kv_manager``, then the first of ``pipeline.kv_managers``; a manager
    counts when it is a `PagedKVCacheManager` or has its ``claim``, ``fetch``,
    ``step`` and ``release`` methods.

    Example:
        >>> get_paged_manager(object()) is None
        True
    """
    model = getattr(pipeline, "_pipeline_model", None)
    candidates = [getattr(model, "kv_manager", None), getattr(pipeline, "kv_manager", None)]
    managers = getattr(pipeline, "kv_managers", None)
    if isinstance(managers, (list, tuple)) and managers:
        candidates.append(managers[0])
    return next((m for m in candidates if _is_paged_manager(m)), None)
