"""Splitting a batch over data-parallel replicas (MAX's ``max.nn.kv_cache.data_parallelism_utils``).

Example:
    >>> split_into_groups([0, 1, 2, 3, 4, 5, 6, 7], 3)
    [[0, 1, 2], [3, 4, 5], [6, 7]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from maxfx.graph import ops

__all__ = ["split_input_row_offsets", "split_into_groups"]


def split_into_groups[T](x: Sequence[T], groups: int) -> list[Sequence[T]]:
    """``x`` in ``groups`` consecutive groups of ``ceil(len(x) / groups)`` items (the last ones may be shorter or
    empty).

    Raises:
        ValueError: ``groups`` is not positive.
    """
    if int(groups) < 1:
        raise ValueError(f"split_into_groups: groups must be >= 1, got {groups}")
    per = -(-len(x) // int(groups))
    return [x[i * per : (i + 1) * per] for i in range(int(groups))]


def split_input_row_offsets(num_replicas: int, input_row_offsets: Any, data_parallel_splits: Any) -> list[Any]:
    """The row offsets of each data-parallel replica's requests, each rebased to start at 0.

    ``data_parallel_splits [num_replicas + 1]`` (int64) gives the first request
    of each replica (``[0, 2, 4]``: requests 0-1 on replica 0, 2-3 on replica 1);
    replica ``i`` gets ``input_row_offsets[splits[i] : splits[i+1] + 1] -
    input_row_offsets[splits[i]]`` (the last replica takes the rest).

    ``data_parallel_splits`` may be a graph value (MAX's form: the slices then
    have data-dependent lengths, dims ``offset_split_{i}``, which XLA can only
    run when those dims are bound by the graph's input shapes) or host
    integers (a list or numpy array: static slices, which run everywhere).

    Example:
        >>> import numpy as np
        >>> from maxfx.experimental.tensor import Tensor
        >>> offsets = Tensor(np.array([0, 3, 5, 9, 10], np.uint32))
        >>> [t.to_numpy().tolist() for t in split_input_row_offsets(2, offsets, [0, 2, 4])]
        [[0, 3, 5], [0, 4, 5]]
    """
    if not hasattr(data_parallel_splits, "type"):  # host integers: static slices
        splits = [int(v) for v in np.asarray(data_parallel_splits).reshape(-1)]
        if len(splits) != num_replicas + 1:
            raise ValueError(
                f"split_input_row_offsets: data_parallel_splits needs num_replicas + 1 = {num_replicas + 1} entries, "
                f"got {len(splits)}"
            )
        ends = [splits[i + 1] + 1 for i in range(num_replicas - 1)] + [None]
        return [input_row_offsets[splits[i] : ends[i]] - input_row_offsets[splits[i]] for i in range(num_replicas)]
    out = []
    for i in range(num_replicas):
        start = data_parallel_splits[i]
        end = None if i + 1 >= num_replicas else data_parallel_splits[i + 1] + 1
        piece = ops.slice_tensor(input_row_offsets, [(slice(start, end), f"offset_split_{i}")])
        out.append(piece - input_row_offsets[start])
    return out
