"""Hostile and damaged ``torch.save`` (``.bin``) files: refused with a typed error, never run, never read out of bounds.

Files are built here with ``zipfile`` and hand-written pickle opcodes (no
torch): each test makes the smallest file that shows one attack. The oracle is
the bytes the test wrote (numpy arrays), the zip's own records (``zipfile``)
and a marker file that a payload would create.
"""

import collections
import os
import pickle
import struct
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest

import maxfx.graph.weights._pytorch as pt
from maxfx.graph.weights import PytorchWeights, load_weights
from tests.pickle_ops import p_int, p_ints, p_str

# -- pickle opcodes, written by hand (protocol 2, as torch.save writes) ----------------


def p_storage(key, numel, stype="FloatStorage"):
    """A persistent id ('storage', torch.<stype>, key, 'cpu', numel): pushes the storage."""
    return b"(" + p_str("storage") + f"ctorch\n{stype}\n".encode() + p_str(key) + p_str("cpu") + p_int(numel) + b"tQ"


def p_tensor(storage, offset, size, stride):
    """_rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""
    args = storage + p_int(offset) + p_ints(size) + p_ints(stride) + b"\x89ccollections\nOrderedDict\n)R"
    return b"ctorch._utils\n_rebuild_tensor_v2\n(" + args + b"tR"


def p_state_dict(items):
    """{name: pickled value, ...} as EMPTY_DICT MARK ... SETITEMS."""
    return b"}(" + b"".join(p_str(k) + v for k, v in items.items()) + b"u"


def pickled(body):
    return b"\x80\x02" + body + b"."


def write_zip(path, data_pkl, storages, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compress) as zf:
        zf.writestr("archive/data.pkl", data_pkl)
        zf.writestr("archive/byteorder", "little")
        for key, raw in storages.items():
            zf.writestr(f"archive/data/{key}", raw if isinstance(raw, bytes) else np.ascontiguousarray(raw).tobytes())
    return path


def one_tensor_bin(path, values, compress=zipfile.ZIP_STORED):
    """A valid checkpoint: {'w': values} in storage '0' (the baseline that each attack edits)."""
    body = p_state_dict({"w": p_tensor(p_storage("0", values.size), 0, values.shape, (1,))})
    return write_zip(path, pickled(body), {"0": values}, compress)


def peak_bytes(fn):
    """Peak traced allocation (numpy reports its buffers to tracemalloc) while running ``fn``."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- 1. storages are immutable after validation ------------------------------------------


# Memo 0 holds storage '0' (BINPUT after the persistent id); each state is applied to it with BUILD.
_REPOINT_STATES = {
    "dict-state": p_state_dict({"key": p_str("1")}),  # -> storage.__dict__.update
    "slot-state": b"N" + p_state_dict({"key": p_str("1")}) + b"\x86",  # (None, {...}) -> setattr
}


@pytest.mark.parametrize("state", _REPOINT_STATES.values(), ids=_REPOINT_STATES.keys())
def test_build_cannot_repoint_a_validated_storage(tmp_path, state):
    # Storage '0' is 4 floats; entry '1' is 1 float and sits just before other zip bytes.
    # Re-pointed, 'w' would read 12 bytes beyond entry '1' (the next header), with no error.
    storage = p_storage("0", 4) + b"q\x00"  # BINPUT 0
    body = (
        p_state_dict({"w": p_tensor(storage, 0, (4,), (1,))}) + b"h\x00" + state + b"b0"
    )  # BINGET 0, state, BUILD, POP
    path = write_zip(
        tmp_path / "repoint.bin", pickled(body), {"1": np.float32([7.0]), "0": np.arange(4, dtype=np.float32)}
    )
    with pytest.raises(pt.ForbiddenBuildError, match=r"repoint\.bin.*BUILD.*_Storage"):
        PytorchWeights(path)


def test_build_cannot_change_a_dtype_marker(tmp_path):
    # _rebuild_tensor_v3 with a torch.float32 marker whose dtype a BUILD turned into int64.
    storage = p_storage("0", 16, "UntypedStorage")
    marker = b"ctorch\nfloat32\n" + p_state_dict({"dtype": b"ctorch\nint64\n"}) + b"b"
    args = storage + p_int(0) + p_ints((4,)) + p_ints((1,)) + b"\x89ccollections\nOrderedDict\n)R" + marker
    body = p_state_dict({"w": b"ctorch._utils\n_rebuild_tensor_v3\n(" + args + b"tR"})
    path = write_zip(tmp_path / "marker.bin", pickled(body), {"0": np.arange(4, dtype=np.float32)})
    with pytest.raises(pt.ForbiddenBuildError, match=r"marker\.bin.*_DTypeMarker"):
        PytorchWeights(path)


# -- 2. BUILD cannot modify the loader -----------------------------------------------------


_LOADER_STATES = {
    "slot-state": b"N"
    + p_state_dict({"__qualname__": p_str("pwned"), "__defaults__": b"(" + p_int(1) + b"t"})
    + b"\x86",
    "dict-state": p_state_dict({"pwned": p_int(1)}),  # -> the function's __dict__
}


@pytest.mark.parametrize("state", _LOADER_STATES.values(), ids=_LOADER_STATES.keys())
def test_build_cannot_modify_an_allowlisted_callable(tmp_path, state):
    fn = pt._rebuild_tensor_v2
    before = (fn.__qualname__, fn.__defaults__, dict(fn.__dict__))
    body = p_state_dict({"hook": b"ctorch._utils\n_rebuild_tensor_v2\n" + state + b"b"})
    path = write_zip(tmp_path / "hook.bin", pickled(body), {})
    with pytest.raises(pt.ForbiddenBuildError, match=r"hook\.bin.*BUILD.*_rebuild_tensor_v2"):
        PytorchWeights(path)
    assert (fn.__qualname__, fn.__defaults__, dict(fn.__dict__)) == before
    values = np.arange(3, dtype=np.float32)  # the loader still works as before
    np.testing.assert_array_equal(
        PytorchWeights(one_tensor_bin(tmp_path / "ok.bin", values)).w.data().to_numpy(), values
    )


def test_build_on_the_ordereddict_class_changes_nothing(tmp_path):
    body = p_state_dict({"x": b"ccollections\nOrderedDict\n" + b"N" + p_state_dict({"pwned": p_int(1)}) + b"\x86b"})
    path = write_zip(tmp_path / "odclass.bin", pickled(body), {})
    with pytest.raises((pickle.UnpicklingError, ValueError), match=r"odclass\.bin"):
        PytorchWeights(path)
    assert not hasattr(collections.OrderedDict, "pwned")


def test_state_dict_metadata_build_still_loads(tmp_path):
    # model.state_dict() is an OrderedDict with a _metadata attribute; torch.save pickles it
    # as OrderedDict() + SETITEMS + BUILD({'_metadata': OrderedDict(...)}). That must load.
    values = np.arange(6, dtype=np.float32)
    items = b"(" + p_str("w") + p_tensor(p_storage("0", 6), 0, (2, 3), (3, 1)) + b"u"
    metadata = b"ccollections\nOrderedDict\n)R(" + p_str("") + b"}(" + p_str("version") + p_int(1) + b"uu"
    body = b"ccollections\nOrderedDict\n)R" + items + p_state_dict({"_metadata": metadata}) + b"b"
    path = write_zip(tmp_path / "sd.bin", pickled(body), {"0": values})
    np.testing.assert_array_equal(PytorchWeights(path).w.data().to_numpy(), values.reshape(2, 3))


def test_ordereddict_build_with_slot_state_is_refused(tmp_path):
    body = b"ccollections\nOrderedDict\n)R" + b"N" + p_state_dict({"items": p_int(1)}) + b"\x86b"
    path = write_zip(tmp_path / "slots.bin", pickled(body), {})
    with pytest.raises(pt.ForbiddenBuildError, match=r"slots\.bin.*OrderedDict"):
        PytorchWeights(path)


# -- 4. small file, huge memory ------------------------------------------------------------


def test_stride_zero_view_is_not_materialized(tmp_path):
    # expand(): a [64] row seen as [1024, 64] with stride (0, 1); 256 KiB as a copy, within the expansion limit.
    row = np.arange(64, dtype=np.float32)
    body = p_state_dict({"w": p_tensor(p_storage("0", 64), 0, (1024, 64), (0, 1))})
    path = write_zip(tmp_path / "expand.bin", pickled(body), {"0": row})
    weights = PytorchWeights(path)
    assert weights.w.shape == [1024, 64]
    out = {}
    peak = peak_bytes(lambda: out.setdefault("w", weights.w.data().to_numpy()))
    assert peak < 64 << 10, f"reading a 256-byte storage allocated {peak} bytes"
    assert not out["w"].flags.writeable
    np.testing.assert_array_equal(out["w"], np.broadcast_to(row, (1024, 64)))


def test_huge_stride_zero_view_is_refused_at_load(tmp_path):
    """Issue 35: one float viewed as [2**18, 1024] (1 GiB) loaded, then every consumer's copy grew past 3 GB."""
    body = p_state_dict({"w": p_tensor(p_storage("0", 1), 0, (2**18, 1024), (0, 0))})
    path = write_zip(tmp_path / "expand.bin", pickled(body), {"0": np.float32([2.5])})
    match = (
        r"expand\.bin: tensor 'w' \(shape \[262144, 1024\], stride \[0, 0\], offset 0\) "
        r"is a stride-0 \(expanded\) view of 1073741824 bytes over a storage of 4"
    )

    def load():
        with pytest.raises(pt.CorruptCheckpointError, match=match):
            PytorchWeights(path)

    assert peak_bytes(load) < 1 << 20


def test_overlapping_strides_are_refused_at_load(tmp_path):
    # [64, 64] with stride (1, 1) stays inside a 127-element storage but repeats elements: only as_strided makes that.
    body = p_state_dict({"w": p_tensor(p_storage("0", 127), 0, (64, 64), (1, 1))})
    path = write_zip(tmp_path / "overlap.bin", pickled(body), {"0": np.zeros(127, np.float32)})
    with pytest.raises(
        pt.CorruptCheckpointError,
        match=r"overlap\.bin: tensor 'w' .*overlapping strides: its 4096 elements repeat storage elements",
    ):
        PytorchWeights(path)


def test_deflate_bomb_data_pkl_is_refused_before_inflating(tmp_path):
    bomb = b"\x80\x02" + p_str("a" * (pt._MAX_PICKLE_BYTES + 1)) + b"."  # 64 MiB of 'a' deflates to ~64 KB
    path = write_zip(tmp_path / "bomb.bin", bomb, {}, zipfile.ZIP_DEFLATED)
    assert os.path.getsize(path) < 1 << 20
    with pytest.raises(
        pt.CorruptCheckpointError, match=r"bomb\.bin.*data\.pkl.*declares \d+ bytes.*at most 67108864"
    ) as err:
        peak = peak_bytes(lambda: PytorchWeights(path))
    assert "peak" not in locals() or peak < 4 << 20
    assert isinstance(err.value, ValueError)


def test_deflate_bomb_storage_is_streamed_within_the_tensor_size(tmp_path):
    # The entry inflates to 32 MiB; the pickle's storage (and tensor) is 4 floats.
    raw = np.zeros(8 << 20, np.float32)
    raw[:4] = [1, 2, 3, 4]
    body = p_state_dict({"w": p_tensor(p_storage("0", 4), 0, (4,), (1,))})
    path = write_zip(tmp_path / "sbomb.bin", pickled(body), {"0": raw}, zipfile.ZIP_DEFLATED)
    weights = PytorchWeights(path)
    out = {}
    peak = peak_bytes(lambda: out.setdefault("w", weights.w.data().to_numpy()))
    np.testing.assert_array_equal(out["w"], raw[:4])
    assert peak < 4 << 20, f"reading a 16-byte tensor of a deflated entry allocated {peak} bytes"


def test_storage_claiming_more_than_its_entry_is_refused(tmp_path):
    body = p_state_dict({"w": p_tensor(p_storage("0", 1 << 30), 0, (1 << 15, 1 << 15), (1 << 15, 1))})
    path = write_zip(tmp_path / "claim.bin", pickled(body), {"0": np.zeros(4, np.float32)}, zipfile.ZIP_DEFLATED)
    with pytest.raises(
        pt.CorruptCheckpointError,
        match=r"claim\.bin.*data/0 has 16 bytes but 1073741824 .*float32 elements need 4294967296",
    ):
        PytorchWeights(path)


# -- 5. local header and CRC --------------------------------------------------------------


def _patch(path, offset, new):
    data = bytearray(path.read_bytes())
    data[offset : offset + len(new)] = new
    path.write_bytes(bytes(data))


def _entry(path, name):
    with zipfile.ZipFile(path) as zf:
        return zf.getinfo(name)


def test_local_header_that_shifts_stored_data_is_caught_by_crc(tmp_path):
    # Entry '0' holds 5 floats; the pickle uses 4. Growing the local header's extra length
    # by 4 shifts the data by one float: maxfx used to return [2, 3, 4, 5] silently.
    values = np.arange(1, 6, dtype=np.float32)
    body = p_state_dict({"w": p_tensor(p_storage("0", 4), 0, (4,), (1,))})
    path = write_zip(tmp_path / "shift.bin", pickled(body), {"0": values})
    info = _entry(path, "archive/data/0")
    _patch(path, info.header_offset + 28, struct.pack("<H", 4))
    with zipfile.ZipFile(path) as zf, pytest.raises(zipfile.BadZipFile, match="CRC"):
        zf.read("archive/data/0")  # the reference reader refuses it too
    weights = PytorchWeights(path)
    with pytest.raises(pt.CorruptCheckpointError, match=r"shift\.bin.*archive/data/0.*CRC-32"):
        weights.w.data()


@pytest.mark.parametrize("compress", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"])
def test_flipped_storage_byte_is_caught_by_crc(tmp_path, compress):
    values = np.arange(64, dtype=np.float32)
    path = one_tensor_bin(tmp_path / "flip.bin", values, compress)
    info = _entry(path, "archive/data/0")
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
    at = info.header_offset + 30 + name_len + extra_len + info.compress_size // 2
    _patch(path, at, bytes([path.read_bytes()[at] ^ 0x10]))
    with pytest.raises(pt.CorruptCheckpointError, match=r"flip\.bin.*archive/data/0"):
        PytorchWeights(path).w.data()


def test_local_header_name_must_match_the_central_directory(tmp_path):
    values = np.arange(4, dtype=np.float32)
    body = p_state_dict(
        {"w": p_tensor(p_storage("0", 4), 0, (4,), (1,)), "v": p_tensor(p_storage("1", 4), 0, (4,), (1,))}
    )
    path = write_zip(tmp_path / "names.bin", pickled(body), {"0": values, "1": values + 1})
    info = _entry(path, "archive/data/0")
    _patch(path, info.header_offset + 30, b"archive/data/1")  # the local header now claims the other entry
    with pytest.raises(
        pt.CorruptCheckpointError, match=r"names\.bin.*local header.*archive/data/1.*central directory.*archive/data/0"
    ):
        PytorchWeights(path)


def _central_header(path, name):
    """Offset of ``name``'s central directory record: its 46 fixed bytes precede the name's last occurrence."""
    return path.read_bytes().rindex(name.encode()) - 46


@pytest.mark.parametrize("where", ["central", "local"])
def test_entry_name_flagged_utf8_that_is_not_is_a_typed_error(tmp_path, where):
    # Found by tests/reliability/test_fuzz_weights.py: zipfile decodes names flagged UTF-8 (bit 11)
    # itself and raised a bare UnicodeDecodeError from the central directory or data.pkl's local header.
    path = one_tensor_bin(tmp_path / "utf8.bin", np.arange(4, dtype=np.float32))
    header = (
        _entry(path, "archive/data.pkl").header_offset
        if where == "local"
        else _central_header(path, "archive/data.pkl")
    )
    flags_at, name_at = (header + 6, header + 30) if where == "local" else (header + 8, header + 46)
    _patch(path, flags_at, struct.pack("<H", 0x800))
    _patch(path, name_at, b"\xff")
    with pytest.raises(pt.CorruptCheckpointError, match=r"utf8\.bin.*(not valid UTF-8|is corrupt.*utf-8)"):
        PytorchWeights(path)


# -- 9. deep nesting -----------------------------------------------------------------------


def test_deeply_nested_state_dict_is_a_typed_error(tmp_path):
    depth = max(sys.getrecursionlimit(), 1000) * 2
    body = b"}" + (p_str("k") + b"}") * depth + b"s" * depth
    path = write_zip(tmp_path / "deep.bin", pickled(body), {})
    with pytest.raises(pt.CorruptCheckpointError, match=r"deep\.bin.*nests deeper than"):
        PytorchWeights(path)


# -- no payload ever runs ------------------------------------------------------------------


def _hostile_pickles(marker):
    touch = p_str(f"touch {marker}")
    write = p_str(f"open({str(marker)!r}, 'w')")
    proto4 = b"\x80\x04\x8c\x05posix\x94\x8c\x06system\x94\x93" + touch + b"\x85R."  # STACK_GLOBAL
    return {
        "os.system": b"\x80\x02cos\nsystem\n" + touch + b"\x85R.",
        "builtins.exec": b"\x80\x02cbuiltins\nexec\n" + write + b"\x85R.",
        "posix.system/stack-global": proto4,
        "subprocess.call/INST": b"((" + p_str("touch") + p_str(str(marker)) + b"lisubprocess\ncall\n.",
        "builtins.eval/OBJ": b"\x80\x02(cbuiltins\neval\n" + write + b"o.",
        # A first BUILD puts an allowed callable in the instance dict, where a second BUILD would look up __setstate__.
        "BUILD __setstate__ on OrderedDict": pickled(
            b"ccollections\nOrderedDict\n)R"
            + p_state_dict({"__setstate__": b"ctorch._utils\n_rebuild_parameter\n"})
            + b"b"
            + write
            + b"b"
        ),
        "BUILD __setstate__ with exec": pickled(
            b"ccollections\nOrderedDict\n)R"
            + p_state_dict({"__setstate__": b"cbuiltins\nexec\n"})
            + b"b"
            + write
            + b"b"
        ),
        "BUILD __call__ on a rebuild function": pickled(
            b"ctorch._utils\n_rebuild_tensor_v2\n"
            + b"N"
            + p_state_dict({"__call__": b"cos\nsystem\n"})
            + b"\x86b"
            + touch
            + b"\x85R"
        ),
        "REDUCE on a storage type": pickled(b"ctorch\nFloatStorage\n" + touch + b"\x85R"),
        "REDUCE on a dtype marker": pickled(b"ctorch\nfloat32\n" + touch + b"\x85R"),
    }


@pytest.mark.parametrize("name", list(_hostile_pickles("m")))
def test_hostile_pickle_never_runs_its_payload(tmp_path, name):
    marker = tmp_path / "pwned"
    path = write_zip(tmp_path / "hostile.bin", _hostile_pickles(marker)[name], {})
    for load in (PytorchWeights, lambda p: load_weights([p])):
        with pytest.raises((pickle.UnpicklingError, ValueError), match=r"hostile\.bin"):
            load(path)
    assert not marker.exists()
