"""Reading MAX's ``.max`` tensor files (what ``BINARY_MAX_CHECKPOINT`` debug prints write)."""

from __future__ import annotations

import os

from lowering.debug_print import read_max_checkpoint
from maxfx.driver._tensor import Tensor

__all__ = ["load_max_buffer"]


def load_max_buffer(path: str | os.PathLike) -> Tensor:
    """The tensor in the ``.max`` file ``path``, mapped read-only, with the dtype and shape the file records.

    Such files come from print ops (``ops.print``, ``TensorValue.print``,
    ``PrintHook``) run by a session set to
    ``set_debug_print_options("BINARY_MAX_CHECKPOINT", output_directory=...)``:
    one ``{label}.max`` per printed tensor.

    Raises:
        ValueError: the file is not in the ``.max`` format (e.g. a ``BINARY``
            dump: map that with ``Buffer.mmap``, giving dtype and shape).

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from maxfx.engine import InferenceSession
        >>> from maxfx.graph import Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> with Graph("g", input_types=[TensorType(DType.float32, [2, 2])]) as g:
        ...     ops.print(g.inputs[0] * 2, label="doubled")
        ...     g.output(g.inputs[0])
        >>> session = InferenceSession()
        >>> out_dir = tempfile.mkdtemp()
        >>> session.set_debug_print_options("BINARY_MAX_CHECKPOINT", output_directory=out_dir)
        >>> _ = session.load(g).execute(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
        >>> buffer = load_max_buffer(f"{out_dir}/doubled.max")
        >>> buffer.dtype, buffer.shape
        (<DType.float32: 81>, (2, 2))
        >>> buffer.to_numpy().tolist()
        [[2.0, 4.0], [6.0, 8.0]]
    """
    dtype, shape, offset = read_max_checkpoint(path)
    return Tensor.mmap(path, dtype, shape, mode="r", offset=offset)
