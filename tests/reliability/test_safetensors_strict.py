"""SafetensorWeights refuses every file the ``safetensors`` package refuses (issue 19, items 5 and 9).

Each hostile file is built from bytes by hand (or from the tiny_llama fixture),
and the oracle is the ``safetensors`` package's own Rust parser: both readers
must refuse it, maxfx with a ``ValueError`` naming the file and what is wrong.
The well-formed variants (header padded with spaces, tensors listed out of
offset order, zero-size tensors) must load in both and give equal arrays.
"""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import SafetensorError, safe_open

from maxfx.graph.weights import SafetensorWeights

LLAMA = Path(__file__).parent.parent / "data" / "models" / "tiny_llama" / "model.safetensors"
FOUR_FLOATS = np.arange(4, dtype=np.float32).tobytes()


def _f32(begin, end, shape=(2,)):
    return {"dtype": "F32", "shape": list(shape), "data_offsets": [begin, end]}


def _write(path, header, data=b"", *, length=None):
    """A safetensors file: 8-byte length (``length`` overrides the true one), header, data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def _reference(path):
    with safe_open(str(path), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__


def _maxfx(path):
    return SafetensorWeights([path]).materialize()


def _assert_both_refuse(path, match):
    with pytest.raises(SafetensorError):
        _reference(path)
    with pytest.raises(ValueError, match=match) as info:
        _maxfx(path)
    assert str(path) in str(info.value)


def _assert_both_load_equal(path):
    want = _reference(path)
    got = _maxfx(path)
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value)


HOSTILE = {
    # Two names read one byte range: an attacker swaps weights without changing the data.
    "overlap": ({"a": _f32(0, 8), "b": _f32(0, 8)}, FOUR_FLOATS[:8], r"'b'.*overlap tensor 'a'"),
    "overlap_with_spare_bytes": ({"a": _f32(0, 8), "b": _f32(0, 8)}, FOUR_FLOATS, r"'b'.*overlap tensor 'a'"),
    "gap": ({"a": _f32(0, 8), "b": _f32(12, 20)}, FOUR_FLOATS + FOUR_FLOATS[:4], r"'b'.*bytes 8\.\.12.*unused"),
    "trailing_bytes": ({"a": _f32(0, 8)}, FOUR_FLOATS, r"cover 8 bytes but the data section .* has 16"),
    "data_but_no_tensors": ({}, FOUR_FLOATS, r"cover 0 bytes .* has 16"),
    # json keeps the last of two equal keys; the file then means something else to other readers.
    "duplicate_tensor": (
        b'{"a": %s, "a": %s}' % (json.dumps(_f32(0, 8)).encode(), json.dumps(_f32(8, 16)).encode()),
        FOUR_FLOATS,
        "key 'a' twice",
    ),
    "negative_dim": ({"a": _f32(0, 8, shape=(-2,))}, FOUR_FLOATS[:8], r"'a'.*shape \[-2\]"),
    "bool_dim": ({"a": _f32(0, 8, shape=(True, 2))}, FOUR_FLOATS[:8], r"'a'.*shape \[True, 2\]"),
    "float_dim": ({"a": _f32(0, 8, shape=(2.0,))}, FOUR_FLOATS[:8], r"'a'.*shape \[2\.0\]"),
    "huge_dim": ({"a": _f32(0, 8, shape=(2**70,))}, FOUR_FLOATS[:8], r"'a'.*needs"),
    "negative_offset": ({"a": _f32(-8, 0)}, FOUR_FLOATS[:8], r"'a'.*data_offsets \[-8, 0\]"),
    "end_before_begin": ({"a": _f32(8, 0)}, FOUR_FLOATS[:8], r"'a'.*data_offsets \[8, 0\]"),
    "wrong_size": ({"a": _f32(0, 12)}, FOUR_FLOATS[:12], r"'a'.*hold 12 bytes but F32\[2\] needs 8"),
    "unknown_dtype": (
        {"a": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}},
        FOUR_FLOATS[:8],
        r"'a'.*dtype 'F7'",
    ),
    "metadata_not_strings": (
        {"__metadata__": {"format": 1}, "a": _f32(0, 8)},
        FOUR_FLOATS[:8],
        "__metadata__ must be an object of string values",
    ),
    "metadata_not_object": ({"__metadata__": [1], "a": _f32(0, 8)}, FOUR_FLOATS[:8], "__metadata__ must be an object"),
    "not_an_object": ([1, 2], b"", "not a JSON object"),
    "empty_header": (b"", b"", "not valid JSON"),
    "nul_padding": (json.dumps({"a": _f32(0, 8)}).encode() + b"\0\0", FOUR_FLOATS[:8], "not valid JSON"),
    "bad_utf8": (b'{"a\xff": 1}', b"", "not valid JSON"),
    # Python's json raises RecursionError here; it must become a clear error, not a crash.
    "deeply_nested": (b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", "nested too deeply"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_header_is_refused_like_the_reference(tmp_path, case):
    header, data, match = HOSTILE[case]
    _assert_both_refuse(_write(tmp_path / f"{case}.safetensors", header, data), match)


def test_header_length_beyond_the_file(tmp_path):
    raw = json.dumps({"a": _f32(0, 8)}).encode()
    path = _write(tmp_path / "long.safetensors", raw, FOUR_FLOATS[:8], length=len(raw) + 9)
    _assert_both_refuse(path, r"header length \d+ does not fit in the file")


def test_huge_header_length_is_refused_before_reading(tmp_path):
    # 100 MB + 1: the safetensors limit. The file is tiny, but the cap is checked first.
    path = _write(tmp_path / "huge.safetensors", b"{}", length=100_000_001)
    _assert_both_refuse(path, "above the 100000000-byte limit")


def test_short_file(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x02\0\0")
    _assert_both_refuse(path, "too short")


def test_shifted_header_length_is_refused(tmp_path):
    """Writers pad the header with spaces; a length field 8 smaller still parses but shifts every tensor by 8 bytes."""
    data = LLAMA.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header, body = data[8 : 8 + n], data[8 + n :]
    padded = _write(tmp_path / "padded.safetensors", header + b" " * 8, body)
    _assert_both_load_equal(padded)  # the untouched, padded file is fine
    shifted = _write(tmp_path / "shifted.safetensors", header + b" " * 8, body, length=n)
    _assert_both_refuse(shifted, r"the tensors cover \d+ bytes but the data section .* has \d+")


def test_aliased_fixture_tensor_is_refused(tmp_path):
    """tiny_llama with one tensor re-pointed at another's bytes (same shape, same dtype)."""
    data = LLAMA.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    header["model.layers.0.self_attn.v_proj.weight"]["data_offsets"] = header["model.layers.0.self_attn.k_proj.weight"][
        "data_offsets"
    ]
    path = _write(tmp_path / "aliased.safetensors", header, data[8 + n :])
    _assert_both_refuse(path, r"(overlap|unused)")


def test_well_formed_variants_load_like_the_reference(tmp_path):
    """Out-of-order entries, zero-size tensors, null metadata and unknown entry fields are valid safetensors."""
    header = {
        "__metadata__": None,
        "b": _f32(8, 16),
        "empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]},
        "a": {**_f32(0, 8), "extra": "ignored by both readers"},
    }
    _assert_both_load_equal(_write(tmp_path / "variants.safetensors", header, FOUR_FLOATS))
    _assert_both_load_equal(LLAMA)
