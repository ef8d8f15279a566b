"""Casting driver `Buffer`s to another dtype on their device (MAX's ``max.graph.buffer_utils``).

A cast runs as a one-op graph compiled once per ``(session, source dtype,
target dtype, device)`` and applied to the buffer flattened, so buffers of
every shape share it; the data never goes through the host.

Example:
    >>> import numpy as np
    >>> from maxfx.driver import Buffer
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph.buffer_utils import cast_tensor_to
    >>> cast_tensor_to(Buffer.from_numpy(np.array([[1.5, 2.25]], np.float32)), DType.bfloat16).dtype
    DType.bfloat16
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef, TensorType
from maxfx.driver._tensor import Buffer
from maxfx.engine import InferenceSession
from maxfx.graph._graph import Graph

__all__ = ["cast_dlpack_to", "cast_tensor_to", "cast_tensors_to"]

_CAST_MODELS: dict[tuple[int, DType, DType, str, int], Any] = {}
_SESSIONS: dict[tuple[str, int], Any] = {}


def _session_for(device: Any, session: Any) -> Any:
    if session is not None:
        return session
    key = (device.label, device.id)
    if key not in _SESSIONS:
        _SESSIONS[key] = InferenceSession(devices=[device])
    return _SESSIONS[key]


def _cast_model(old: DType, new: DType, device: Any, session: Any) -> Any:
    key = (id(session), old, new, device.label, device.id)
    model = _CAST_MODELS.get(key)
    if model is None:
        with Graph("cast", input_types=[TensorType(old, ["dim"], DeviceRef.from_device(device))]) as graph:
            graph.output(graph.inputs[0].tensor.cast(new))
        model = _CAST_MODELS[key] = session.load(graph)
    return model


def cast_tensor_to(tensor: Buffer, new_dtype: DType, session: Any = None) -> Buffer:
    """``tensor`` cast to ``new_dtype`` on its own device (``tensor`` itself when it already has that dtype).

    ``session`` (an `InferenceSession`) compiles the cast; by default one cached
    session per device is used.
    """
    if tensor.dtype == new_dtype:
        return tensor
    model = _cast_model(tensor.dtype, new_dtype, tensor.device, _session_for(tensor.device, session))
    flat = tensor.view(tensor.dtype, [tensor.num_elements])
    return model.execute(flat)[0].view(new_dtype, tensor.shape)


def cast_dlpack_to(raw_tensor: Any, old_dtype: DType, new_dtype: DType, device: Any, session: Any = None) -> Buffer:
    """A DLPack array read as ``old_dtype`` (its bits reinterpreted if it has another), moved to ``device``, cast to
    ``new_dtype``.
    """
    t = Buffer.from_dlpack(raw_tensor)
    if t.dtype != old_dtype:
        t = t.view(old_dtype, t.shape)
    return cast_tensor_to(t.to(device), new_dtype, session=session)


def cast_tensors_to(tensors: Sequence[Buffer] | None, new_dtype: DType, session: Any = None) -> list[Buffer]:
    """Each of ``tensors`` cast to ``new_dtype`` on its device (``[]`` for None or empty)."""
    return [cast_tensor_to(t, new_dtype, session=session) for t in tensors or ()]
