"""`KVCacheConfig`: how a model's KV cache is laid out and sized (nested in `MAXModelConfig` as ``kv_cache``).

Example:
    >>> kv = KVCacheConfig(kv_cache_page_size=16, enable_prefix_caching=True)
    >>> kv.cache_strategy.value, kv.kv_cache_page_size, kv.device_memory_utilization
    ('model_default', 16, 0.9)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from maxfx.pipelines.lib.config import _deps
from maxfx.pipelines.lib.config._base import (
    ConfigError,
    MAXConfig,
    check_bool,
    check_int,
    check_number,
    check_str,
    coerce_enum,
    option,
)

__all__ = ["KVCacheConfig"]

# The float dtypes a KV cache may be stored in (`kv_cache_format`).
KV_CACHE_FORMATS = ("float32", "float16", "bfloat16")

_OWNER = "KVCacheConfig"


@dataclass
class KVCacheConfig(MAXConfig):
    """The paged KV cache: page size, prefix caching, host swapping, memory share.

    Defaults are MAX 25.x's (``enable_prefix_caching=False``; MAX 26 turned it on).
    ``cache_strategy`` is a `maxfx.nn.kv_cache.KVCacheStrategy` (a string is converted).
    """

    cache_strategy: Any = option(
        factory=lambda: _deps.kv_cache_strategy().MODEL_DEFAULT,
        doc="KV cache strategy: 'model_default' (the architecture's choice, paged for every maxfx model) or 'paged'.",
    )
    kv_cache_page_size: int = option(
        128, doc="Tokens per page of the paged KV cache (128). maxfx takes any positive size."
    )
    enable_prefix_caching: bool = option(
        False, doc="Reuse the KV pages of prompt prefixes shared between requests (False)."
    )
    enable_kvcache_swapping_to_host: bool = option(
        False, doc="Swap evicted KV pages to host memory instead of dropping them (False)."
    )
    device_memory_utilization: float = option(
        0.9,
        doc=(
            "Share of free device memory for weights plus KV cache, in (0, 1]: kv_cache = free * utilization - weights "
            "(0.9)."
        ),
    )
    host_kvcache_swap_space_gb: float = option(
        50.0, doc="Host memory for swapped KV pages, in GiB, used when swapping is on (50.0)."
    )
    kv_cache_format: str | None = option(
        None,
        doc=(
            "The dtype KV pages are stored in, overriding the model's: 'float32', 'float16' or 'bfloat16' (None: the "
            "model's dtype). 'float16' halves the cache's memory and what a decode step reads."
        ),
    )
    _available_cache_memory: int | None = field(default=None, repr=False, compare=False)
    """Bytes available to the KV cache, set by the engine once memory is planned."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every option and convert strings (a `ConfigError` names the option).

        Raises:
            ConfigError: e.g. a page size below 1 or a memory share outside (0, 1].
        """
        self.cache_strategy = coerce_enum(_OWNER, "cache_strategy", self.cache_strategy, _deps.kv_cache_strategy())
        self.kv_cache_page_size = check_int(_OWNER, "kv_cache_page_size", self.kv_cache_page_size, minimum=1)
        self.enable_prefix_caching = check_bool(_OWNER, "enable_prefix_caching", self.enable_prefix_caching)
        self.enable_kvcache_swapping_to_host = check_bool(
            _OWNER, "enable_kvcache_swapping_to_host", self.enable_kvcache_swapping_to_host
        )
        self.device_memory_utilization = check_number(
            _OWNER, "device_memory_utilization", self.device_memory_utilization, above=0.0, maximum=1.0
        )
        self.host_kvcache_swap_space_gb = check_number(
            _OWNER, "host_kvcache_swap_space_gb", self.host_kvcache_swap_space_gb, above=0.0
        )
        fmt = check_str(_OWNER, "kv_cache_format", self.kv_cache_format, optional=True)
        if fmt is not None and fmt.removeprefix("DType.") not in KV_CACHE_FORMATS:
            raise ConfigError(
                f"{_OWNER}.kv_cache_format must be one of {KV_CACHE_FORMATS} or None, got {self.kv_cache_format!r}"
            )
        self.kv_cache_format = None if fmt is None else fmt.removeprefix("DType.")
