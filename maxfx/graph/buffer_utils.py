"""``max.graph.buffer_utils``: on-device dtype casts of driver Buffers."""

from maxfx.graph._buffer_cast import cast_dlpack_to, cast_tensor_to, cast_tensors_to

__all__ = ["cast_dlpack_to", "cast_tensor_to", "cast_tensors_to"]
