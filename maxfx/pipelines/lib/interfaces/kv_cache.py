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

from maxfx.nn.kv_cache import KVCacheParams, KVCacheStrategy, PagedKVCacheManager

__all__ = ["KVCacheMixin", "get_paged_manager", "kv_cache_bytes_per_token"]

# What a paged KV manager offers (maxfx's PagedKVCacheManager); duck-typed managers need all of it.
_PAGED_MANAGER_METHODS = ("claim", "fetch", "step", "release")


def _config_int(config: Any, keys: tuple[str, ...], where: str, default: int | None = None) -> int:
    """The first of ``keys`` a Hugging Face config sets (as an int), else ``default``."""
    for key in keys:
        value = config.get(key) if hasattr(config, "get") else getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    if default is None:
        raise ValueError(f"KVCacheMixin.{where}: the model config sets none of {', '.join(keys)}")
    return default


def kv_cache_bytes_per_token(params: KVCacheParams, num_layers: int) -> int:
    """Bytes one cached token takes on one device: ``kv_dim * num_layers * n_kv_heads_per_device * head_dim * dtype
    size``.
    """
    return (
        int(params.kv_dim)
        * int(num_layers)
        * int(params.n_kv_heads_per_device)
        * int(params.head_dim)
        * int(params.dtype.size_in_bytes)
    )


@runtime_checkable
class KVCacheMixin(Protocol):
    """The KV-cache side of a `PipelineModel` (MAX's protocol; subclass it to get `load_kv_manager`).

    Implement `get_kv_params`, `get_num_layers` and `estimate_kv_cache_size` (class
    methods: the registry and memory planning call them before a model exists).
    """

    @classmethod
    @abstractmethod
    def get_kv_params(
        cls, huggingface_config: Any, n_devices: int, kv_cache_config: Any, cache_dtype: Any
    ) -> KVCacheParams:
        """The `KVCacheParams` of the model's cache (abstract, as MAX).

        The base body is the usual decoder's, for overrides to call: KV heads
        ``num_key_value_heads`` (else ``num_attention_heads`` / GPT-2's ``n_head``),
        ``head_dim`` (else hidden size / heads), the config's page size, prefix
        caching and strategy (``model_default`` -> paged).

        Raises:
            ValueError: the config states no attention heads or hidden size.
        """
        heads = _config_int(huggingface_config, ("num_attention_heads", "n_head"), "get_kv_params")
        kv_heads = _config_int(huggingface_config, ("num_key_value_heads",), "get_kv_params", default=heads)
        head_dim = (
            _config_int(huggingface_config, ("head_dim",), "get_kv_params", default=0)
            or _config_int(huggingface_config, ("hidden_size", "n_embd"), "get_kv_params") // heads
        )
        strategy = KVCacheStrategy(getattr(kv_cache_config, "cache_strategy", KVCacheStrategy.PAGED))
        return KVCacheParams(
            dtype=cache_dtype,
            n_kv_heads=kv_heads,
            head_dim=head_dim,
            enable_prefix_caching=bool(getattr(kv_cache_config, "enable_prefix_caching", False)),
            cache_strategy=KVCacheStrategy.PAGED if strategy is KVCacheStrategy.MODEL_DEFAULT else strategy,
            page_size=int(getattr(kv_cache_config, "kv_cache_page_size", 128)),
            n_devices=int(n_devices),
        )

    @classmethod
    @abstractmethod
    def get_num_layers(cls, huggingface_config: Any) -> int:
        """How many layers keep a KV cache (abstract, as MAX; the base body reads ``num_hidden_layers`` / GPT-2's
        ``n_layer``).

        Raises:
            ValueError: the config states no layer count.
        """
        return _config_int(huggingface_config, ("num_hidden_layers", "n_layer"), "get_num_layers")

    @classmethod
    @abstractmethod
    def estimate_kv_cache_size(
        cls,
        pipeline_config: Any,
        available_cache_memory: int,
        devices: list[Any],
        huggingface_config: Any,
        kv_cache_config: Any,
        cache_dtype: Any,
    ) -> int:
        """Bytes the KV cache will take, at most ``available_cache_memory`` (abstract, as MAX).

        The base body, for overrides to call: what ``max_batch_size`` sequences of the
        longest length need (`get_kv_params`, `get_num_layers`,
        ``calculate_max_seq_len``), capped by ``available_cache_memory``; without a
        ``max_batch_size``, all of ``available_cache_memory``.
        """
        max_batch_size = getattr(pipeline_config, "max_batch_size", None)
        if not max_batch_size:
            return int(available_cache_memory)
        params = cls.get_kv_params(
            huggingface_config=huggingface_config,
            n_devices=len(devices),
            kv_cache_config=kv_cache_config,
            cache_dtype=cache_dtype,
        )
        num_layers = cls.get_num_layers(huggingface_config=huggingface_config)
        max_seq_len = cls.calculate_max_seq_len(pipeline_config, huggingface_config=huggingface_config)  # type: ignore[attr-defined]
        page_size = int(params.page_size or 1)
        needed = (
            kv_cache_bytes_per_token(params, num_layers)
            * page_size
            * math.ceil(max_seq_len / page_size)
            * int(max_batch_size)
        )
        return min(int(available_cache_memory), needed)

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
        encoding = (
            self.encoding
            if getattr(self, "encoding", None) is not None
            else pipeline_config.model_config.quantization_encoding
        )  # type: ignore[attr-defined]
        params = type(self).get_kv_params(
            huggingface_config=hf_config,
            n_devices=len(devices),
            kv_cache_config=self.kv_cache_config,
            cache_dtype=encoding.cache_dtype,
        )  # type: ignore[attr-defined]
        if params.page_size is None:
            raise ValueError(
                f"{type(self).__name__}.load_kv_manager: get_kv_params returned no page_size (the paged cache needs "
                "one)"
            )
        num_layers = type(self).get_num_layers(huggingface_config=hf_config)
        max_seq_len = type(self).calculate_max_seq_len(pipeline_config, huggingface_config=hf_config)  # type: ignore[attr-defined]
        max_batch_size = pipeline_config.max_batch_size or 1
        page_bytes = kv_cache_bytes_per_token(params, num_layers) * int(params.page_size)
        if available_cache_memory is None:
            total_pages = max_batch_size * math.ceil(max_seq_len / params.page_size)
        else:
            total_pages = int(available_cache_memory) // page_bytes
            if total_pages < 1:
                raise ValueError(
                    f"{type(self).__name__}.load_kv_manager: {available_cache_memory} bytes hold no KV page "
                    f"({page_bytes} bytes each)"
                )
        return PagedKVCacheManager(
            params,
            num_layers=num_layers,
            total_num_pages=total_pages,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            device=devices[0] if devices else None,
        )


def _is_paged_manager(manager: Any) -> bool:
    return isinstance(manager, PagedKVCacheManager) or (
        manager is not None and all(callable(getattr(manager, m, None)) for m in _PAGED_MANAGER_METHODS)
    )


def get_paged_manager(pipeline: Any) -> Any:
    """The paged KV manager of a pipeline, or None when it has none.

    Looks at ``pipeline._pipeline_model.kv_manager`` (MAX's layout) and
    ``pipeline.kv_manager``, which count when they are a `PagedKVCacheManager` or
    have its ``claim``, ``fetch``, ``step`` and ``release`` methods; then at the
    first of ``pipeline.kv_managers`` (`GenerateMixin.kv_managers`: for maxfx's
    `TextGenerationPipeline`, the engine's `~maxfx.generation.PagePool`).

    Example:
        >>> get_paged_manager(object()) is None
        True
    """
    model = getattr(pipeline, "_pipeline_model", None)
    for candidate in (getattr(model, "kv_manager", None), getattr(pipeline, "kv_manager", None)):
        if _is_paged_manager(candidate):
            return candidate
    managers = getattr(pipeline, "kv_managers", None)
    if isinstance(managers, (list, tuple)) and managers:
        return managers[0]
    return None
