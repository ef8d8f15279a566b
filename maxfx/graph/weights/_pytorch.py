"""`PytorchWeights`: ``torch.save`` zip checkpoints read without torch, and safely.

A ``pytorch_model.bin`` is a zip: ``<archive>/data.pkl`` (a pickle of the state
dict) and ``<archive>/data/<key>`` (the raw bytes of each storage). The pickle
is read by `RestrictedUnpickler`, whose ``find_class`` resolves only the few
globals a state dict needs, to inert stand-ins: ``torch._utils._rebuild_tensor_v2``
(``_v3``, ``_rebuild_parameter``), the ``torch.*Storage`` and ``torch.<dtype>``
markers and ``collections.OrderedDict``. Any other global (``os.system``, ``builtins.eval``,
...) raises ``pickle.UnpicklingError`` before anything is called, so loading a
checkpoint cannot run code. The stand-ins refuse pickle ``BUILD`` (set-state)
opcodes, so a pickle cannot re-point a storage after it is validated or modify
the loader's own functions. Storages become memory-mapped numpy views of the
zip entries, with the tensor's storage offset, size and stride applied; every
read is bounded to its own zip entry and CRC-checked, and compressed entries are
streamed with a byte limit (see `TorchCheckpoint`).

Example:
    >>> weights = PytorchWeights("pytorch_model.bin")  # doctest: +SKIP
    >>> weights.lm_head.weight.shape  # doctest: +SKIP
    [Dim(256), Dim(64)]
"""

from __future__ import annotations

import collections
import dataclasses
import io
import math
import os
import pickle
import reprlib
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.dims import Shape
from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx.graph.weights._protocol import CheckpointWeights, TensorInfo, TensorSource, _info

__all__ = [
    "CorruptCheckpointError",
    "ForbiddenBuildError",
    "ForbiddenGlobalError",
    "PytorchWeights",
    "RestrictedUnpickler",
    "open_pytorch_checkpoints",
]

# data.pkl holds only names, shapes and storage references (~100-200 bytes per
# tensor: a 70B Llama's is under 1 MB). 64 MiB is far above any real state
# dict, yet bounds what a deflate bomb (a few MB inflating to GiBs) or a huge
# stored pickle can make us allocate before a single tensor is checked.
_MAX_PICKLE_BYTES = 64 << 20
# State dicts nest a few levels (optimizer state, submodules); deeper means a
# hostile or broken pickle, reported before Python's recursion limit is hit.
_MAX_NESTING = 100
# An expanded (stride-0) view is copied by every consumer: allow at most this many times its
# storage's bytes, or this many bytes, so a tiny file cannot claim gigabytes.
_MAX_EXPANSION, _MAX_EXPANDED_BYTES = 8, 16 << 20
# Streaming chunk for compressed entries (bounded memory while inflating).
_CHUNK = 1 << 20
_short = reprlib.Repr(maxlevel=3, maxstring=60, maxother=60).repr

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


class CorruptCheckpointError(ValueError):
    """A ``torch.save`` checkpoint is truncated, inconsistent or oversized (the message names the file and entry or
    tensor).
    """


class ForbiddenGlobalError(pickle.UnpicklingError):
    """A checkpoint's pickle names a global outside the allow-list (it could run code under torch.load)."""


class ForbiddenBuildError(pickle.UnpicklingError):
    """A checkpoint's pickle sets state (``BUILD``) on an object that must stay as the loader made it."""


class _Immutable:
    """Mixin for the objects a pickle can reach: a ``BUILD`` opcode on one is refused.

    pickle's ``BUILD`` calls ``obj.__setstate__(state)`` when it exists, and
    otherwise writes ``obj.__dict__`` directly or ``setattr``s slot state, which
    even a frozen dataclass cannot stop. Defining ``__setstate__`` to raise closes
    both doors. ``__reduce__`` carries no state, so ``copy.copy`` still works.

    Example:
        >>> try:
        ...     _DTypeMarker(DType.float32).__setstate__({"dtype": DType.int8})
        ... except ForbiddenBuildError as e:
        ...     print(str(e)[:43])
        refusing BUILD (set state) on _DTypeMarker(
    """

    __slots__ = ()

    def __setstate__(self, state: Any) -> None:
        raise ForbiddenBuildError(
            f"refusing BUILD (set state) on {self._what()}; a state dict sets state only on OrderedDict, so the pickle "
            "tries to change a validated storage or the loader itself"
        )

    def _what(self) -> str:
        return _short(self)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), tuple(getattr(self, f.name) for f in dataclasses.fields(self))  # type: ignore[arg-type]


@dataclass(frozen=True)
class _DTypeMarker(_Immutable):
    """Stand-in for a ``torch.<dtype>`` object named in the pickle."""

    dtype: DType


@dataclass(frozen=True)
class _StorageType(_Immutable):
    """Stand-in for a ``torch.*Storage`` class named in the pickle."""

    name: str
    dtype: DType


@dataclass(frozen=True)
class _Storage(_Immutable):
    """A storage of the checkpoint: zip entry ``data/<key>`` holding ``numel`` elements."""

    key: str
    dtype: DType
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.size_in_bytes

    def _what(self) -> str:
        return f"_Storage data/{self.key} ({self.numel} {self.dtype} elements)"


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


def _rebuild_tensor_v2(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    backward_hooks: Any = None,
    metadata: Any = None,
) -> Any:
    return ("tensor", storage, storage_offset, size, stride)


def _rebuild_tensor_v3(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    backward_hooks: Any,
    dtype: Any,
    metadata: Any = None,
) -> Any:
    # The storage is untyped (bytes); offset, size and stride count elements of ``dtype``.
    if isinstance(storage, _Storage) and isinstance(dtype, _DTypeMarker):
        storage = _Storage(storage.key, dtype.dtype, storage.nbytes // dtype.dtype.size_in_bytes)
    return ("tensor", storage, storage_offset, size, stride)


def _rebuild_parameter(data: Any, requires_grad: Any = False, backward_hooks: Any = None, state: Any = None) -> Any:
    return data


@dataclass(frozen=True)
class _Rebuilder(_Immutable):
    """An allow-listed ``torch._utils`` callable as the pickle sees it.

    The pickle gets this wrapper, never the module function: ``BUILD`` on it is
    refused, so a checkpoint cannot ``setattr`` on maxfx's own functions.
    """

    name: str
    fn: Any

    def _what(self) -> str:
        return f"the allow-listed callable torch._utils.{self.name}"

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class _StateDict(collections.OrderedDict):
    """``collections.OrderedDict`` as the pickle sees it.

    ``model.state_dict()`` carries a ``_metadata`` attribute (per-module
    versions) that pickle restores with ``BUILD``: that one legit case is
    accepted, checked to be a ``dict`` of string keys, and dropped (weights
    do not need it). Other state is refused.
    """

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, dict) and all(isinstance(k, str) for k in state)):
            raise ForbiddenBuildError(
                f"refusing BUILD (set state) {_short(state)} on an OrderedDict; expected a dict of attributes such as "
                "torch's _metadata"
            )


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles a ``torch.save`` state dict, refusing every global but the few it needs.

    Args:
        file: the pickle bytes as a binary file.
        path: the checkpoint path (named in errors).

    Raises (from ``load``):
        ForbiddenGlobalError: (a ``pickle.UnpicklingError``) the pickle names a
            global outside the allow-list.
        ForbiddenBuildError: (a ``pickle.UnpicklingError``) the pickle sets state
            on a storage, marker or allow-listed callable.
        pickle.UnpicklingError: an unknown or malformed persistent id.
    """

    _ALLOWED: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): _Rebuilder("_rebuild_tensor_v2", _rebuild_tensor_v2),
        ("torch._utils", "_rebuild_tensor_v3"): _Rebuilder("_rebuild_tensor_v3", _rebuild_tensor_v3),
        ("torch._utils", "_rebuild_parameter"): _Rebuilder("_rebuild_parameter", _rebuild_parameter),
        ("torch._utils", "_rebuild_parameter_with_state"): _Rebuilder(
            "_rebuild_parameter_with_state", _rebuild_parameter
        ),
        ("collections", "OrderedDict"): _StateDict,
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
            "a PyTorch state dict needs only tensors, storages and OrderedDict, so this file may run code when loaded "
            "by torch.load"
        )

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(
                f"{self._path}: unsupported persistent id {_short(pid)} in the checkpoint's pickle"
            )
        _, storage_type, key, _location, numel = pid
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError(f"{self._path}: malformed storage reference {_short(pid)}")
        storage = self.storages.get(key)
        if storage is None:
            storage = self.storages[key] = _Storage(key, storage_type.dtype, numel)
        return storage


class TorchCheckpoint:
    """An opened ``torch.save`` zip: validated tensor table plus lazily mapped storages.

    What a hostile or damaged file cannot do (each raises instead):

    - read bytes outside a storage's own zip entry: each tensor's last element
      (offset + sum((size - 1) * stride)) must lie inside its storage, and each
      storage (numel x element size) inside its entry, before anything is read;
    - make the loader allocate more than the file declares: ``data.pkl`` is
      capped at ``_MAX_PICKLE_BYTES``, compressed entries are streamed up to
      their declared size, a view that repeats elements must be an ``expand``
      (stride 0) within `_MAX_EXPANSION` x its storage or `_MAX_EXPANDED_BYTES`,
      and is returned as a read-only view;
    - hand over shifted or altered bytes: the local header of each entry must
      agree with the central directory (name, method), and each storage is
      CRC-32-checked against the zip's record when first read.

    Raises:
        CorruptCheckpointError: (a ``ValueError``) not a zip checkpoint,
            truncated, oversized, or a tensor reaches outside its storage (the
            message names the file and the entry or tensor).
        ForbiddenGlobalError, ForbiddenBuildError: the pickle tries to call a
            forbidden global or to set state on a validated object.

    Example:
        >>> ckpt = TorchCheckpoint("tests/data/models/tiny_llama/pytorch_model.bin")  # doctest: +SKIP
        >>> ckpt.read("model.norm.weight").shape  # doctest: +SKIP
        (64,)
    """

    def __init__(self, path: os.PathLike[str] | str):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise CorruptCheckpointError(f"{self.path}: PyTorch checkpoint not found")
        self._size = os.path.getsize(self.path)
        self._starts: dict[str, int] = {}
        try:
            with zipfile.ZipFile(self.path) as zf:
                self._entries = {i.filename: i for i in zf.infolist()}
                pkl_names = [n for n in self._entries if n == "data.pkl" or n.endswith("/data.pkl")]
                if len(pkl_names) != 1:
                    raise CorruptCheckpointError(
                        f"{self.path}: not a torch.save checkpoint: expected one data.pkl in the zip, found "
                        f"{len(pkl_names)}"
                    )
                self._root = pkl_names[0][: -len("data.pkl")]
                pickled = self._read_small(zf, pkl_names[0], _MAX_PICKLE_BYTES)
                has_order = self._root + "byteorder" in self._entries
                byteorder = (
                    self._read_small(zf, self._root + "byteorder", 16).decode(errors="replace").strip()
                    if has_order
                    else "little"
                )
        except zipfile.BadZipFile as e:
            hint = (
                " (legacy non-zip torch.save files are not supported)" if _looks_like_legacy_pickle(self.path) else ""
            )
            raise CorruptCheckpointError(
                f"{self.path}: not a zip-based PyTorch checkpoint or truncated: {e}{hint}"
            ) from None
        except UnicodeDecodeError as e:  # zipfile decodes names flagged UTF-8 itself; a damaged name is not
            raise CorruptCheckpointError(
                f"{self.path}: a zip entry name flagged as UTF-8 is not valid UTF-8 (damaged zip directory): {e}"
            ) from None
        except (OSError, EOFError, zipfile.LargeZipFile, NotImplementedError) as e:
            raise CorruptCheckpointError(f"{self.path}: cannot read PyTorch checkpoint: {e}") from None
        if byteorder not in ("little", "big"):
            raise CorruptCheckpointError(
                f"{self.path}: unknown byteorder record {byteorder!r}; expected 'little' or 'big'"
            )
        self._big_endian = byteorder == "big"
        unpickler = RestrictedUnpickler(io.BytesIO(pickled), self.path)
        try:
            obj = unpickler.load()
        except ForbiddenGlobalError:
            raise
        except ForbiddenBuildError as e:
            raise ForbiddenBuildError(f"{self.path}: {e}") from None
        except Exception as e:  # noqa: BLE001 - malformed pickles raise anything (RecursionError, MemoryError, ...)
            raise CorruptCheckpointError(
                f"{self.path}: corrupt pickle in the checkpoint: {type(e).__name__}: {_short(str(e))}"
            ) from None
        self.tensors: dict[str, TorchTensorInfo] = {}
        self._flatten(obj, "", set(), 0)
        for key, storage in unpickler.storages.items():
            self._check_storage(key, storage)
        for name, info in self.tensors.items():
            if unpickler.storages.get(info.storage.key) is None:  # only persistent_load makes storages; be sure
                raise CorruptCheckpointError(
                    f"{self.path}: tensor {name!r} refers to storage {info.storage.key!r} that the pickle never "
                    "declared"
                )
            self._check_storage(info.storage.key, info.storage)
            self._check_extent(name, info)
        self._map: np.ndarray | None = None
        self._storage_arrays: dict[tuple[str, DType], np.ndarray] = {}
        self._crc_checked: set[str] = set()

    def _read_small(self, zf: zipfile.ZipFile, name: str, limit: int) -> bytes:
        """A metadata entry (``data.pkl``, ``byteorder``) read whole, refused above ``limit`` bytes before inflating."""
        entry = self._entries[name]
        if entry.file_size > limit:
            raise CorruptCheckpointError(
                f"{self.path}: zip entry {name} declares {entry.file_size} bytes; at most {limit} are accepted for it"
            )
        return bytes(self._stream(zf, entry, entry.file_size))

    def _stream(self, zf: zipfile.ZipFile, entry: zipfile.ZipInfo, keep: int) -> bytearray:
        """The first ``keep`` bytes of ``entry``, inflated in chunks; the whole entry is CRC-checked.

        Never holds more than ``keep`` bytes plus one chunk, even when the
        entry inflates past its declared size (zipfile stops there and we
        check the count), so a deflate bomb costs time, not memory.
        """
        out = bytearray(keep)
        filled, total, crc = 0, 0, 0
        try:
            with zf.open(entry) as f:  # checks the local header's name against the central directory
                while chunk := f.read(_CHUNK):
                    total += len(chunk)
                    if total > entry.file_size:
                        break
                    crc = zlib.crc32(chunk, crc)
                    if filled < keep:
                        take = chunk[: keep - filled]
                        out[filled : filled + len(take)] = take
                        filled += len(take)
        # RuntimeError: encrypted entry; UnicodeDecodeError: a local header name flagged UTF-8 that is not.
        except (
            zipfile.BadZipFile,
            zlib.error,
            EOFError,
            OSError,
            NotImplementedError,
            RuntimeError,
            UnicodeDecodeError,
        ) as e:
            raise CorruptCheckpointError(f"{self.path}: zip entry {entry.filename} is corrupt: {e}") from None
        if total != entry.file_size or crc != entry.CRC:
            raise CorruptCheckpointError(
                f"{self.path}: zip entry {entry.filename} inflates to {total} bytes with CRC-32 {crc:08x}; the zip "
                f"directory records {entry.file_size} bytes with CRC-32 {entry.CRC:08x}"
            )
        return out

    def _flatten(self, obj: Any, prefix: str, seen: set[int], depth: int) -> None:
        if not isinstance(obj, dict):
            raise CorruptCheckpointError(f"{self.path}: the checkpoint holds a {type(obj).__name__}, not a state dict")
        if id(obj) in seen:
            raise CorruptCheckpointError(f"{self.path}: the state dict refers to itself at {prefix[:-1]!r}")
        if depth > _MAX_NESTING:
            raise CorruptCheckpointError(
                f"{self.path}: the state dict nests deeper than {_MAX_NESTING} levels at {_short(prefix[:-1])}"
            )
        seen.add(id(obj))
        for key, value in dict.items(obj):  # dict.items: a pickle may shadow 'items' on an OrderedDict instance
            name = f"{prefix}{key}"
            if isinstance(value, tuple) and len(value) == 5 and value[0] == "tensor":
                self.tensors[name] = self._tensor_info(name, value)
            elif isinstance(value, dict):
                self._flatten(value, name + ".", seen, depth + 1)
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
        ok = ok and isinstance(storage.key, str) and isinstance(storage.dtype, DType) and isinstance(storage.numel, int)
        if not ok or offset < 0:
            raise CorruptCheckpointError(
                f"{self.path}: malformed tensor record for {name!r}: expected (storage, offset >= 0, size, stride) "
                "with non-negative ints"
            )
        return TorchTensorInfo(storage, offset, tuple(size), tuple(stride), self.path)

    def _entry(self, key: str) -> zipfile.ZipInfo:
        return self._entries[self._root + "data/" + key]

    def _check_storage(self, key: str, storage: _Storage) -> None:
        """The storage's zip entry exists, holds numel x element-size bytes, and its stored bytes lie inside the
        file.
        """
        if not (
            storage.key == key
            and isinstance(storage.dtype, DType)
            and isinstance(storage.numel, int)
            and storage.numel >= 0
        ):
            raise CorruptCheckpointError(f"{self.path}: malformed storage record {key!r} in the checkpoint's pickle")
        entry = self._entries.get(self._root + "data/" + key)
        if entry is None:
            raise CorruptCheckpointError(
                f"{self.path}: storage data/{key} is missing from the zip (truncated checkpoint?)"
            )
        if entry.file_size < storage.nbytes:
            raise CorruptCheckpointError(
                f"{self.path}: storage data/{key} has {entry.file_size} bytes but {storage.numel} {storage.dtype} "
                f"elements need {storage.nbytes}"
            )
        if entry.compress_type == zipfile.ZIP_STORED:
            if entry.compress_size != entry.file_size:
                raise CorruptCheckpointError(
                    f"{self.path}: stored zip entry {entry.filename} records {entry.compress_size} bytes on disk but "
                    f"{entry.file_size} uncompressed"
                )
            start = self._data_start(entry)
            if start + entry.file_size > self._size:
                raise CorruptCheckpointError(
                    f"{self.path}: storage data/{key} runs past the end of the file (truncated checkpoint)"
                )

    def _check_extent(self, name: str, info: TorchTensorInfo) -> None:
        """The view lies in its storage and repeats elements only as ``expand`` does, within `_MAX_EXPANDED_BYTES`.

        Checked here, before anything is read: every consumer (eager tensors, the
        session's weights, dtype conversion) copies a view, so a 4-byte storage
        viewed as ``[2**18, 1024]`` with stride 0 would otherwise allocate 1 GiB.
        """
        count = math.prod(info.shape)
        if count == 0:
            return
        where = (
            f"{self.path}: tensor {name!r} (shape {list(info.shape)}, stride {list(info.stride)}, offset {info.offset})"
        )
        last = info.offset + sum((d - 1) * s for d, s in zip(info.shape, info.stride))
        if last >= info.storage.numel:
            raise CorruptCheckpointError(f"{where} reaches element {last} of a storage with {info.storage.numel}")
        if count <= info.storage.numel:
            return
        # More elements than the storage: only expand()'s layout (stride 0 on the broadcast dims, the rest
        # not overlapping) is what torch writes; overlapping non-zero strides come from as_strided alone.
        dims = sorted((s, d) for d, s in zip(info.shape, info.stride) if d > 1 and s > 0)
        if any(s_next < s * d for (s, d), (s_next, _) in zip(dims, dims[1:])):
            raise CorruptCheckpointError(
                f"{where} has overlapping strides: its {count} elements repeat storage elements, which only expand() "
                "(stride 0) may do"
            )
        nbytes, limit = count * info.dtype.size_in_bytes, max(_MAX_EXPANSION * info.storage.nbytes, _MAX_EXPANDED_BYTES)
        if nbytes > limit:
            raise CorruptCheckpointError(
                f"{where} is a stride-0 (expanded) view of {nbytes} bytes over a storage of {info.storage.nbytes}; "
                f"maxfx materializes views up to {limit} bytes "
                f"({_MAX_EXPANSION}x the storage or {_MAX_EXPANDED_BYTES >> 20} MiB); save the tensor with "
                ".contiguous()"
            )

    def _data_start(self, entry: zipfile.ZipInfo) -> int:
        """Where ``entry``'s bytes start, from its local header, which must agree with the central directory."""
        start = self._starts.get(entry.filename)
        if start is None:
            start = self._starts[entry.filename] = self._read_local_header(entry)
        return start

    def _read_local_header(self, entry: zipfile.ZipInfo) -> int:
        with open(self.path, "rb") as f:
            f.seek(entry.header_offset)
            header = f.read(30)
            name_len = int.from_bytes(header[26:28], "little") if len(header) == 30 else 0
            name = f.read(name_len)
        if len(header) < 30 or header[:4] != b"PK\x03\x04":
            raise CorruptCheckpointError(f"{self.path}: corrupt zip local header for {entry.filename}")
        encoding = "utf-8" if entry.flag_bits & 0x800 else "cp437"
        method = int.from_bytes(header[8:10], "little")
        if name != entry.orig_filename.encode(encoding) or method != entry.compress_type:
            raise CorruptCheckpointError(
                f"{self.path}: zip local header at byte {entry.header_offset} names {name!r} (method {method}) but the "
                f"central directory says {entry.orig_filename!r} (method {entry.compress_type})"
            )
        extra_len = int.from_bytes(header[28:30], "little")
        return entry.header_offset + 30 + name_len + extra_len

    def _storage_array(self, storage: _Storage) -> np.ndarray:
        arr = self._storage_arrays.get((storage.key, storage.dtype))
        if arr is not None:
            return arr
        self._check_storage(storage.key, storage)  # re-checked at the read itself: the read can never leave the entry
        entry = self._entry(storage.key)
        if entry.compress_type == zipfile.ZIP_STORED:
            if self._map is None:
                # Copy-on-write keeps arrays writable for DLPack without ever modifying the file.
                self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
            start = self._data_start(entry)
            if storage.key not in self._crc_checked:
                crc = zlib.crc32(self._map[start : start + entry.file_size])
                if crc != entry.CRC:
                    raise CorruptCheckpointError(
                        f"{self.path}: storage {entry.filename} has CRC-32 {crc:08x} but the zip directory records "
                        f"{entry.CRC:08x} (damaged file, or a local header that shifts the data)"
                    )
                self._crc_checked.add(storage.key)
            raw = self._map[start : start + storage.nbytes]
        else:
            with zipfile.ZipFile(self.path) as zf:
                raw = np.frombuffer(self._stream(zf, entry, storage.nbytes), np.uint8)
        dtype = storage.dtype.to_numpy()
        if self._big_endian and dtype.itemsize > 1:
            arr = raw.view(dtype.newbyteorder(">")).astype(dtype)
        else:
            arr = raw.view(dtype)
        self._storage_arrays[(storage.key, storage.dtype)] = arr
        return arr

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a numpy array (a view of the file when contiguous).

        A strided view is copied into a contiguous array only when it has no
        more elements than its storage; a view that repeats elements (stride 0,
        as ``expand`` makes) comes back as a read-only view, so a small file
        cannot make this allocate more than it holds.
        """
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
        view = np.lib.stride_tricks.as_strided(
            storage[info.offset :], shape=info.shape, strides=tuple(s * item for s in info.stride), writeable=False
        )
        return view if count > info.storage.numel else np.ascontiguousarray(view)


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
                raise CorruptCheckpointError(
                    f"{path}: tensor {name!r} is also in {merged[name].file}; shards of one checkpoint must not overlap"
                )
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
        CorruptCheckpointError: (a ``ValueError``) not a zip checkpoint,
            truncated, inconsistent or oversized (names the file and entry or tensor).
        ForbiddenGlobalError, ForbiddenBuildError: (``pickle.UnpicklingError``)
            the pickle references a forbidden global or sets state on a
            validated object (names the file and the global or object).
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
        label = (
            self._filepath if len(files) == 1 else f"{len(files)} PyTorch checkpoint files ({sorted(files)[0]}, ...)"
        )
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
        """Always None for an existing weight: PyTorch checkpoints hold plain tensors (KeyError if none has this
        name).
        """
        return _info(self).quantization_encoding
