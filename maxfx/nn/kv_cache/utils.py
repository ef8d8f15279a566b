"""``max.nn.kv_cache.utils``: resolved attention keys and `build_max_lengths_tensors`."""

from maxfx.nn.kv_cache._attn_key import (
    AttnKey,
    AttnKeyInterface,
    MHAAttnKey,
    MLAAttnKey,
    MultiAttnKey,
    build_max_lengths_tensors,
)

__all__ = ["AttnKey", "AttnKeyInterface", "MHAAttnKey", "MLAAttnKey", "MultiAttnKey", "build_max_lengths_tensors"]
