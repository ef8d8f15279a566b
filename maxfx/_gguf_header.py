"""The bounded GGUF header check that runs before ``gguf.GGUFReader`` sees a file.

`open_reader` walks the header with bounded reads and applies llama.cpp's
``gguf_init_from_file`` checks: every count and length fits in the bytes left,
keys and tensor names are unique, type ids are known, and the tensors lie one
after another in header order, each padded to ``general.alignment`` (default 32),
inside the file. So a tensor that aliases another, is misaligned, wraps past
2**64, or had its type changed is refused with the file and tensor named, and a
header claiming 2**60 array elements fails at once instead of looping inside the
reader. Free of JAX imports: the pipelines read GGUF metadata through it too.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["open_reader", "scan_header"]


# GGUF metadata value types (the GGUF spec): fixed-size scalars by id, then string and array.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_UINT32, _STRING, _ARRAY = 4, 8, 9
# The smallest key/value pair (empty key, type, 1-byte value) and tensor info (empty name, 0 dims, type, offset).
_MIN_KV_BYTES, _MIN_TENSOR_INFO_BYTES = 8 + 4 + 1, 8 + 4 + 4 + 8
# llama.cpp's limits (ggml.h): dims per tensor, name length including the NUL.
_GGML_MAX_DIMS, _GGML_MAX_NAME = 4, 64
_INT64_MAX = 2**63 - 1
_DEFAULT_ALIGNMENT = 32


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass(frozen=True)
class _TensorSpan:
    """Where a tensor's bytes are, from its header entry: ``offset`` is relative to the data section."""

    name: str
    type_name: str
    ne: tuple[int, ...]
    offset: int
    nbytes: int

    def describe(self) -> str:
        return f"{self.name!r} ({self.type_name} {list(self.ne)}, {self.nbytes} bytes)"


class _HeaderScan:
    """A bounded walk over a GGUF header, refusing what llama.cpp refuses.

    ``gguf.GGUFReader`` trusts the header's counts (an array claiming 2**60
    elements loops for ever) and adds tensor offsets in uint64 (so they wrap).
    This walk compares every count and length with the bytes left before using
    it, skips fixed-size arrays in one step, and checks the tensor layout with
    Python integers; it reads only the header and never the tensor data.

    Example:
        >>> with open("model.gguf", "rb") as f, mmap.mmap(f.fileno(), 0,
        ...     access=mmap.ACCESS_READ) as buf:  # doctest: +SKIP
        ...     _HeaderScan("model.gguf", buf, {0: ("F32", 1, 4)}).run()
    """

    def __init__(self, path: str, buf: Any, ggml_types: dict[int, tuple[str, int, int]]):
        self.path = path
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.ggml_types = ggml_types
        self._u32 = struct.Struct("<I")
        self._u64 = struct.Struct("<Q")

    def error(self, what: str, *, tensor: str | None = None, key: str | None = None) -> ValueError:
        where = f" (tensor {tensor!r})" if tensor is not None else f" (key {key!r})" if key is not None else ""
        return ValueError(f"{self.path}: corrupt GGUF file{where}: {what}")

    def take(self, n: int, what: str, **where: str) -> int:
        """Advance past ``n`` bytes and return where they start; refuse reading past the end."""
        left = self.size - self.pos
        if n > left:
            raise self.error(
                f"{what} needs {n} bytes at offset {self.pos} but the file has {left} left (truncated or corrupt)",
                **where,
            )
        start, self.pos = self.pos, self.pos + n
        return start

    def u32(self, what: str, **where: str) -> int:
        return self._u32.unpack_from(self.buf, self.take(4, what, **where))[0]

    def u64(self, what: str, **where: str) -> int:
        return self._u64.unpack_from(self.buf, self.take(8, what, **where))[0]

    def text(self, what: str, **where: str) -> str:
        n = self.u64(f"length of {what}", **where)
        start = self.take(n, what, **where)
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(f"{what} at offset {start} is not UTF-8", **where) from None

    def run(self) -> tuple[int, list[_TensorSpan]]:
        """Check the whole header and layout; return the data section's start and the tensors."""
        self._preamble()
        n_tensors, n_kv = self.u64("tensor count"), self.u64("key/value count")
        least = n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES
        if least > self.size - self.pos:
            raise self.error(
                f"header claims {n_tensors} tensors and {n_kv} key/value pairs, at least {least} bytes, but the file "
                f"has {self.size - self.pos} left"
            )
        alignment = self._key_values(n_kv)
        names: set[str] = set()
        tensors = [self._tensor_info(i, names) for i in range(n_tensors)]
        data_start = _pad(self.pos, alignment)
        self._check_layout(tensors, alignment, data_start)
        return data_start, tensors

    def _preamble(self) -> None:
        start = self.take(4, "the magic number")
        if self.buf[start : start + 4] != b"GGUF":
            raise self.error(f"magic number {bytes(self.buf[start : start + 4])!r} is not b'GGUF'")
        version = self.u32("the version")
        if version & 0xFFFF == 0:  # written on a big-endian machine (gguf.GGUFReader reads these too)
            self._u32, self._u64 = struct.Struct(">I"), struct.Struct(">Q")
            version = int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in (2, 3):
            raise self.error(f"version {version} is not supported (expected 2 or 3)")

    def _key_values(self, count: int) -> int:
        """Walk the metadata; return ``general.alignment`` (checked like llama.cpp) or the default."""
        keys: set[str] = set()
        alignment = _DEFAULT_ALIGNMENT
        for i in range(count):
            key = self.text(f"key {i}")
            if key in keys:
                raise self.error("key appears twice; keys must be unique", key=key)
            keys.add(key)
            vtype = self.u32("value type", key=key)
            if key == "general.alignment":
                if vtype != _UINT32:
                    raise self.error(f"value type {vtype} is not uint32 ({_UINT32})", key=key)
                alignment = self.u32("value", key=key)
                if alignment == 0 or alignment & (alignment - 1):
                    raise self.error(f"alignment {alignment} is not a power of two", key=key)
            else:
                self._skip_value(key, vtype)
        return alignment

    def _skip_value(self, key: str, vtype: int) -> None:
        if vtype in _SCALAR_BYTES:
            self.take(_SCALAR_BYTES[vtype], "value", key=key)
        elif vtype == _STRING:
            self.take(self.u64("string length", key=key), "string value", key=key)
        elif vtype == _ARRAY:
            itype, count = self.u32("array element type", key=key), self.u64("array length", key=key)
            if itype in _SCALAR_BYTES:
                self.take(count * _SCALAR_BYTES[itype], f"array of {count} elements", key=key)
            elif itype == _STRING:
                self._skip_strings(key, count)
            else:
                raise self.error(
                    f"array element type {itype} is not a scalar or string type (llama.cpp refuses nested arrays)",
                    key=key,
                )
        else:
            raise self.error(f"value type {vtype} is not a GGUF type (0-12)", key=key)

    def _skip_strings(self, key: str, count: int) -> None:
        # A tokenizer holds ~10**5 strings: a tight loop, not one take() per string.
        if 8 * count > self.size - self.pos:
            raise self.error(
                f"array of {count} strings needs at least {8 * count} bytes but the file has {self.size - self.pos} "
                "left",
                key=key,
            )
        unpack, buf, pos, size = self._u64.unpack_from, self.buf, self.pos, self.size
        for i in range(count):
            if pos + 8 > size:
                raise self.error(
                    f"string {i} of {count} starts past the end of the file (truncated or corrupt)", key=key
                )
            pos += 8 + unpack(buf, pos)[0]
            if pos > size:
                raise self.error(
                    f"string {i} of {count} ends at byte {pos}, past the end of the file ({size} bytes)", key=key
                )
        self.pos = pos

    def _tensor_info(self, index: int, names: set[str]) -> _TensorSpan:
        name = self.text(f"name of tensor {index}")
        if len(name.encode()) >= _GGML_MAX_NAME:
            raise self.error(
                f"name is {len(name.encode())} bytes; llama.cpp allows at most {_GGML_MAX_NAME - 1}", tensor=name
            )
        if name in names:
            raise self.error("two tensors have this name", tensor=name)
        names.add(name)
        n_dims = self.u32("dimension count", tensor=name)
        if n_dims > _GGML_MAX_DIMS:
            raise self.error(f"{n_dims} dimensions; GGUF tensors have at most {_GGML_MAX_DIMS}", tensor=name)
        ne = tuple(self.u64("dimension", tensor=name) for _ in range(n_dims))
        numel = math.prod(ne)
        if any(d > _INT64_MAX for d in ne) or numel > _INT64_MAX:
            raise self.error(f"shape {list(ne)} has more than 2**63 - 1 elements", tensor=name)
        type_id = self.u32("type", tensor=name)
        if type_id not in self.ggml_types:
            known = ", ".join(f"{i} ({n})" for i, (n, _, _) in sorted(self.ggml_types.items()))
            raise self.error(f"GGML type id {type_id} is unknown (known: {known})", tensor=name)
        type_name, block, type_size = self.ggml_types[type_id]
        if (ne[0] if ne else 1) % block:
            raise self.error(
                f"{type_name} rows hold blocks of {block} values but the row length is {ne[0] if ne else 1}",
                tensor=name,
            )
        offset = self.u64("data offset", tensor=name)
        return _TensorSpan(name, type_name, ne, offset, numel // block * type_size)

    def _check_layout(self, tensors: list[_TensorSpan], alignment: int, data_start: int) -> None:
        """llama.cpp's rule: tensor i starts where tensor i-1 ends, padded to the alignment, and all lie in the file.

        This one comparison refuses aliased, overlapping, misaligned and
        wrapped-around offsets, and a changed type (its size no longer leads to
        the next tensor's offset).
        """
        expected, previous = 0, None
        for t in tensors:
            if t.offset != expected:
                if t.offset % alignment:
                    why = f"not a multiple of the alignment {alignment}"
                elif data_start + t.offset >= self.size:
                    why = (
                        f"it points past the end of the file ({self.size} bytes; "
                        f"the data section starts at byte {data_start})"
                    )
                elif previous is None:
                    why = "the first tensor must start the data section"
                else:
                    how = "overlaps" if t.offset < expected else "leaves a gap after"
                    why = (
                        f"it {how} {previous.describe()}; "
                        f"tensors follow each other in header order, each padded to {alignment} bytes"
                    )
                raise self.error(f"data offset {t.offset}, expected {expected}: {why}", tensor=t.name)
            end = data_start + t.offset + t.nbytes
            if end > self.size:
                raise self.error(
                    f"{t.type_name} {list(t.ne)} data ends at byte {end} "
                    f"but the file has {self.size} (truncated file?)",
                    tensor=t.name,
                )
            expected, previous = expected + _pad(t.nbytes, alignment), t
        if tensors and self.size > data_start + expected:
            raise self.error(
                f"{self.size - data_start - expected} bytes follow the last tensor {previous.describe()} and its "
                "padding; a tensor's type or shape was changed?"
            )


def scan_header(gguf: Any, path: str) -> None:
    """Run `_HeaderScan` over ``path`` (memory-mapped; only the header pages are touched)."""
    ggml_types = {
        int(t): (t.name, *gguf.GGML_QUANT_SIZES[t]) for t in gguf.GGMLQuantizationType if t in gguf.GGML_QUANT_SIZES
    }
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ValueError(f"{path}: corrupt GGUF file: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            _HeaderScan(path, buf, ggml_types).run()


def open_reader(gguf: Any, path: str) -> Any:
    """A ``gguf.GGUFReader`` over ``path`` after `scan_header`; ValueError naming the file otherwise."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: GGUF file not found")
    try:
        scan_header(gguf, path)
    except OSError as e:
        raise ValueError(f"{path}: cannot read GGUF file: {e}") from e
    try:
        # Copy-on-write: views stay writable (DLPack consumers refuse read-only arrays); the file is never modified.
        return gguf.GGUFReader(path, "c")
    except Exception as e:  # noqa: BLE001 - the reader raises many types on bad bytes
        raise ValueError(f"{path}: not a valid GGUF file or truncated: {type(e).__name__}: {e}") from None
