"""GGUFWeights refuses the GGUF files llama.cpp refuses (issue 19, items 5 and 8).

``gguf.GGUFReader`` (the parser maxfx builds on) trusts the header: it loads a
tensor whose offset points into another tensor, a misaligned one, one whose
offset wraps past 2**64, or one whose type was changed, and it loops for ever
on an array claiming 2**60 elements. llama.cpp's ``gguf_init_from_file``
refuses all of these: each tensor must start where the previous one ends,
padded to ``general.alignment``. The hostile files here are made by patching
single header fields of tiny files written with ``gguf.GGUFWriter`` (or of the
tiny_llama fixtures); field positions come from ``gguf.GGUFReader``, values
from the writer's input arrays.
"""

import contextlib
import signal
import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from maxfx.graph.weights import GGUFWeights
from maxfx.pipelines.lib.hf_utils import read_gguf_metadata

LLAMA = Path(__file__).parent.parent / "data" / "models" / "tiny_llama"
TENSORS = {
    "a": np.arange(8, dtype=np.float32),
    "b": np.arange(8, 16, dtype=np.float32),
    "c": np.arange(16, 32, dtype=np.float32).reshape(4, 4),
}


@contextlib.contextmanager
def _deadline(seconds):
    """Raise TimeoutError in the main thread after ``seconds`` (the unpatched reader loops in Python, so this interrupts
    it).
    """

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _write(path, *, alignment=None, metadata=(), tensors=TENSORS, endianess=gguf.GGUFEndian.LITTLE):
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, value in metadata:
        writer.add_array(key, value) if isinstance(value, list) else writer.add_string(key, value)
    for name, value in tensors.items():
        writer.add_tensor(name, value)  # the writer byte-swaps for a big-endian file
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _info_positions(path, name):
    """File offsets of tensor ``name``'s dims, type id and data offset (from gguf.GGUFReader's parse)."""
    field = next(t.field for t in gguf.GGUFReader(path).tensors if t.name == name)
    dims = field.offset + 8 + len(name.encode()) + 4
    n_dims = int(field.parts[2][0])
    return {"dims": dims, "type": dims + 8 * n_dims, "offset": dims + 8 * n_dims + 4}


def _field_position(path, key, part):
    """File offset of part ``part`` of metadata field ``key`` (0 key length, 1 key, 2 type, 3.. the value's parts)."""
    field = gguf.GGUFReader(path).fields[key]
    return field.offset + sum(int(p.nbytes) for p in field.parts[:part])


def _patch(path, position, fmt, value):
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, position, value)
    path.write_bytes(bytes(data))
    return path


def _tensor_offset(path, name):
    return struct.unpack_from("<Q", path.read_bytes(), _info_positions(path, name)["offset"])[0]


def _refused(path, match):
    with _deadline(10), pytest.raises(ValueError, match=match) as info:
        GGUFWeights(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_well_formed_files_load_like_the_gguf_reader(tmp_path):
    for path in (
        _write(tmp_path / "plain.gguf"),
        _write(tmp_path / "aligned64.gguf", alignment=64),
        LLAMA / "tiny_llama-q8_0.gguf",
    ):
        weights, reader = GGUFWeights(path), gguf.GGUFReader(path)
        for t in reader.tensors:
            assert weights[t.name].raw_tensor().tobytes() == t.data.tobytes(), (path, t.name)
    weights = GGUFWeights(_write(tmp_path / "plain2.gguf"))
    for name, value in TENSORS.items():
        np.testing.assert_array_equal(weights[name].data().to_numpy(), value)


def test_aliased_tensor_is_refused(tmp_path):
    path = _write(tmp_path / "alias.gguf")
    _patch(path, _info_positions(path, "b")["offset"], "<Q", _tensor_offset(path, "a"))
    # The gguf reader silently serves a's values as b:
    reader = {t.name: t for t in gguf.GGUFReader(path).tensors}
    np.testing.assert_array_equal(reader["b"].data, TENSORS["a"])
    _refused(path, r"tensor 'b'.*data offset 0, expected 32: it overlaps 'a' \(F32 \[8\], 32 bytes\)")


def test_gap_between_tensors_is_refused(tmp_path):
    path = _write(tmp_path / "gap.gguf")
    _patch(path, _info_positions(path, "c")["offset"], "<Q", _tensor_offset(path, "c") + 32)
    with open(path, "ab") as f:
        f.write(b"\0" * 32)
    _refused(path, r"tensor 'c'.*data offset 96, expected 64: it leaves a gap after 'b'")


def test_misaligned_tensor_is_refused(tmp_path):
    path = _write(tmp_path / "misaligned.gguf")
    _patch(path, _info_positions(path, "b")["offset"], "<Q", _tensor_offset(path, "b") + 4)
    _refused(path, r"tensor 'b'.*data offset 36, expected 32: not a multiple of the alignment 32")


def test_custom_alignment_is_honoured(tmp_path):
    path = _write(tmp_path / "aligned64.gguf", alignment=64)
    assert _tensor_offset(path, "b") == 64  # a and b are 32 bytes; general.alignment = 64 pads each
    _patch(path, _info_positions(path, "b")["offset"], "<Q", 32)
    _refused(path, r"tensor 'b'.*data offset 32, expected 64: not a multiple of the alignment 64")


@pytest.mark.parametrize("alignment", [0, 48])
def test_alignment_not_a_power_of_two_is_refused(tmp_path, alignment):
    path = _write(tmp_path / "badalign.gguf", alignment=64)
    _patch(path, _field_position(path, "general.alignment", 3), "<I", alignment)
    _refused(path, rf"key 'general\.alignment'.*alignment {alignment} is not a power of two")


def test_offset_wrapping_past_2_64_is_refused(tmp_path):
    path = _write(tmp_path / "wrap.gguf")
    wrapped = 2**64 - gguf.GGUFReader(path).data_offset  # data section start + offset == 2**64, i.e. byte 0 in uint64
    _patch(path, _info_positions(path, "c")["offset"], "<Q", wrapped)
    with pytest.warns(RuntimeWarning, match="overflow"):
        reader = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert reader["c"].data.tobytes().startswith(b"GGUF")  # the gguf reader serves the header as c's values
    _refused(path, rf"tensor 'c'.*data offset {wrapped}, expected 64: it points past the end of the file")


def test_changed_tensor_type_is_refused(tmp_path):
    """tiny_llama Q8_0 with token_embd.weight relabelled Q4_0: same shape, fewer bytes, every later offset is off."""
    path = tmp_path / "retyped.gguf"
    path.write_bytes((LLAMA / "tiny_llama-q8_0.gguf").read_bytes())
    _patch(path, _info_positions(path, "token_embd.weight")["type"], "<I", int(gguf.GGMLQuantizationType.Q4_0))
    _refused(
        path,
        r"tensor 'output_norm\.weight'.*expected 9216: it leaves a gap after 'token_embd\.weight' \(Q4_0 \[64, 256\], "
        r"9216 bytes\)",
    )


def test_changed_type_of_the_last_tensor_is_refused(tmp_path):
    path = _write(tmp_path / "last.gguf")
    _patch(path, _info_positions(path, "c")["type"], "<I", int(gguf.GGMLQuantizationType.F16))
    _refused(path, r"32 bytes follow the last tensor 'c' \(F16 \[4, 4\], 32 bytes\)")
    _patch(path, _info_positions(path, "c")["type"], "<I", int(gguf.GGMLQuantizationType.F64))
    _refused(path, r"tensor 'c'.*F64 \[4, 4\] data ends at byte \d+ but the file has \d+ \(truncated file\?\)")


def test_unknown_type_id_names_the_tensor(tmp_path):
    path = _write(tmp_path / "unknown.gguf")
    _patch(path, _info_positions(path, "b")["type"], "<I", 99)
    _refused(path, r"tensor 'b'.*GGML type id 99 is unknown \(known: 0 \(F32\), 1 \(F16\)")


def test_row_not_a_whole_number_of_blocks(tmp_path):
    path = tmp_path / "rows.gguf"
    path.write_bytes((LLAMA / "tiny_llama-q8_0.gguf").read_bytes())
    _patch(path, _info_positions(path, "token_embd.weight")["dims"], "<Q", 48)
    _refused(path, r"tensor 'token_embd\.weight'.*Q8_0 rows hold blocks of 32 values but the row length is 48")


def test_too_many_dimensions(tmp_path):
    path = _write(tmp_path / "dims.gguf", tensors={"a": np.zeros((1, 1, 1, 1, 2), np.float32)})
    _refused(path, r"tensor 'a'.*5 dimensions; GGUF tensors have at most 4")


@pytest.mark.parametrize(
    "what, key, part, fmt, match",
    [
        ("uint8 array", "test.bytes", 4, "<Q", r"key 'test\.bytes'.*array of 1152921504606846976 elements needs"),
        (
            "string array",
            "test.words",
            4,
            "<Q",
            r"key 'test\.words'.*array of 1152921504606846976 strings needs at least",
        ),
        ("string length", "test.word", 3, "<Q", r"key 'test\.word'.*string value needs 1152921504606846976 bytes"),
    ],
)
def test_huge_metadata_counts_fail_fast(tmp_path, what, key, part, fmt, match):
    metadata = [("test.bytes", [1, 2, 3]), ("test.words", ["x", "yz"]), ("test.word", "hello")]
    path = _write(tmp_path / "huge.gguf", metadata=metadata)
    _patch(path, _field_position(path, key, part), fmt, 2**60)
    start = time.perf_counter()
    _refused(path, match)
    assert time.perf_counter() - start < 1.0, what


@pytest.mark.parametrize("count", [2**60, None])
def test_pipelines_metadata_reader_is_bounded_too(tmp_path, count):
    """Issue 35: read_gguf_metadata ran a bare gguf.GGUFReader, which spun for minutes on a huge array count.

    ``None``: a string count just under the file's bytes / 8, which passes the first bound and is
    refused by the per-string walk (work proportional to the file, not to the count).
    """
    path = _write(tmp_path / "huge.gguf", metadata=[("test.bytes", [1, 2, 3]), ("test.words", ["x", "yz"])])
    key, claimed = (
        ("test.bytes", count)
        if count
        else ("test.words", (path.stat().st_size - _field_position(path, "test.words", 4)) // 8 - 2)
    )
    _patch(path, _field_position(path, key, 4), "<Q", claimed)
    start = time.perf_counter()
    with _deadline(10), pytest.raises(ValueError, match=rf"huge\.gguf.*key '{key}'.*{claimed}"):
        read_gguf_metadata(path)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    "count, match", [(1, r"header claims 1152921504606846976 tensors"), (2, r"1152921504606846976 key/value pairs")]
)
def test_huge_header_counts_fail_fast(tmp_path, count, match):
    path = _patch(_write(tmp_path / "counts.gguf"), 8 * count, "<Q", 2**60)
    _refused(path, match)


def test_duplicate_key_and_tensor_name(tmp_path):
    path = _write(tmp_path / "dupkey.gguf", metadata=[("test.aaa", "1"), ("test.bbb", "2")])
    data = path.read_bytes()
    path.write_bytes(data.replace(b"test.bbb", b"test.aaa"))
    _refused(path, r"key 'test\.aaa'.*appears twice")
    path = _write(tmp_path / "dupname.gguf", tensors={"w1": TENSORS["a"], "w2": TENSORS["b"]})
    path.write_bytes(path.read_bytes().replace(b"w2", b"w1"))
    _refused(path, r"tensor 'w1'.*two tensors have this name")


def test_nested_array_is_refused_like_llama_cpp(tmp_path):
    path = _write(tmp_path / "nested.gguf", metadata=[("test.nested", [[1, 2], [3]])])
    _refused(path, r"key 'test\.nested'.*array element type 9 is not a scalar or string type")


def test_trailing_and_truncated_data(tmp_path):
    path = _write(tmp_path / "tail.gguf")
    path.write_bytes(path.read_bytes() + b"\0" * 32)
    _refused(path, r"32 bytes follow the last tensor 'c'")
    path = _write(tmp_path / "cut.gguf")
    path.write_bytes(path.read_bytes()[:-40])
    _refused(path, r"tensor 'c'.*truncated")


def test_an_open_reader_is_checked_too(tmp_path):
    path = _write(tmp_path / "alias.gguf")
    _patch(path, _info_positions(path, "b")["offset"], "<Q", 0)
    with pytest.raises(ValueError, match=r"alias\.gguf.*tensor 'b'.*overlaps 'a'"):
        GGUFWeights(gguf.GGUFReader(path))


def test_big_endian_file_loads(tmp_path):
    path = _write(tmp_path / "big.gguf", endianess=gguf.GGUFEndian.BIG)
    weights = GGUFWeights(path)
    for name, value in TENSORS.items():
        np.testing.assert_array_equal(weights[name].data().to_numpy(), value)


def test_metadata_string_that_is_not_utf8_names_the_key(tmp_path):
    # Found by tests/reliability/test_fuzz_weights.py: gguf's contents() raised a bare UnicodeDecodeError.
    path = _write(tmp_path / "bad_utf8.gguf", metadata=[("general.name", "tiny")])
    _patch(path, _field_position(path, "general.name", 4), "B", 0xFF)  # first byte of the value
    weights = GGUFWeights(path)
    np.testing.assert_array_equal(weights.a.values(), TENSORS["a"])  # the tensors are intact
    with pytest.raises(ValueError, match=r"\(key 'general.name'\): a string value is not UTF-8") as info:
        weights.metadata
    assert str(path) in str(info.value)
