"""`SafetensorWeights`: memory-mapped safetensors checkpoints, one file or many shards.

The header is parsed here (8-byte little-endian length, then JSON) and checked
as strictly as the ``safetensors`` package does before anything is returned: no
duplicate keys, known dtypes, non-negative integer shapes, and byte ranges that
tile the data section exactly (sorted by offset, each starting where the previous
one ended, the last ending at the end of the file). A truncated, shifted or
overlapping file therefore fails at construction with the file and tensor named,
instead of loading bytes that belong to another tensor. Tensor data are views of one copy-on-write memory map per file:
nothing
is read until used, and bfloat16/float8 tensors come back as ``ml_dtypes`` arrays.

Example:
    >>> weights = SafetensorWeights(["model.safetensors"])  # doctest: +SKIP
    >>> weights.model.embed_tokens.weight.data().shape  # doctest: +SKIP
    [Dim(256), Dim(64)]
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence, Set
from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph._weight import Weight
from maxfx.graph.weights._protocol import CheckpointWeights, TensorInfo, TensorSource, _info

__all__ = ["SafetensorWeights"]

# safetensors refuses headers above 100 MB; so do we (a corrupt length would otherwise allocate it).
_MAX_HEADER_BYTES = 100_000_000

_DTYPES: dict[str, DType] = {
    "BOOL": DType.bool,
    "U8": DType.uint8,
    "I8": DType.int8,
    "U16": DType.uint16,
    "I16": DType.int16,
    "U32": DType.uint32,
    "I32": DType.int32,
    "U64": DType.uint64,
    "I64": DType.int64,
    "F16": DType.float16,
    "BF16": DType.bfloat16,
    "F32": DType.float32,
    "F64": DType.float64,
    "F8_E4M3": DType.float8_e4m3fn,
    "F8_E5M2": DType.float8_e5m2,
    "F8_E8M0": DType.float8_e8m0fnu,
    "F8_E4M3FNUZ": DType.float8_e4m3fnuz,
    "F8_E5M2FNUZ": DType.float8_e5m2fnuz,
}


def _is_count(value: Any) -> bool:
    """A JSON non-negative integer: ``type(...) is int`` also refuses ``true``, which is a Python int."""
    return type(value) is int and value >= 0


class _DuplicateKeyError(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` object hook that refuses a key given twice (plain ``json`` keeps the last)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return obj


class SafetensorsFile:
    """One parsed safetensors file: header entries and a lazily created memory map.

    Raises:
        ValueError: the file is not a well-formed safetensors file (message names
            the file and, where known, the tensor).
    """

    def __init__(self, path: os.PathLike[str] | str):
        self.path = os.fspath(path)
        self.entries: dict[str, tuple[DType, tuple[int, ...], int, int]] = {}
        self.metadata: dict[str, str] = {}
        self._map: np.ndarray | None = None
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise self._error(f"file is {size} bytes, too short for the 8-byte header length")
                header_len = int.from_bytes(head, "little")
                if header_len > _MAX_HEADER_BYTES:
                    raise self._error(
                        f"header length {header_len} is above the {_MAX_HEADER_BYTES}-byte limit of the safetensors "
                        "format"
                    )
                if 8 + header_len > size:
                    raise self._error(
                        f"header length {header_len} does not fit in the file ({size} bytes): truncated or not a "
                        "safetensors file"
                    )
                raw = f.read(header_len)
        except OSError as e:
            raise ValueError(f"{self.path}: cannot read safetensors file: {e}") from e
        header = self._parse_header(raw)
        self.data_start = 8 + header_len
        data_len = size - self.data_start
        for name, entry in header.items():
            if name == "__metadata__":
                self.metadata = self._parse_metadata(entry)
                continue
            self.entries[name] = self._parse_entry(name, entry, data_len)
        self._check_tiling(data_len)

    def _error(self, what: str, tensor: str | None = None) -> ValueError:
        where = f" (tensor {tensor!r})" if tensor is not None else ""
        return ValueError(f"{self.path}: corrupt safetensors file{where}: {what}")

    def _parse_header(self, raw: bytes) -> dict[str, Any]:
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._error(f"header is not valid JSON ({e})") from None
        except _DuplicateKeyError as e:
            raise self._error(f"header has the key {e.key!r} twice; keys must be unique") from None
        except RecursionError:
            raise self._error("header JSON is nested too deeply (expected an object of tensor entries)") from None
        if not isinstance(header, dict):
            raise self._error("header is not a JSON object")
        return header

    def _parse_metadata(self, entry: Any) -> dict[str, str]:
        if entry is None:
            return {}
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
            raise self._error(f"__metadata__ must be an object of string values, got {entry!r:.200}")
        return dict(entry)

    def _parse_entry(self, name: str, entry: Any, data_len: int) -> tuple[DType, tuple[int, ...], int, int]:
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise self._error("entry needs 'dtype', 'shape' and 'data_offsets'", name)
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if code not in _DTYPES:
            raise ValueError(
                f"{self.path}: tensor {name!r} has dtype {code!r}, which maxfx cannot load (supported: "
                f"{', '.join(_DTYPES)})"
            )
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise self._error(f"shape {shape!r} is not a list of non-negative integers", name)
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise self._error(f"data_offsets {offsets!r} is not [begin, end]", name)
        begin, end = offsets
        dtype = _DTYPES[code]
        nbytes = math.prod(shape) * dtype.size_in_bytes
        if not 0 <= begin <= end or end - begin != nbytes:
            raise self._error(f"data_offsets {offsets} hold {end - begin} bytes but {code}{shape} needs {nbytes}", name)
        if end > data_len:
            raise self._error(
                f"data ends at byte {end} of the data section but only {data_len} bytes are present (truncated file?)",
                name,
            )
        return dtype, tuple(shape), begin, end

    def _check_tiling(self, data_len: int) -> None:
        """The byte ranges, sorted, must cover ``[0, data_len)`` with no gap and no overlap.

        This is the safetensors package's rule: it refuses aliased tensors (two
        names reading one range), unused bytes, and a header length that does not
        match the data (which would shift every tensor), so maxfx does too.
        """
        covered, previous = 0, None
        for begin, end, name in sorted((begin, end, name) for name, (_, _, begin, end) in self.entries.items()):
            if begin < covered:
                raise self._error(
                    f"data_offsets [{begin}, {end}] overlap tensor {previous!r}, which ends at byte {covered}; each "
                    "tensor needs its own bytes",
                    name,
                )
            if begin > covered:
                raise self._error(
                    f"data_offsets [{begin}, {end}] leave bytes {covered}..{begin} of the data section unused; tensors "
                    "must be contiguous",
                    name,
                )
            covered, previous = end, name
        if covered != data_len:
            raise self._error(
                f"the tensors cover {covered} bytes but the data section (file size - 8 - header length) has "
                f"{data_len}; the header length or the file size is wrong"
            )

    def read(self, name: str) -> np.ndarray:
        """A view of tensor ``name`` in the memory map."""
        dtype, shape, begin, end = self.entries[name]
        if begin == end:
            return np.zeros(shape, dtype.to_numpy())
        if self._map is None:
            # Copy-on-write keeps views writable (DLPack consumers refuse read-only arrays) without touching the file.
            self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
        start = self.data_start
        return self._map[start + begin : start + end].view(dtype.to_numpy()).reshape(shape)


class _SafetensorsSource(TensorSource):
    kind = "Safetensor checkpoint"

    def __init__(
        self,
        paths: Sequence[str],
        files: Mapping[Any, SafetensorsFile],
        names: Set[str],
        name_to_file: Mapping[str, int],
        cache: dict[str, Any],
    ):
        label = paths[0] if len(paths) == 1 else f"{len(paths)} safetensors files ({paths[0]}, ...)"
        super().__init__(label, align=1)
        self._paths = paths
        self._files = files
        self._names = [n for n in self._ordered_names() if n in names]
        self._name_to_file = name_to_file
        self._cache = cache

    def _ordered_names(self) -> list[str]:
        return [n for p in self._paths for n in self._files[p].entries]

    def names(self) -> Sequence[str]:
        return self._names

    def _file(self, name: str) -> SafetensorsFile:
        return self._files[self._paths[self._name_to_file[name]]]

    def info(self, name: str) -> TensorInfo:
        dtype, shape, begin, end = self._file(name).entries[name]
        return TensorInfo(dtype, shape, dtype, shape, None, end - begin)

    def read(self, name: str) -> np.ndarray:
        value = self._cache.get(name)
        if value is None:
            value = self._cache[name] = self._file(name).read(name)
        return value


class SafetensorWeights(CheckpointWeights):
    """Weights from one or more safetensors files, memory-mapped and read lazily.

    Args:
        filepaths: the files (shards of one checkpoint: names must not repeat).
        tensors: restrict to these names (with ``tensors_to_file_idx``).
        tensors_to_file_idx: name -> index into ``filepaths``.
        prefix: the current name or prefix.
        allocated: dict shared by a tree of accessors for allocated values.
        _st_weight_map: cache of tensors already read, by name.
        _st_file_handles: already parsed files, by path (shared, so that a file
            is mapped once however many accessors exist).

    Raises:
        ValueError: a file is missing, truncated or corrupt, or two shards hold
            the same tensor name.
    """

    def __init__(
        self,
        filepaths: Sequence[os.PathLike[str] | str],
        *,
        tensors: Set[str] | None = None,
        tensors_to_file_idx: Mapping[str, int] | None = None,
        prefix: str = "",
        allocated: dict[str, Any] | None = None,
        _st_weight_map: dict[str, Any] | None = None,
        _st_file_handles: dict[Any, SafetensorsFile] | None = None,
    ) -> None:
        if isinstance(filepaths, (str, os.PathLike)):
            filepaths = [filepaths]
        paths = [os.fspath(p) for p in filepaths]
        if not paths:
            raise ValueError("SafetensorWeights: no files given")
        handles = {} if _st_file_handles is None else _st_file_handles
        for p in paths:
            if p not in handles:
                if not os.path.isfile(p):
                    raise ValueError(f"{p}: safetensors file not found")
                handles[p] = SafetensorsFile(p)
        if tensors_to_file_idx is None:
            tensors_to_file_idx = {}
            for idx, p in enumerate(paths):
                for name in handles[p].entries:
                    if name in tensors_to_file_idx:
                        raise ValueError(
                            f"{p}: tensor {name!r} is also in {paths[tensors_to_file_idx[name]]}; shards of one "
                            "checkpoint must not overlap"
                        )
                    tensors_to_file_idx[name] = idx
        if tensors is None:
            tensors = set(tensors_to_file_idx)
        unknown = [t for t in tensors if t not in tensors_to_file_idx]
        if unknown:
            raise ValueError(f"SafetensorWeights: tensors {sorted(unknown)[:5]} have no entry in tensors_to_file_idx")
        self._filepaths = paths
        self._tensors = tensors
        self._tensors_to_file_idx = tensors_to_file_idx
        self._st_file_handles = handles
        self._st_weight_map = {} if _st_weight_map is None else _st_weight_map
        self._source = _SafetensorsSource(paths, handles, tensors, tensors_to_file_idx, self._st_weight_map)
        self._prefix = prefix
        self._allocated = {} if allocated is None else allocated

    @property
    def metadata(self) -> dict[str, str]:
        """The ``__metadata__`` of the first file (e.g. ``{"format": "pt"}``)."""
        return dict(self._st_file_handles[self._filepaths[0]].metadata)

    def allocate_as_bytes(self, dtype: DType | None = None) -> Weight:
        """A uint8 `Weight` holding the raw bytes of the tensor.

        The last dimension is scaled by the element size (``[512, 256]`` float32
        becomes ``[512, 1024]`` uint8); a scalar becomes ``[itemsize]``.

        Args:
            dtype: if given, the stored dtype must equal it (checked).

        Raises:
            KeyError: no weight has the current name.
            ValueError: ``dtype`` differs from the stored dtype.
        """
        info = _info(self)
        if dtype is not None and dtype is not info.dtype:
            raise ValueError(
                f"Weight {self._prefix!r} in {self._source.label}: expected dtype {dtype}, the checkpoint has "
                f"{info.dtype}"
            )
        value = self._source.read(self._prefix)
        if value.ndim == 0:
            value = value.reshape(1)
        raw = np.ascontiguousarray(value).view(np.uint8)
        weight = Weight(self._prefix, DType.uint8, list(raw.shape), device=DeviceRef.CPU(), align=1)
        self._allocated[self._prefix] = raw
        return weight
