"""msgpack encoding of the interface types, with numpy arrays (optionally through shared memory).

Wire format: dataclasses become maps of their fields, enums their values,
tuples and sets arrays, and a numpy array ``{"__np__": True, "data", "shape",
"dtype"}`` (or ``{"__shm__": True, "name", "shape", "dtype"}`` when it went
through shared memory). Decoding is driven by the target type's annotations,
so ``RequestID``, enums, sets, tuples and nested dataclasses come back as such.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from ._context import state_types
from ._request import RequestID
from ._shared_memory import SharedMemoryArray, ndarray_to_shared_memory, open_shm_array, resolve_dtype

__all__ = ["MsgpackNumpyDecoder", "MsgpackNumpyEncoder", "msgpack_eq", "msgpack_numpy_decoder", "msgpack_numpy_encoder"]


# ---------------------------------------------------------------- encoding


class MsgpackNumpyEncoder:
    """Callable ``obj -> bytes``; picklable, so it can be handed to a worker process.

    Example::

        >>> import numpy as np
        >>> enc, dec = msgpack_numpy_encoder(), msgpack_numpy_decoder(dict[str, np.ndarray])
        >>> dec(enc({"x": np.arange(3, dtype=np.int16)}))["x"].dtype
        dtype('int16')
    """

    def __init__(self, use_shared_memory: bool = False, shared_memory_threshold: int = 0) -> None:
        if (
            isinstance(shared_memory_threshold, bool)
            or not isinstance(shared_memory_threshold, int)
            or shared_memory_threshold < 0
        ):
            raise ValueError(f"shared_memory_threshold must be an int >= 0 (bytes), got {shared_memory_threshold!r}")
        self.use_shared_memory = bool(use_shared_memory)
        self.shared_memory_threshold = shared_memory_threshold

    def _array(self, array: np.ndarray) -> dict[str, Any]:
        if array.dtype.hasobject:
            raise TypeError("msgpack cannot encode numpy arrays of Python objects (dtype=object)")
        if self.use_shared_memory and array.nbytes >= self.shared_memory_threshold:
            ref = ndarray_to_shared_memory(array)
            if ref is not None:
                return self._shm(ref)
        return {
            "__np__": True,
            "data": np.ascontiguousarray(array).tobytes(),
            "shape": list(array.shape),
            "dtype": str(array.dtype),
        }

    @staticmethod
    def _shm(ref: SharedMemoryArray) -> dict[str, Any]:
        return {"__shm__": True, "name": ref.name, "shape": list(ref.shape), "dtype": ref.dtype}

    def _default(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            return self._array(obj)
        if isinstance(obj, np.generic):
            item = obj.item()
            return item if isinstance(item, (bool, int, float, str, bytes)) else self._array(np.asarray(obj))
        if isinstance(obj, SharedMemoryArray):
            return self._shm(obj)
        if isinstance(obj, enum.Enum):
            return obj.value
        if isinstance(obj, (set, frozenset)):
            return sorted(obj) if all(isinstance(x, (int, str)) for x in obj) else list(obj)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        if hasattr(obj, "__dict__") and not isinstance(
            obj, (type, types.ModuleType, types.FunctionType, types.MethodType)
        ):
            return dict(vars(obj))
        raise TypeError(f"msgpack cannot encode {type(obj).__name__} objects ({obj!r:.80})")

    def __call__(self, obj: Any) -> bytes:
        return msgpack.packb(obj, default=self._default, use_bin_type=True)

    def __repr__(self) -> str:
        return (
            f"MsgpackNumpyEncoder(use_shared_memory={self.use_shared_memory}, "
            f"shared_memory_threshold={self.shared_memory_threshold})"
        )


def msgpack_numpy_encoder(use_shared_memory: bool = False, shared_memory_threshold: int = 0) -> MsgpackNumpyEncoder:
    """An encoder (``obj -> bytes``) that handles numpy arrays.

    With ``use_shared_memory``, arrays of at least ``shared_memory_threshold``
    bytes (0 = every array) are copied into shared memory and only their name
    travels; the decoder reads and frees the segment.

    Example::

        >>> import numpy as np
        >>> from maxfx.interfaces import EmbeddingsGenerationOutput
        >>> enc = msgpack_numpy_encoder(use_shared_memory=True, shared_memory_threshold=1024)
        >>> out = EmbeddingsGenerationOutput(np.ones((64, 64), np.float32))
        >>> len(enc(out)) < 200   # the 16 KiB array went through shared memory
        True
        >>> msgpack_numpy_decoder(EmbeddingsGenerationOutput)(enc(out)).embeddings.sum()
        np.float32(4096.0)
    """
    return MsgpackNumpyEncoder(use_shared_memory, shared_memory_threshold)


# ---------------------------------------------------------------- decoding


class _Mismatch(TypeError):
    pass


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        try:
            _HINTS[cls] = typing.get_type_hints(cls)
        except Exception:  # noqa: BLE001 - unresolvable annotations decode untyped
            _HINTS[cls] = {}
    return _HINTS[cls]


def _decode_array(value: dict[str, Any], copy: bool) -> np.ndarray:
    if value.get("__shm__") is True:
        return open_shm_array(value)
    array = np.frombuffer(value["data"], dtype=resolve_dtype(value["dtype"])).reshape(tuple(value["shape"]))
    return array.copy() if copy else array


def _is_array_wire(value: Any) -> bool:
    return isinstance(value, dict) and (value.get("__np__") is True or value.get("__shm__") is True)


class MsgpackNumpyDecoder:
    """Callable ``bytes -> object of type_``; picklable.

    Example::

        >>> from maxfx.interfaces import RequestID, TextGenerationOutput, GenerationStatus
        >>> enc, dec = msgpack_numpy_encoder(), msgpack_numpy_decoder(TextGenerationOutput)
        >>> out = dec(enc(TextGenerationOutput(RequestID("r"), [1, 2], GenerationStatus.ACTIVE)))
        >>> out.request_id, out.final_status
        (RequestID('r'), <GenerationStatus.ACTIVE: 'active'>)
    """

    def __init__(self, type_: Any, copy: bool = True) -> None:
        self.type_ = type_
        self.copy = bool(copy)

    def __call__(self, data: bytes) -> Any:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
        return self.convert(raw, self.type_)

    def __repr__(self) -> str:
        return f"MsgpackNumpyDecoder({self.type_!r}, copy={self.copy})"

    # -- conversion of unpacked msgpack data to a type --------------------------

    def _untyped(self, value: Any) -> Any:
        if isinstance(value, dict):
            if _is_array_wire(value):
                return _decode_array(value, self.copy)
            return {k: self._untyped(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._untyped(v) for v in value]
        return value

    def convert(self, value: Any, tp: Any, typevars: Mapping[Any, Any] | None = None) -> Any:
        """Turn unpacked msgpack data ``value`` into an instance of the type ``tp``."""
        if isinstance(tp, typing.TypeVar):
            tp = (typevars or {}).get(tp, Any)
        if tp is Any or tp is object or tp is None and value is None:
            return self._untyped(value)
        if tp is type(None):
            if value is not None:
                raise _Mismatch(f"expected None, got {type(value).__name__}")
            return None
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Union or origin is types.UnionType:
            if value is None and type(None) in args:
                return None
            errors = []
            for arg in args:
                if arg is type(None):
                    continue
                try:
                    return self.convert(value, arg, typevars)
                except (_Mismatch, TypeError, ValueError, KeyError) as e:
                    errors.append(str(e))
            raise _Mismatch(f"{value!r:.60} matches none of {tp}: {'; '.join(errors)}")
        if origin is typing.Literal:
            if value not in args:
                raise _Mismatch(f"{value!r} is not one of {args}")
            return value
        if origin is typing.Annotated:
            return self.convert(value, args[0], typevars)
        if origin is not None and isinstance(origin, type):
            return self._generic(value, origin, args, typevars)
        if isinstance(tp, type):
            return self._class(value, tp, typevars)
        return self._untyped(value)  # Callable[...] and other special forms

    def _generic(self, value: Any, origin: type, args: tuple[Any, ...], typevars: Mapping[Any, Any] | None) -> Any:
        if origin is np.ndarray:
            return self._class(value, np.ndarray, typevars)
        if dataclasses.is_dataclass(origin):
            params = getattr(origin, "__parameters__", ())
            return self._dataclass(value, origin, dict(zip(params, args, strict=False)))
        if issubclass(origin, Mapping):
            if not isinstance(value, dict):
                raise _Mismatch(f"expected a map for {origin.__name__}, got {type(value).__name__}")
            kt, vt = (args + (Any, Any))[:2] if args else (Any, Any)
            return {self.convert(k, kt, typevars): self.convert(v, vt, typevars) for k, v in value.items()}
        if issubclass(origin, tuple):
            if not isinstance(value, list):
                raise _Mismatch(f"expected an array for tuple, got {type(value).__name__}")
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(self.convert(v, args[0], typevars) for v in value)
            if args and len(args) != len(value):
                raise _Mismatch(f"expected {len(args)} items for {args}, got {len(value)}")
            return tuple(self.convert(v, t, typevars) for v, t in zip(value, args or (Any,) * len(value), strict=True))
        if issubclass(origin, (set, frozenset)) or origin.__name__ in ("Set", "AbstractSet", "MutableSet"):
            if not isinstance(value, list):
                raise _Mismatch(f"expected an array for set, got {type(value).__name__}")
            item = args[0] if args else Any
            built = {self.convert(v, item, typevars) for v in value}
            return frozenset(built) if issubclass(origin, frozenset) else built
        if issubclass(origin, Sequence) or origin.__name__ in ("Iterable", "Collection", "MutableSequence"):
            if not isinstance(value, list):
                raise _Mismatch(f"expected an array for {origin.__name__}, got {type(value).__name__}")
            item = args[0] if args else Any
            return [self.convert(v, item, typevars) for v in value]
        return self._class(value, origin, typevars)

    def _class(self, value: Any, cls: type, typevars: Mapping[Any, Any] | None) -> Any:
        if cls is np.ndarray:
            if not _is_array_wire(value):
                raise _Mismatch(f"expected an encoded numpy array, got {type(value).__name__}")
            return _decode_array(value, self.copy)
        if cls is RequestID:
            if not isinstance(value, str):
                raise _Mismatch(f"expected a str RequestID, got {type(value).__name__}")
            return RequestID(value)
        if issubclass(cls, enum.Enum):
            return cls(value)
        if cls is bool:
            if not isinstance(value, bool):
                raise _Mismatch(f"expected bool, got {type(value).__name__}")
            return value
        if cls is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _Mismatch(f"expected int, got {type(value).__name__}")
            return value
        if cls is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _Mismatch(f"expected float, got {type(value).__name__}")
            return float(value)
        if cls in (str, bytes):
            if not isinstance(value, cls):
                raise _Mismatch(f"expected {cls.__name__}, got {type(value).__name__}")
            return value
        if cls in (list, tuple, set, frozenset, dict):
            return self._generic(value, cls, (), typevars)
        if dataclasses.is_dataclass(cls):
            return self._dataclass(value, cls, {})
        if typing.is_typeddict(cls):
            if not isinstance(value, dict):
                raise _Mismatch(f"expected a map for {cls.__name__}, got {type(value).__name__}")
            hints = _hints(cls)
            return {k: self.convert(v, hints.get(k, Any), typevars) for k, v in value.items()}
        if getattr(cls, "_is_protocol", False):
            return self._untyped(value)
        if isinstance(value, dict) and not _is_array_wire(value):
            # A plain class encoded from its __dict__: rebuild it without calling __init__.
            obj = cls.__new__(cls)
            hints = {**state_types(cls), **_hints(cls)}
            for k, v in value.items():
                object.__setattr__(obj, k, self.convert(v, hints.get(k, Any), typevars))
            return obj
        if isinstance(value, cls):
            return value
        raise _Mismatch(f"cannot decode {type(value).__name__} as {cls.__name__}")

    def _dataclass(self, value: Any, cls: type, typevars: Mapping[Any, Any]) -> Any:
        if not isinstance(value, dict):
            raise _Mismatch(f"expected a map for {cls.__name__}, got {type(value).__name__}")
        hints = _hints(cls)
        init_kwargs, later = {}, {}
        for f in dataclasses.fields(cls):
            if f.name not in value:
                continue
            decoded = self.convert(value[f.name], hints.get(f.name, Any), typevars)
            (init_kwargs if f.init else later)[f.name] = decoded
        unknown = set(value) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise _Mismatch(f"{cls.__name__} has no field(s) {sorted(unknown)}")
        obj = cls(**init_kwargs)
        for name, decoded in later.items():
            object.__setattr__(obj, name, decoded)
        return obj


def msgpack_numpy_decoder(type_: Any, copy: bool = True) -> MsgpackNumpyDecoder:
    """A decoder (``bytes -> type_``) that restores numpy arrays and the annotated types.

    ``copy=True`` (default) gives arrays that own their memory; ``copy=False``
    returns read-only views of the message bytes. Arrays sent through shared
    memory are always copied out and the segment is freed.

    Example::

        >>> from maxfx.interfaces import RequestID, SchedulerResult, TextGenerationOutput, GenerationStatus
        >>> tp = dict[RequestID, SchedulerResult[TextGenerationOutput]]
        >>> msg = {RequestID("a"): SchedulerResult.create(TextGenerationOutput("a", [3],
        ...     GenerationStatus.END_OF_SEQUENCE))}
        >>> back = msgpack_numpy_decoder(tp)(msgpack_numpy_encoder()(msg))
        >>> back["a"].result.tokens, back["a"].is_done
        ([3], True)
    """
    return MsgpackNumpyDecoder(type_, copy)


# ---------------------------------------------------------------- comparison


def msgpack_eq(a: Any, b: Any) -> bool:
    """Structural equality of msgpack-able objects that may hold numpy arrays (meant for tests).

    Arrays compare by dtype, shape and values; dataclasses and plain objects
    field by field; the types must match.

    Example::

        >>> import numpy as np
        >>> from maxfx.interfaces import EmbeddingsGenerationOutput as E
        >>> msgpack_eq(E(np.ones(2)), E(np.ones(2))), msgpack_eq(E(np.ones(2)), E(np.zeros(2)))
        (True, False)
    """
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(msgpack_eq(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(msgpack_eq(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(msgpack_eq(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if (
        hasattr(a, "__dict__")
        and not isinstance(a, (type, types.ModuleType, types.FunctionType))
        and not isinstance(a, enum.Enum)
    ):
        return msgpack_eq(vars(a), vars(b))
    return bool(a == b)
