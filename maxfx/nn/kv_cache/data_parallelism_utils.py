"""``max.nn.kv_cache.data_parallelism_utils``: `split_into_groups`, `split_input_row_offsets`."""

from maxfx.nn.kv_cache._data_parallel import split_input_row_offsets, split_into_groups

__all__ = ["split_input_row_offsets", "split_into_groups"]
