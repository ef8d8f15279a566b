"""`PytorchWeights`: ``torch.save`` zip checkpoints read without torch, and safely.

A ``pytorch_model.bin`` is a zip: ``<archive>/data.pkl`` (a pickle of the state
dict) and ``<archive>/data/<key>`` (the raw bytes of each storage). The pickle
is read by `RestrictedUnpickler`, whose ``find_class`` resolves only the few
globals a state dict needs, to inert stand-ins: ``torch._utils._rebuild_tensor_v2``
(``_v3``, ``_rebuild_parameter``), the ``torch.*Storage`` and ``torch.<dtype>``
markers and ``collections.OrderedDict``. Any other global (``os.system``, ``builtins.eval``,
...) raises ``pickle.UnpicklingError`` before anything is called, so loading a
checkpoint cannot run code. Storages become memory-mapped numpy views of the
zip entries, with the tensor's storage offset, size and stride applied.

Example:
    >>> weights = PytorchWeights("pytorch_model.bin")  # doctest: +SKIP
    >>> weights.lm_head.weight.shape  # doctest: +SKIP
    [Dim(256), Dim(64)]
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.dims import Shape
from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx.graph.weights._protocol import CheckpointWeights, TensorInfo, TensorSource, _info

__all__ = ["ForbiddenGlobalError", "PytorchWeights", "RestrictedUnpickler", "open_pytorch_checkpoints"]

# torch.<Name>Storage -> element type; what torch.save writes in a storage's persistent id.
_STORAGE_DTYPES: dict[str, DType] = {
    "FloatStorage": DType.float32,
    "DoubleStorage": DType.float64,
    "HalfStorage": DType.float16,
    "BFloat16Storage": DType.bfloat16,
    "LongStorage": DType.int64,
    "IntStorage": DType.int32,
    "ShortStorage": DType.int16,
    "CharStorage": DType.int8,
    "ByteStorage": DType.uint8,
    "BoolStorage": DType.bool,
    "UInt16Storage": DType.uint16,
    "UInt32Storage": DType.uint32,
    "UInt64Storage": DType.uint64,
    "Float8_e4m3fnStorage": DType.float8_e4m3fn,
    "Float8_e5m2Storage": DType.float8_e5m2,
    "Float8_e4m3fnuzStorage": DType.float8_e4m3fnuz,
    "Float8_e5m2fnuzStorage": DType.float8_e5m2fnuz,
    "UntypedStorage": DType.uint8,
}


# torch.<dtype> globals, named by _rebuild_tensor_v3 (dtypes without a typed storage class).
_TORCH_DTYPES: dict[str, DType] = {
    "float32": DType.float32,
    "float": DType.float32,
    "float64": DType.float64,
    "double": DType.float64,
    "float16": DType.float16,
    "half": DType.float16,
    "bfloat16": DType.bfloat16,
    "int64": DType.int64,
    "long": DType.int64,
    "int32": DType.int32,
    "int": DType.int32,
    "int16": DType.int16,
    "short": DType.int16,
    "int8": DType.int8,
    "uint8": DType.uint8,
    "bool": DType.bool,
    "uint16": DType.uint16,
    "uint32": DType.uint32,
    "uint64": DType.uint64,
    "float8_e4m3fn": DType.float8_e4m3fn,
    "float8_e5m2": DType.float8_e5m2,
    "float8_e4m3fnuz": DType.float8_e4m3fnuz,
    "float8_e5m2fnuz": DType.float8_e5m2fnuz,
}


@dataclass(frozen=True)
class _DTypeMarker:
    """Stand-in for a ``torch.<dtype>`` object named in the pickle."""

    dtype: DType


@dataclass(frozen=True)
class _StorageType:
    """Stand-in for a ``torch.*Storage`` class named in the pickle."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class _Storage:
    """A storage of the checkpoint: zip entry ``data/<key>`` holding ``numel`` elements."""

    key: str
    dtype: DType
    numel: int


@dataclass(frozen=True)
class TorchTensorInfo:
    """Where one tensor lives: its storage, element offset, size and stride (in elements)."""

    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    file: str

    @property
    def dtype(self) -> DType:
        return self.storage.dtype


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any = False, backward_hooks: Any = None, metadata: Any = None) -> Any:
    return ("tensor", storage, storage_offset, size, stride)


def _rebuild_tensor_v3(
    storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any, backward_hooks: Any, dtype: Any, metadata: Any = None
) -> Any:
    # The storage is untyped (bytes); offset, size and stride count elements of ``dtype``.
    if isinstance(storage, _Storage) and isinstance(dtype, _DTypeMarker):
        storage = _Storage(storage.key, dtype.dtype, storage.numel * storage.dtype.size_in_bytes // dtype.dtype.size_in_bytes)
    return ("tensor", storage, storage_offset, size, stride)


def _rebuild_parameter(data: Any, requires_grad: Any = False, backward_hooks: Any = None, state: Any = None) -> Any:
    return data


class ForbiddenGlobalError(pickle.UnpicklingError):
    """A checkpoint's pickle names a global outside the allow-list (it could run code under torch.load)."""


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles a ``torch.save`` state dict, refusing every global but the few it needs.

    Args:
        file: the pickle bytes as a binary file.
        path: the checkpoint path (named in errors).

    Raises (from ``load``):
        ForbiddenGlobalError: (a ``pickle.UnpicklingError``) the pickle names a
            global outside the allow-list.
        pickle.UnpicklingError: an unknown or malformed persistent id.
    """

    _ALLOWED: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }

    def __init__(self, file: io.BufferedIOBase, path: str):
        super().__init__(file)
        self._path = path
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        allowed = self._ALLOWED.get((module, name))
        if allowed is not None:
            return allowed
        if module in ("torch", "torch.storage") and name in _STORAGE_DTYPES:
            return _StorageType(name, _STORAGE_DTYPES[name])
        if module == "torch" and name in _TORCH_DTYPES:
            return _DTypeMarker(_TORCH_DTYPES[name])
        raise ForbiddenGlobalError(
            f"{self._path}: refusing to load global '{module}.{name}' from the checkpoint's pickle; "
            "a PyTorch state dict needs only tensors, storages and OrderedDict, so this file may run code when loaded by torch.load"
        )

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"{self._path}: unsupported persistent id {pid!r:.120} in the checkpoint's pickle")
        _, storage_type, key, _location, numel = pid
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError(f"{self._path}: malformed storage reference {pid!r:.120}")
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(key, storage_type.dtype, numel)
        return storage


class TorchCheckpoint:
    """An opened ``torch.save`` zip: validated tensor table plus lazily mapped storages.

    Raises:
        ValueError: not a zip checkpoint, truncated, or a tensor reaches outside
            its storage (message names the file and tensor).
        pickle.UnpicklingError: the pickle names a forbidden global.
    """

    def __init__(self, path: os.PathLike[str] | str):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise ValueError(f"{self.path}: PyTorch checkpoint not found")
        try:
            with zipfile.ZipFile(self.path) as zf:
                self._entries = {i.filename: i for i in zf.infolist()}
                pkl_names = [n for n in self._entries if n == "data.pkl" or n.endswith("/data.pkl")]
                if len(pkl_names) != 1:
                    raise ValueError(f"{self.path}: not a torch.save checkpoint: expected one data.pkl in the zip, found {len(pkl_names)}")
                self._root = pkl_names[0][: -len("data.pkl")]
                pickled = zf.read(pkl_names[0])
                byteorder = zf.read(self._root + "byteorder").decode().strip() if self._root + "byteorder" in self._entries else "little"
        except zipfile.BadZipFile as e:
            hint = " (legacy non-zip torch.save files are not supported)" if _looks_like_legacy_pickle(self.path) else ""
            raise ValueError(f"{self.path}: not a zip-based PyTorch checkpoint or truncated: {e}{hint}") from None
        except (OSError, EOFError, zipfile.LargeZipFile) as e:
            raise ValueError(f"{self.path}: cannot read PyTorch checkpoint: {e}") from None
        if byteorder not in ("little", "big"):
            raise ValueError(f"{self.path}: unknown byteorder record {byteorder!r}")
        self._big_endian = byteorder == "big"
        unpickler = RestrictedUnpickler(io.BytesIO(pickled), self.path)
        try:
            obj = unpickler.load()
        except ForbiddenGlobalError:
            raise
        except Exception as e:  # noqa: BLE001 - malformed pickles raise anything
            raise ValueError(f"{self.path}: corrupt pickle in the checkpoint: {type(e).__name__}: {e}") from None
        self.tensors: dict[str, TorchTensorInfo] = {}
        self._flatten(obj, "", set())
        for key, storage in unpickler.storages.items():
            self._check_storage(key, storage)
        for name, info in self.tensors.items():
            self._check_extent(name, info)
        self._map: np.ndarray | None = None
        self._storage_arrays: dict[tuple[str, DType], np.ndarray] = {}

    def _flatten(self, obj: Any, prefix: str, seen: set[int]) -> None:
        if not isinstance(obj, dict):
            raise ValueError(f"{self.path}: the checkpoint holds a {type(obj).__name__}, not a state dict")
        if id(obj) in seen:
            raise ValueError(f"{self.path}: the state dict refers to itself at {prefix[:-1]!r}")
        seen.add(id(obj))
        for key, value in obj.items():
            name = f"{prefix}{key}"
            if isinstance(value, tuple) and len(value) == 5 and value[0] == "tensor":
                self.tensors[name] = self._tensor_info(name, value)
            elif isinstance(value, dict):
                self._flatten(value, name + ".", seen)
            # Other entries (step counters, config strings) are not weights.

    def _tensor_info(self, name: str, value: tuple) -> TorchTensorInfo:
        _, storage, offset, size, stride = value
        ok = (
            isinstance(storage, _Storage)
            and isinstance(offset, int)
            and isinstance(size, tuple)
            and isinstance(stride, tuple)
            and len(size) == len(stride)
            and all(isinstance(d, int) and d >= 0 for d in size)
            and all(isinstance(s, int) and s >= 0 for s in stride)
        )
        ok = ok and isinstance(storage.dtype, DType) and isinstance(storage.numel, int)
        if not ok or offset < 0:
            raise ValueError(f"{self.path}: malformed tensor record for {name!r}")
        return TorchTensorInfo(storage, offset, tuple(size), tuple(stride), self.path)

    def _entry(self, key: str) -> zipfile.ZipInfo:
        return self._entries[self._root + "data/" + key]

    def _check_storage(self, key: str, storage: _Storage) -> None:
        # A pickle can BUILD new state into any object it made, so re-check the fields.
        if not (isinstance(storage.key, str) and isinstance(storage.dtype, DType) and isinstance(storage.numel, int) and storage.numel >= 0):
            raise ValueError(f"{self.path}: malformed storage record {key!r} in the checkpoint's pickle")
        entry = self._entries.get(self._root + "data/" + key)
        if entry is None:
            raise ValueError(f"{self.path}: storage data/{key} is missing from the zip (truncated checkpoint?)")
        need = storage.numel * storage.dtype.size_in_bytes
        if entry.file_size < need:
            raise ValueError(f"{self.path}: storage data/{key} has {entry.file_size} bytes but {storage.numel} {storage.dtype} elements need {need}")
        if entry.compress_type == zipfile.ZIP_STORED:
            start = self._data_start(entry)
            if start + entry.file_size > os.path.getsize(self.path):
                raise ValueError(f"{self.path}: storage data/{key} runs past the end of the file (truncated checkpoint)")

    def _check_extent(self, name: str, info: TorchTensorInfo) -> None:
        if math.prod(info.shape) == 0:
            return
        last = info.offset + sum((d - 1) * s for d, s in zip(info.shape, info.stride))
        if last >= info.storage.numel:
            raise ValueError(
                f"{self.path}: tensor {name!r} (shape {list(info.shape)}, stride {list(info.stride)}, offset {info.offset}) "
                f"reaches element {last} of a storage with {info.storage.numel}"
            )

    def _data_start(self, entry: zipfile.ZipInfo) -> int:
        # The local header's extra field may differ from the central directory's, so read it.
        with open(self.path, "rb") as f:
            f.seek(entry.header_offset)
            header = f.read(30)
        if len(header) < 30 or header[:4] != b"PK\x03\x04":
            raise ValueError(f"{self.path}: corrupt zip local header for {entry.filename}")
        name_len = int.from_bytes(header[26:28], "little")
        extra_len = int.from_bytes(header[28:30], "little")
        return entry.header_offset + 30 + name_len + extra_len

    def _storage_array(self, storage: _Storage) -> np.ndarray:
        arr = self._storage_arrays.get((storage.key, storage.dtype))
        if arr is not None:
            return arr
        entry = self._entry(storage.key)
        nbytes = storage.numel * storage.dtype.size_in_bytes
        if entry.compress_type == zipfile.ZIP_STORED:
            if self._map is None:
                # Copy-on-write keeps arrays writable for DLPack without ever modifying the file.
                self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
            start = self._data_start(entry)
            raw = self._map[start : start + nbytes]
        else:
            with zipfile.ZipFile(self.path) as zf:
                raw = np.frombuffer(bytearray(zf.read(entry.filename)[:nbytes]), np.uint8)
        dtype = storage.dtype.to_numpy()
        if self._big_endian and dtype.itemsize > 1:
            arr = raw.view(dtype.newbyteorder(">")).astype(dtype)
        else:
            arr = raw.view(dtype)
        self._storage_arrays[(storage.key, storage.dtype)] = arr
        return arr

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a numpy array (a view of the file when contiguous)."""
        info = self.tensors[name]
        storage = self._storage_array(info.storage)
        count = math.prod(info.shape)
        if count == 0:
            return np.zeros(info.shape, storage.dtype)
        contiguous = tuple(int(s) for s in np.cumprod((1,) + info.shape[:0:-1])[::-1]) if info.shape else ()
        dims_that_matter = [(d, s, c) for d, s, c in zip(info.shape, info.stride, contiguous) if d != 1]
        if all(s == c for _, s, c in dims_that_matter):
            return storage[info.offset : info.offset + count].reshape(info.shape)
        item = storage.itemsize
        view = np.lib.stride_tricks.as_strided(storage[info.offset :], shape=info.shape, strides=tuple(s * item for s in info.stride), writeable=False)
        return np.ascontiguousarray(view)


def _looks_like_legacy_pickle(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"


class _PytorchSource(TensorSource):
    kind = "PyTorch checkpoint"

    def __init__(self, checkpoints: dict[str, TorchCheckpoint], tensor_infos: dict[str, TorchTensorInfo], label: str):
        super().__init__(label)
        self._checkpoints = checkpoints
        self._infos = tensor_infos
        self._cache: dict[str, np.ndarray] = {}

    def names(self) -> Sequence[str]:
        return list(self._infos)

    def info(self, name: str) -> TensorInfo:
        t = self._infos[name]
        return TensorInfo(t.dtype, t.shape, t.dtype, t.shape, None, math.prod(t.shape) * t.dtype.size_in_bytes)

    def read(self, name: str) -> np.ndarray:
        value = self._cache.get(name)
        if value is None:
            info = self._infos[name]
            checkpoint = self._checkpoints.get(info.file)
            if checkpoint is None:
                checkpoint = self._checkpoints[info.file] = TorchCheckpoint(info.file)
            value = self._cache[name] = checkpoint.read(name)
        return value


def open_pytorch_checkpoints(paths: Sequence[os.PathLike[str] | str]) -> PytorchWeights:
    """One `PytorchWeights` over several checkpoint shards (tensor names must not repeat)."""
    checkpoints = {os.fspath(p): TorchCheckpoint(p) for p in paths}
    merged: dict[str, TorchTensorInfo] = {}
    for path, checkpoint in checkpoints.items():
        for name, info in checkpoint.tensors.items():
            if name in merged:
                raise ValueError(f"{path}: tensor {name!r} is also in {merged[name].file}; shards of one checkpoint must not overlap")
            merged[name] = info
    weights = PytorchWeights(next(iter(checkpoints)), tensor_infos=merged)
    weights._source._checkpoints.update(checkpoints)
    return weights


class PytorchWeights(CheckpointWeights):
    """Weights from a PyTorch ``torch.save`` checkpoint (``.bin``/``.pt``/``.pth``), read without torch.

    Only zip checkpoints holding a (possibly nested) dict of tensors are
    accepted; nested dicts are flattened with dotted names. The pickle is read
    with `RestrictedUnpickler`: it cannot execute code.

    Args:
        filepath: the checkpoint file.
        tensor_infos: name -> tensor record (to share one parsed table; records
            may come from several files).
        prefix: the current name or prefix.
        allocated: dict shared by a tree of accessors for allocated values.

    Raises:
        ValueError: not a zip checkpoint, truncated or inconsistent (names the file).
        pickle.UnpicklingError: the pickle references a forbidden global (names
            the file and the global).
    """

    def __init__(
        self,
        filepath: os.PathLike[str] | str,
        tensor_infos: dict[str, Any] | None = None,
        prefix: str = "",
        allocated: dict[str, Any] | None = None,
    ) -> None:
        self._filepath = os.fspath(filepath)
        checkpoints: dict[str, TorchCheckpoint] = {}
        if tensor_infos is None:
            checkpoint = checkpoints[self._filepath] = TorchCheckpoint(self._filepath)
            tensor_infos = checkpoint.tensors
        self._tensor_infos = tensor_infos
        files = {info.file for info in tensor_infos.values()} or {self._filepath}
        label = self._filepath if len(files) == 1 else f"{len(files)} PyTorch checkpoint files ({sorted(files)[0]}, ...)"
        self._source = _PytorchSource(checkpoints, tensor_infos, label)
        self._prefix = prefix
        self._allocated = {} if allocated is None else allocated

    @property
    def dtype(self) -> DType:
        """The current weight's dtype (KeyError if no weight has this name)."""
        return _info(self).dtype

    @property
    def shape(self) -> Shape:
        """The current weight's shape (KeyError if no weight has this name)."""
        return Shape(_info(self).shape)

    @property
    def quantization_encoding(self) -> QuantizationEncoding | None:
        """Always None for an existing weight: PyTorch checkpoints hold plain tensors (KeyError if none has this name)."""
        return _info(self).quantization_encoding
