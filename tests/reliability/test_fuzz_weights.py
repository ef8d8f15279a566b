"""Fuzzing the checkpoint readers with mutated fixtures (issue 19, the fuzz requirement).

Each mutant is one of the tiny model fixtures (safetensors, ``torch.save``
``.bin``, GGUF Q8_0/Q4_0) with one damage, made from a fixed seed: a
truncation, a splice (bytes inserted or deleted), byte flips (mostly in the
header, where the structure lives, some in the tensor data) or a header edit
that knows the format (safetensors JSON fields, zip local/central headers and
pickle opcodes of ``data.pkl``, GGUF counts, lengths, types, dims and offsets).
Mutant ``i`` of a format is ``_mutant(fmt, i)``, so a failure names what to
replay.

The maxfx reader opens each mutant and reads every tensor (and the metadata).
The outcome must be one of:

- ``refused``: a ``ValueError`` or ``pickle.UnpicklingError`` whose message
  names the file. A raw ``UnicodeDecodeError``/``JSONDecodeError`` (also
  ValueErrors, but they name no file), ``KeyError``, ``IndexError``,
  ``struct.error``, ``zlib.error``, ``RecursionError``, ``MemoryError`` or any
  other type is a failure: the readers document these two types only.
- ``equal``: every tensor equal, byte for byte, to the unmutated file's.
- ``undetectable-data``: safetensors and GGUF have no checksums, so a flipped
  byte inside a tensor's data loads as a different value. Accepted only if the
  changed bytes are exactly the flipped ones at the tensor's own place in the
  file (the reader read the right region). ``.bin`` storages are CRC-checked,
  so there any changed value is a failure.
- ``undetectable-header``: a header edit that leaves a well-formed file saying
  something else (a tensor renamed, a same-size shape, a pickle whose CRC was
  recomputed pointing a tensor at another storage). Accepted only if the
  result equals an independent reader's of the same mutant: the
  ``safetensors`` package, a ``zipfile`` + numpy reading of the pickle, or the
  bytes at the tensor's original place (GGUF).

Mutants run in child processes (one per batch) with ``RLIMIT_AS`` at 2 GiB and
a per-mutant alarm, so a crash, a hang or a runaway allocation is reported
with the mutant's index instead of taking the test run down. The default suite
runs ``DEFAULT_COUNT`` mutants per format, ``-m slow`` runs ``SLOW_COUNT``.
The marker tests at the end plant payloads that would create a file (pickle
``GLOBAL``s of ``os.system``, ``builtins.exec``, ...; Python code in JSON and
GGUF strings) and check the file never appears.
"""

from __future__ import annotations

import collections
import io
import json
import math
import os
import pickle
import pickletools
import random
import resource
import signal
import struct
import subprocess
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors import SafetensorError, deserialize

import maxfx.graph.weights as mw
from maxfx.graph.weights._pytorch import ForbiddenGlobalError

MODELS = Path(__file__).resolve().parent.parent / "data" / "models"
FIXTURES = {
    "safetensors": [MODELS / "tiny_llama" / "model.safetensors", MODELS / "tiny_gpt2" / "model.safetensors"],
    "bin": [MODELS / "tiny_llama" / "pytorch_model.bin", MODELS / "tiny_gpt2" / "pytorch_model.bin"],
    "gguf": [MODELS / "tiny_llama" / "tiny_llama-q8_0.gguf", MODELS / "tiny_llama" / "tiny_llama-q4_0.gguf"],
}
FORMATS = list(FIXTURES)
DEFAULT_COUNT, SLOW_COUNT, BATCH = 150, 600, 300
MEMORY_LIMIT = 2 << 30
MUTANT_SECONDS = 10  # a mutant loads in ~1-20 ms; 10 s is a hang
ACCEPTED = {"refused", "equal", "undetectable-data", "undetectable-header"}


class WrongOutput(AssertionError):
    """A mutant loaded, but not as the unmutated file or an independent reader says."""


# ─── mutants ──────────────────────────────────────────────────────────────────


@dataclass
class Mutant:
    """A damaged file: its bytes, how it was made, and which offsets a flip changed (data-region check)."""

    data: bytes
    kind: str
    flips: set[int] = field(default_factory=set)


@dataclass
class Original:
    """A fixture as the mutators and the oracle see it: bytes, structure ranges, reference tensors."""

    path: Path
    data: bytes
    structure: list[tuple[int, int]]  # [begin, end) byte ranges of headers (the rest is tensor data)
    tensors: dict[str, tuple[str, tuple[int, ...], bytes]]  # name -> (dtype, shape, raw bytes)
    extra: dict


def _interesting(rng: random.Random, value: int, width: int) -> int:
    """A boundary or random replacement for an unsigned ``width``-byte field holding ``value``."""
    top = (1 << (8 * width)) - 1
    choices = [
        0,
        1,
        value + 1,
        max(value - 1, 0),
        value * 2,
        value // 2,
        top,
        1 << (8 * width - 1),
        rng.getrandbits(8 * width),
    ]
    return rng.choice(choices) & top


def _in_structure(rng: random.Random, orig: Original, bias: float = 0.7) -> int:
    """A byte offset: with probability ``bias`` inside a header range, else anywhere."""
    if rng.random() < bias:
        begin, end = rng.choices(orig.structure, weights=[e - b for b, e in orig.structure])[0]
        return rng.randrange(begin, end)
    return rng.randrange(len(orig.data))


def _truncate(rng, orig):
    cut = _in_structure(rng, orig, 0.5)
    return Mutant(orig.data[:cut], "truncate")


def _splice(rng, orig):
    at = _in_structure(rng, orig)
    n = rng.randint(1, 16)
    if rng.random() < 0.5:
        return Mutant(orig.data[:at] + rng.randbytes(n) + orig.data[at:], "splice-insert")
    return Mutant(orig.data[:at] + orig.data[at + n :], "splice-delete")


def _flip(rng, orig):
    data = bytearray(orig.data)
    flips = set()
    for _ in range(rng.choice([1, 1, 1, 2, 3, 8])):
        at = _in_structure(rng, orig)
        data[at] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
        if data[at] != orig.data[at]:
            flips.add(at)
        else:
            flips.discard(at)
    return Mutant(bytes(data), "flip", flips)


def _patch_int(data: bytes, at: int, width: int, value: int, order: str = "little") -> bytes:
    return data[:at] + value.to_bytes(width, order) + data[at + width :]


# safetensors: edits of the JSON header, rewritten with a consistent length unless the edit is the length.


def _st_header(orig):
    n = int.from_bytes(orig.data[:8], "little")
    return json.loads(orig.data[8 : 8 + n]), orig.data[8 + n :]


def _st_pack(header_text: str | bytes, body: bytes, length: int | None = None) -> bytes:
    raw = header_text.encode() if isinstance(header_text, str) else header_text
    return struct.pack("<Q", len(raw) if length is None else length) + raw + body


def _st_edit(rng, orig):
    header, body = _st_header(orig)
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    entry = header[name]
    edit = rng.choice(
        ["offsets", "shape", "dtype", "duplicate", "swap", "drop", "rename", "metadata", "length", "nest", "identity"]
    )
    if edit == "offsets":
        i = rng.randrange(2)
        v = entry["data_offsets"][i]
        entry["data_offsets"][i] = rng.choice(
            [v + 1, v - 1, v + 4, v - 4, 0, 2**64 - 1, 2**64, -1, float(v), str(v), None, True]
        )
    elif edit == "shape":
        shape = entry["shape"]
        how = rng.choice(["dim", "append1", "drop", "reverse", "value"])
        if how == "dim":
            k = rng.randrange(len(shape))
            shape[k] = rng.choice([shape[k] + 1, shape[k] - 1, 0, shape[k] * 2, -1, 2**40])
        elif how == "append1":
            shape.insert(rng.randrange(len(shape) + 1), 1)
        elif how == "drop" and len(shape) > 1:
            shape.pop(rng.randrange(len(shape)))
        elif how == "reverse":
            shape.reverse()
        else:
            shape[rng.randrange(len(shape))] = rng.choice([1.0, True, "64", None, [64]])
    elif edit == "dtype":
        entry["dtype"] = rng.choice(["F16", "BF16", "I32", "U32", "F64", "I64", "U8", "F33", "", 4, None])
    elif edit == "swap":
        other = header[rng.choice(names)]
        entry["data_offsets"], other["data_offsets"] = other["data_offsets"], entry["data_offsets"]
    elif edit == "drop":
        del header[name]
    elif edit == "rename":
        header = {(name + rng.choice([".x", "", "\u00e9", "\x00"]) if k == name else k): v for k, v in header.items()}
    elif edit == "metadata":
        header["__metadata__"] = rng.choice(
            [{"format": 1}, ["pt"], "pt", {"format": "pt", "x": None}, {"k": "v" * 1000}, None]
        )
    text = json.dumps(header)
    if edit == "duplicate":  # json.dumps cannot write a key twice: splice the entry's text in again
        piece = f"{json.dumps(name)}: {json.dumps(entry)}, "
        text = "{" + piece + text[1:]
    elif edit == "nest":
        depth = rng.choice([100, 10_000, 100_000])
        text = text[:-1] + ', "__deep__": ' + "[" * depth + "]" * depth + "}"
    if edit == "length":
        pad = rng.choice([1, 8, 100])
        raw = (text + " " * pad).encode()
        length = rng.choice([len(raw), len(raw) - pad - 1, len(raw) + 1, 2**63, 0])
        return Mutant(_st_pack(raw, body, length), f"header-{edit}")
    return Mutant(_st_pack(text, body), f"header-{edit}")


# .bin: zip header fields and data.pkl (rewritten with a correct CRC, so only the reader's own checks stand).

_LOCAL_FIELDS = {
    "version": (4, 2),
    "flags": (6, 2),
    "method": (8, 2),
    "time": (10, 2),
    "date": (12, 2),
    "crc": (14, 4),
    "csize": (18, 4),
    "usize": (22, 4),
    "nlen": (26, 2),
    "xlen": (28, 2),
}
_CENTRAL_FIELDS = {
    "made_by": (4, 2),
    "version": (6, 2),
    "flags": (8, 2),
    "method": (10, 2),
    "crc": (16, 4),
    "csize": (20, 4),
    "usize": (24, 4),
    "nlen": (28, 2),
    "xlen": (30, 2),
    "clen": (32, 2),
    "disk": (34, 2),
    "ext_attr": (38, 4),
    "offset": (42, 4),
}
_EOCD_FIELDS = {
    "disk": (4, 2),
    "cd_disk": (6, 2),
    "n_here": (8, 2),
    "n_total": (10, 2),
    "cd_size": (12, 4),
    "cd_offset": (16, 4),
    "clen": (20, 2),
}


def _zip_edit(rng, orig):
    where = rng.choice(["local", "central", "central", "eocd"])
    if where == "local":
        start = rng.choice(orig.extra["local_headers"])
        fname, (off, width) = rng.choice(list(_LOCAL_FIELDS.items()))
    elif where == "central":
        start = rng.choice(orig.extra["central_headers"])
        fname, (off, width) = rng.choice(list(_CENTRAL_FIELDS.items()))
    else:
        start = orig.extra["eocd"]
        fname, (off, width) = rng.choice(list(_EOCD_FIELDS.items()))
    at = start + off
    value = int.from_bytes(orig.data[at : at + width], "little")
    return Mutant(_patch_int(orig.data, at, width, _interesting(rng, value, width)), f"zip-{where}-{fname}")


def _rezip(orig, pkl: bytes) -> bytes:
    """The fixture's zip with ``data.pkl`` replaced (every entry rewritten, CRCs recomputed)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(orig.data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, pkl if info.filename.endswith("/data.pkl") else src.read(info))
    return out.getvalue()


_OPCODES = [op.code.encode("latin-1") for op in pickletools.opcodes]
_GLOBALS = [
    b"torch\nHalfStorage",
    b"torch\nIntStorage",
    b"torch\nByteStorage",
    b"torch\nDoubleStorage",
    b"torch._utils\n_rebuild_parameter",
    b"collections\nOrderedDict",
    b"torch\nfloat16",
    b"os\nsystem",
    b"builtins\nexec",
]


def _pickle_edit(rng, orig):
    pkl = orig.extra["pickle"]
    ops = list(pickletools.genops(pkl))
    ends = [pos for _, _, pos in ops[1:]] + [len(pkl)]
    i = rng.randrange(1, len(ops))
    op, arg, pos = ops[i]
    end = ends[i]
    edit = rng.choice(["opcode", "memo", "int", "string", "global", "delete", "duplicate", "identity"])
    if edit == "memo":
        memo = [
            (o, a, p, e)
            for (o, a, p), e in zip(ops, ends)
            if o.name in ("BINPUT", "BINGET", "LONG_BINPUT", "LONG_BINGET")
        ]
        op, arg, pos, end = rng.choice(memo)
        width = end - pos - 1
        new = pkl[:pos] + op.code.encode() + _interesting(rng, arg, width).to_bytes(width, "little") + pkl[end:]
    elif edit == "int":
        ints = [(o, a, p, e) for (o, a, p), e in zip(ops, ends) if o.name in ("BININT", "BININT1", "BININT2")]
        op, arg, pos, end = rng.choice(ints)
        value = rng.choice([0, 1, arg + 1, max(arg - 1, 0), arg * 2, 2**16, 2**31 - 1, -1, -(2**31)])
        new = pkl[:pos] + b"J" + struct.pack("<i", value) + pkl[end:]
    elif edit == "string":
        strs = [(o, a, p, e) for (o, a, p), e in zip(ops, ends) if o.name in ("BINUNICODE", "SHORT_BINUNICODE")]
        op, arg, pos, end = rng.choice(strs)
        others = [a for o, a, _ in ops if o.name in ("BINUNICODE", "SHORT_BINUNICODE")]
        text = rng.choice([rng.choice(others), arg + "0", arg[:-1], "", "../../etc/passwd", "x" * 300]).encode()
        new = pkl[:pos] + b"X" + struct.pack("<I", len(text)) + text + pkl[end:]
    elif edit == "global":
        globals_ = [(o, a, p, e) for (o, a, p), e in zip(ops, ends) if o.name == "GLOBAL"]
        op, arg, pos, end = rng.choice(globals_)
        new = pkl[:pos] + b"c" + rng.choice(_GLOBALS) + b"\n" + pkl[end:]
    elif edit == "opcode":
        new = pkl[:pos] + rng.choice(_OPCODES) + pkl[pos + 1 :]
    elif edit == "delete":
        new = pkl[:pos] + pkl[end:]
    elif edit == "duplicate":
        new = pkl[:end] + pkl[pos:end] + pkl[end:]
    else:
        new = pkl
    return Mutant(_rezip(orig, new), f"pickle-{edit}")


# GGUF: numeric header fields (counts, lengths, types, dims, offsets) and string bytes.


def _gguf_edit(rng, orig):
    parts = orig.extra["parts"]
    at, width, is_text = rng.choice(parts)
    if is_text:
        data = bytearray(orig.data)
        k = at + rng.randrange(width)
        data[k] = rng.choice([0, 0xFF, 0x80, ord("."), data[k] ^ 0x20])
        return Mutant(bytes(data), "gguf-string")
    value = int.from_bytes(orig.data[at : at + width], "little")
    return Mutant(_patch_int(orig.data, at, width, _interesting(rng, value, width)), f"gguf-field{width * 8}")


_EDITS = {"safetensors": [_st_edit], "bin": [_zip_edit, _pickle_edit], "gguf": [_gguf_edit]}


def _mutant(fmt: str, index: int, orig: Original) -> Mutant:
    """Mutant ``index`` of ``fmt`` (deterministic: the seed is the format and the index)."""
    rng = random.Random(f"issue19-{fmt}-{index}")
    kind = rng.choices(["truncate", "splice", "flip", "edit"], weights=[1, 1, 4, 4])[0]
    if kind == "truncate":
        return _truncate(rng, orig)
    if kind == "splice":
        return _splice(rng, orig)
    if kind == "flip":
        return _flip(rng, orig)
    return rng.choice(_EDITS[fmt])(rng, orig)


# ─── the fixtures as independent readers see them ─────────────────────────────


# safetensors dtype codes as numpy dtype names (what maxfx hands out; ml_dtypes names the 16- and 8-bit floats).
_ST_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
}
_ST_DTYPES |= {
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}


def _st_reference(data: bytes) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """The ``safetensors`` package's reading (its Rust parser): name -> (numpy dtype name, shape, bytes)."""
    return {
        name: (_ST_DTYPES.get(t["dtype"], t["dtype"]), tuple(t["shape"]), bytes(t["data"]))
        for name, t in deserialize(data)
    }


def _open_safetensors(path: Path) -> Original:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return Original(path, data, [(0, 8 + n)], _st_reference(data), {})


class _RefStorage:
    """A storage as the reference reader sees it (an opaque object: pickle BUILD on it is harmless)."""

    def __init__(self, raw: bytes, dtype: np.dtype):
        self.values = np.frombuffer(raw, dtype)


class _RefTensor:
    def __init__(self, storage, offset, size, stride, *_):
        if not isinstance(storage, _RefStorage):
            raise pickle.UnpicklingError("not a storage")
        count = math.prod(size)
        if count and offset + sum((d - 1) * s for d, s in zip(size, stride)) >= storage.values.size:
            raise pickle.UnpicklingError("tensor outside its storage")
        index = offset + sum(
            np.arange(d).reshape([-1 if k == j else 1 for k in range(len(size))]) * s
            for j, (d, s) in enumerate(zip(size, stride))
        )
        self.array = storage.values[np.asarray(index, np.int64)] if count else np.zeros(size, storage.values.dtype)


def _ref_parameter(data, *_):
    """torch's ``_rebuild_parameter``: ``Parameter(data)``, which needs a tensor."""
    if not isinstance(data, _RefTensor):
        raise pickle.UnpicklingError(f"reference reader: _rebuild_parameter of a {type(data).__name__}")
    return data


_REF_STORAGES = {
    "FloatStorage": "<f4",
    "HalfStorage": "<f2",
    "IntStorage": "<i4",
    "ByteStorage": "u1",
    "DoubleStorage": "<f8",
    "LongStorage": "<i8",
}


def _bin_reference(data: bytes) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """A ``zipfile`` + numpy reading of a ``torch.save`` zip (zipfile checks each entry's CRC).

    Only what the fixtures use is understood: ``_rebuild_tensor_v2``,
    ``OrderedDict`` and typed storages; anything else raises.
    """
    zf = zipfile.ZipFile(io.BytesIO(data))
    root = next(n for n in zf.namelist() if n.endswith("data.pkl"))[: -len("data.pkl")]

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return _RefTensor
            if (module, name) == ("torch._utils", "_rebuild_parameter"):
                return _ref_parameter
            if (module, name) == ("collections", "OrderedDict"):
                return collections.OrderedDict
            if module == "torch" and name in _REF_STORAGES:
                return np.dtype(_REF_STORAGES[name])
            raise pickle.UnpicklingError(f"reference reader: no global {module}.{name}")

        def persistent_load(self, pid):
            _, dtype, key, _, numel = pid
            raw = zf.read(f"{root}data/{key}")
            if numel * dtype.itemsize > len(raw):
                raise pickle.UnpicklingError("storage larger than its entry")
            return _RefStorage(raw[: numel * dtype.itemsize], dtype)

    out = {}

    def flatten(obj, prefix):
        for key, value in dict.items(obj):
            if isinstance(value, _RefTensor):
                out[prefix + key] = (
                    value.array.dtype.name,
                    value.array.shape,
                    np.ascontiguousarray(value.array).tobytes(),
                )
            elif isinstance(value, dict):
                flatten(value, f"{prefix}{key}.")

    flatten(Unpickler(io.BytesIO(zf.read(root + "data.pkl"))).load(), "")
    return out


def _open_bin(path: Path) -> Original:
    data = path.read_bytes()
    eocd = data.rindex(b"PK\x05\x06")
    cd_offset = int.from_bytes(data[eocd + 16 : eocd + 20], "little")
    structure, central = [(cd_offset, len(data))], []
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
        pkl = zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    for info in infos:
        h = info.header_offset
        header_len = (
            30 + int.from_bytes(data[h + 26 : h + 28], "little") + int.from_bytes(data[h + 28 : h + 30], "little")
        )
        is_storage = "/data/" in info.filename
        structure.append((h, h + header_len + (0 if is_storage else info.compress_size)))
    pos = cd_offset
    while data[pos : pos + 4] == b"PK\x01\x02":
        central.append(pos)
        pos += 46 + sum(int.from_bytes(data[pos + k : pos + k + 2], "little") for k in (28, 30, 32))
    extra = {"local_headers": [i.header_offset for i in infos], "central_headers": central, "eocd": eocd, "pickle": pkl}
    return Original(path, data, structure, _bin_reference(data), extra)


def _gguf_reference(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """``gguf.GGUFReader``'s reading: name -> (GGML type, row-major shape, raw bytes).

    Only asked about mutants maxfx accepted, whose header maxfx's bounded scan
    passed (the reader alone can loop for ever on a hostile count).
    """
    reader = gguf.GGUFReader(path)
    return {
        t.name: (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())), t.data.tobytes())
        for t in reader.tensors
    }


def _open_gguf(path: Path) -> Original:
    data = path.read_bytes()
    reader = gguf.GGUFReader(path)
    parts, tensors = [], {}
    for f in [*reader.fields.values(), *(t.field for t in reader.tensors)]:
        at = f.offset
        for p in f.parts:
            if p.dtype == np.uint8:
                parts.append((at, p.nbytes, True))
            else:
                parts.extend((at + k * p.itemsize, p.itemsize, False) for k in range(p.size))
            at += p.nbytes
    for t in reader.tensors:
        start = int(t.data_offset)
        name_at = t.field.offset + 8
        tensors[t.name] = (
            t.tensor_type.name,
            tuple(int(d) for d in reversed(t.shape.tolist())),
            data[start : start + int(t.n_bytes)],
            name_at,
            start,
        )
    layout = {name: (name_at, start) for name, (_, _, _, name_at, start) in tensors.items()}
    plain = {name: v[:3] for name, v in tensors.items()}
    return Original(path, data, [(0, reader.data_offset)], plain, {"parts": parts, "layout": layout})


_OPENERS = {"safetensors": _open_safetensors, "bin": _open_bin, "gguf": _open_gguf}


# ─── the oracle ───────────────────────────────────────────────────────────────


def _load_maxfx(fmt: str, path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """Open ``path`` with maxfx, read every tensor and the metadata: name -> (stored type, shape, raw bytes)."""
    weights = mw.load_weights([path])
    out = {}
    if fmt == "gguf":
        _ = weights.metadata
        for name, w in weights.items():
            info = w.info()
            values = w.values()  # dequantizes Q8_0; must not fail on any bytes
            assert values.shape == info.logical_shape, (name, values.shape, info.logical_shape)
            out[name] = (info.storage_type, info.logical_shape, w.raw_tensor().tobytes())
        return out
    if fmt == "safetensors":
        _ = weights.metadata
    for name, w in weights.items():
        value = np.ascontiguousarray(w.values())
        out[name] = (value.dtype.name, value.shape, value.tobytes())
    return out


def _refusal_is_typed(error: BaseException, path: Path) -> bool:
    typed = isinstance(error, (ValueError, pickle.UnpicklingError)) and not isinstance(
        error, (UnicodeError, json.JSONDecodeError)
    )
    return typed and str(path) in str(error)


def _same(got, want) -> bool:
    """Same names, and per name the same dtype, shape and bytes."""
    return got.keys() == want.keys() and all(got[name] == want[name] for name in want)


def _confined_to_flips(fmt, orig: Original, got, flips: set[int]) -> bool:
    """Each tensor's changed bytes are flipped bytes at that tensor's place in the file."""
    if not flips or got.keys() != orig.tensors.keys():
        return False
    for name, (_, shape, raw) in orig.tensors.items():
        g_raw = got[name][2]
        if got[name][1] != shape or len(g_raw) != len(raw):
            return False
        if g_raw == raw:
            continue
        start = _data_start(fmt, orig, name)
        changed = np.flatnonzero(np.frombuffer(g_raw, np.uint8) != np.frombuffer(raw, np.uint8)) + start
        if not set(changed.tolist()) <= flips:
            return False
    return True


def _data_start(fmt, orig: Original, name: str) -> int:
    if fmt == "gguf":
        return orig.extra["layout"][name][1]
    n = int.from_bytes(orig.data[:8], "little")
    header = json.loads(orig.data[8 : 8 + n])
    return 8 + n + header[name]["data_offsets"][0]


def _gguf_at_original_places(orig: Original, mutant: Mutant, got) -> bool:
    """GGUF mutants that load must be the original layout read from the mutant's bytes (names included)."""
    want = {}
    for name, (qtype, shape, raw) in orig.tensors.items():
        name_at, start = orig.extra["layout"][name]
        try:
            new_name = mutant.data[name_at : name_at + len(name.encode())].decode()
        except UnicodeDecodeError:
            return False
        want[new_name] = (qtype, shape, mutant.data[start : start + len(raw)])
    return _same(got, want)


def classify(fmt: str, orig: Original, mutant: Mutant, path: Path) -> str:
    """The outcome of loading ``mutant`` (written at ``path``); raises WrongOutput for a forbidden one."""
    try:
        got = _load_maxfx(fmt, path)
    except Exception as e:  # noqa: BLE001 - the oracle judges every exception type
        if _refusal_is_typed(e, path):
            return "refused"
        raise WrongOutput(f"raw error {type(e).__name__}: {str(e)[:300]}") from e
    if _same(got, orig.tensors):
        return "equal"
    if fmt == "bin" and not mutant.kind.startswith("pickle-"):
        raise WrongOutput(
            "loaded different tensors from a .bin whose pickle was not rewritten (its CRCs should refuse it)"
        )
    if fmt == "safetensors":
        try:
            reference = _st_reference(mutant.data)
        except SafetensorError as e:
            raise WrongOutput(f"loaded a file the safetensors package refuses ({e})") from None
        if not _same(got, reference):
            raise WrongOutput("loaded tensors that differ from the safetensors package's reading")
    elif fmt == "bin":
        try:
            reference = _bin_reference(mutant.data)
        except Exception as e:  # noqa: BLE001
            raise WrongOutput(f"loaded a pickle the reference reader refuses ({type(e).__name__}: {e})") from None
        if not _same(got, reference):
            raise WrongOutput("loaded tensors that differ from the reference reading of the rewritten pickle")
    elif not (_gguf_at_original_places(orig, mutant, got) or _same(got, _gguf_reference(path))):
        raise WrongOutput(
            "loaded tensors that are neither the bytes at the tensors' places in the file nor gguf.GGUFReader's reading"
        )
    return "undetectable-data" if _confined_to_flips(fmt, orig, got, mutant.flips) else "undetectable-header"


# ─── the child: one batch of mutants under a memory limit and per-mutant alarms ─


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


def run_batch(fmt: str, start: int, stop: int, workdir: Path) -> None:
    """Child entry point: print one JSON line per mutant (``{"i", "kind", "outcome", "detail"}``)."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    signal.signal(signal.SIGALRM, _alarm)
    np.seterr(all="ignore")  # flipped GGUF block scales dequantize to inf/nan: expected, not news
    originals = [_OPENERS[fmt](p) for p in FIXTURES[fmt]]
    suffix = FIXTURES[fmt][0].suffix
    for i in range(start, stop):
        orig = originals[i % len(originals)]
        mutant = _mutant(fmt, i, orig)
        path = workdir / f"{fmt}-{i}{suffix}"
        path.write_bytes(mutant.data)
        print(json.dumps({"i": i, "started": True}), flush=True)
        signal.alarm(MUTANT_SECONDS)
        try:
            outcome, detail = classify(fmt, orig, mutant, path), ""
        except _Hang:
            outcome, detail = "hang", f"no result after {MUTANT_SECONDS} s"
        except MemoryError:
            outcome, detail = "memory", f"allocated past the {MEMORY_LIMIT >> 30} GiB limit"
        except WrongOutput as e:
            outcome, detail = "wrong", str(e)
        finally:
            signal.alarm(0)
        path.unlink()
        print(
            json.dumps({"i": i, "kind": mutant.kind, "fixture": orig.path.name, "outcome": outcome, "detail": detail}),
            flush=True,
        )


# ─── the tests ────────────────────────────────────────────────────────────────


def _fuzz(fmt: str, count: int, workdir: Path) -> Counter:
    """Run mutants ``0..count`` of ``fmt`` in child batches; fail on any forbidden outcome, naming the mutant."""
    outcomes: Counter = Counter()
    failures = []
    for start in range(0, count, BATCH):
        stop = min(start + BATCH, count)
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        cmd = [sys.executable, __file__, fmt, str(start), str(stop), str(workdir)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 2 * (stop - start), env=env)
            stdout, crashed = (
                proc.stdout,
                proc.returncode != 0 and f"exit status {proc.returncode} ({proc.stderr[-2000:]})",
            )
        except subprocess.TimeoutExpired as e:
            stdout, crashed = (e.stdout or b"").decode(), "the batch timed out (a hang outside Python code)"
        results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        done = [r for r in results if "outcome" in r]
        if crashed:
            last = results[-1]["i"] if results else start
            failures.append(f"mutant {fmt}:{last} (or the batch) crashed: {crashed}")
        for r in done:
            outcomes[r["outcome"]] += 1
            if r["outcome"] not in ACCEPTED:
                failures.append(f"mutant {fmt}:{r['i']} ({r['kind']}, {r['fixture']}): {r['outcome']}: {r['detail']}")
        if not crashed and len(done) != stop - start:
            failures.append(f"batch {fmt}:{start}-{stop} reported {len(done)} results")
    print(f"\nfuzz {fmt}: {count} mutants: {dict(sorted(outcomes.items()))}")
    assert not failures, "\n".join(failures[:20])
    return outcomes


@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzz_mutants_are_refused_or_equal(fmt, tmp_path, record_property):
    outcomes = _fuzz(fmt, DEFAULT_COUNT, tmp_path)
    record_property(f"fuzz_{fmt}", dict(outcomes))
    assert sum(outcomes.values()) == DEFAULT_COUNT
    assert outcomes["refused"] >= DEFAULT_COUNT // 3  # the mutators really damage the files


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzz_many_mutants_are_refused_or_equal(fmt, tmp_path, record_property):
    outcomes = _fuzz(fmt, SLOW_COUNT, tmp_path)
    record_property(f"fuzz_{fmt}", dict(outcomes))
    assert sum(outcomes.values()) == SLOW_COUNT


# ─── hostile payloads never run ───────────────────────────────────────────────


def _x(text: str) -> bytes:
    """Pickle BINUNICODE: push ``text``."""
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def _payloads(marker: Path) -> dict[str, bytes]:
    """Pickle fragments that create ``marker`` when a plain unpickler runs them, each leaving the stack as it found
    it.
    """
    shell, code = f"touch {marker}", f"open({str(marker)!r}, 'w').close()"

    def call(module: str, name: str, arg: str) -> bytes:  # GLOBAL, (arg,), REDUCE, POP
        return f"c{module}\n{name}\n".encode() + _x(arg) + b"\x85R0"

    return {
        "os.system": call("os", "system", shell),
        "posix.system": call("posix", "system", shell),
        "subprocess.getoutput": call("subprocess", "getoutput", shell),
        "builtins.exec": call("builtins", "exec", code),
        "builtins.eval": call("builtins", "eval", code),
        "stack-global": _x("builtins") + _x("exec") + b"\x93" + _x(code) + b"\x85R0",
        "inst": b"(" + _x(code) + b"ibuiltins\nexec\n0",
    }


@pytest.mark.parametrize("payload", list(_payloads(Path("m"))))
def test_payloads_are_live_under_plain_pickle(payload, tmp_path):
    # The marker tests below mean something only if plain pickle runs these payloads.
    marker = tmp_path / "marker"
    pickle.loads(b"\x80\x02" + _payloads(marker)[payload] + b"N.")
    assert marker.exists()


@pytest.mark.parametrize("payload", list(_payloads(Path("m"))))
def test_a_pickle_payload_in_a_bin_never_runs(payload, tmp_path):
    marker = tmp_path / "marker"
    orig = _open_bin(FIXTURES["bin"][0])
    pkl, fragment = orig.extra["pickle"], _payloads(marker)[payload]
    boundaries = [pos for _, _, pos in pickletools.genops(pkl)][1:]  # after PROTO, up to STOP
    rng = random.Random(f"issue19-marker-{payload}")
    variants = [b"\x80\x02" + fragment + b"N."] + [pkl[:at] + fragment + pkl[at:] for at in rng.sample(boundaries, 8)]
    for i, variant in enumerate(variants):
        path = tmp_path / f"hostile-{i}.bin"
        path.write_bytes(_rezip(orig, variant))
        with pytest.raises(ForbiddenGlobalError) as info:
            _load_maxfx("bin", path)
        assert str(path) in str(info.value)
        assert not marker.exists(), (payload, i)


def _code_strings(marker: Path) -> list[str]:
    """Strings a careless reader might evaluate, run in a shell or unpickle."""
    return [
        f"__import__('os').system('touch {marker}')",
        f"$(touch {marker})",
        f"; touch {marker}",
        (b"\x80\x02" + _payloads(marker)["os.system"] + b"N.").decode("latin-1"),
    ]


def test_code_in_safetensors_strings_never_runs(tmp_path):
    marker = tmp_path / "marker"
    header, body = _st_header(_open_safetensors(FIXTURES["safetensors"][0]))
    first = next(k for k in header if k != "__metadata__")
    for i, text in enumerate(_code_strings(marker)):
        edited = {(text if k == first else k): v for k, v in header.items()}
        edited["__metadata__"] = {"format": text, text: text}
        path = tmp_path / f"hostile-{i}.safetensors"
        path.write_bytes(_st_pack(json.dumps(edited), body))
        got = _load_maxfx("safetensors", path)
        assert mw.SafetensorWeights([path]).metadata == edited["__metadata__"]
        assert got[text] == _st_reference(path.read_bytes())[text]
        assert not marker.exists(), i


def _gguf_with_strings(orig: Original, strings: dict[str, str]) -> bytes:
    """The GGUF fixture with extra string key/value pairs (header rebuilt, tensor data unchanged)."""
    reader = gguf.GGUFReader(orig.path)
    kv_end = reader.tensors[0].field.offset
    last = reader.tensors[-1].field
    header_end = last.offset + sum(p.nbytes for p in last.parts)
    extra = b""
    for key, value in strings.items():
        k, v = key.encode(), value.encode()
        extra += struct.pack("<Q", len(k)) + k + struct.pack("<IQ", 8, len(v)) + v
    n_kv = int.from_bytes(orig.data[16:24], "little") + len(strings)
    header = orig.data[:16] + struct.pack("<Q", n_kv) + orig.data[24:kv_end] + extra + orig.data[kv_end:header_end]
    return header + bytes(-len(header) % 32) + orig.data[reader.data_offset :]


def test_code_in_gguf_strings_never_runs(tmp_path):
    marker = tmp_path / "marker"
    orig = _open_gguf(FIXTURES["gguf"][0])
    strings = {f"general.hostile.{i}": text for i, text in enumerate(_code_strings(marker))}
    path = tmp_path / "hostile.gguf"
    path.write_bytes(_gguf_with_strings(orig, strings))
    assert _load_maxfx("gguf", path) == orig.tensors
    metadata = mw.GGUFWeights(path).metadata
    assert {k: metadata[k] for k in strings} == strings
    assert not marker.exists()


if __name__ == "__main__":
    run_batch(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
