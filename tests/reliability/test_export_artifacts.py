"""Damaged and hostile export artifacts (issue 19 items 4 and 9, the artifact parts).

`maxfx.load_exported` must refuse a damaged artifact with `ArtifactError`
naming the artifact and the part at load time (never a raw JAX/numpy error, never
an error at the first call), or load it and give the unmutated output. No format
field is a pickle, so a hostile artifact cannot run Python code: the marker
tests hand it pickles that would create a file. A weight entry that would
inflate is refused from its zip header before anything is inflated.

The mutated artifacts come from one small export (a Linear and a captured
scale Tensor, symbolic batch) by zipfile rewrites, truncations and byte flips
with a fixed seed; the reference output is numpy's.
"""

import dataclasses
import io
import json
import pickle
import random
import time
import tracemalloc
import zipfile

import jax
import numpy as np
import pytest

import maxfx
from maxfx._artifact import ArtifactError
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Linear
from maxfx.experimental.tensor import Tensor
from maxfx.graph import TensorType

X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


@pytest.fixture(scope="module")
def artifact():
    """The artifact's bytes and numpy's output for ``X``."""
    layer = Linear(4, 3)
    scale = Tensor(np.array([1.0, -2.0, 0.5], np.float32))

    def head(x):
        return F.relu(layer(x)) * scale

    data = maxfx.export(head, TensorType(DType.float32, ["batch", 4])).serialize()
    params = {n: t.to_numpy() for n, t in layer.parameters}
    want = np.maximum(X @ params["weight"].T + params["bias"], 0) * [1.0, -2.0, 0.5]
    return data, want


def _rewrite(data, edit, compression=zipfile.ZIP_STORED):
    """The artifact with each entry's bytes replaced by ``edit(name, content)`` (None drops it)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w", compression) as dst:
        for name in src.namelist():
            content = edit(name, src.read(name))
            if content is not None:
                dst.writestr(name, content)
    return buf.getvalue()


def _edit_meta(data, change):
    def edit(name, content):
        if name != "maxfx_export.json":
            return content
        meta = json.loads(content)
        change(meta)
        return json.dumps(meta)

    return _rewrite(data, edit)


def _loads_equal_or_refused(data, want):
    """'refused' (ArtifactError at load) or 'equal' (loads and gives ``want``); anything else fails."""
    try:
        loaded = maxfx.load_exported(data)
    except ArtifactError as e:
        assert str(e).startswith("load_exported(<bytes>): "), e
        return "refused"
    np.testing.assert_allclose(loaded(X).to_numpy(), want, rtol=1e-5, atol=1e-6)
    return "equal"


# ─── damaged metadata and entries: a typed error naming what is wrong ───────


def _set(key, value):
    return lambda meta: meta.__setitem__(key, value)


def _weight(i, key, value):
    return lambda meta: meta["weights"][i].__setitem__(key, value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.pop("name"), "'name' must be a string, got None"),
        (_set("format", "something.else"), "does not name the format 'maxfx.export'"),
        (_set("version", "2"), "format version '2' is not an integer"),
        (_set("version", 3), r"newer maxfx \(format version 3\)"),
        (_set("weights", {}), "'weights' must be a list"),
        (lambda m: m["weights"].pop(), r"the program takes .*, not \(inputs, 2 weights\)"),
        (
            _weight(0, "shape", [8]),
            r"weight 0 \('layer.bias'\) is float32\[8\] in the metadata but float32\[3\] in the program",
        ),
        (_weight(0, "shape", [2**29]), r"weight 0 .* is float32\[536870912\] in the metadata"),
        (_weight(0, "shape", [-3]), r"the shape \[-3\] must be a list of sizes >= 0"),
        (_weight(0, "dtype", "float64"), r"is float64\[3\] in the metadata but float32\[3\] in the program"),
        (_weight(0, "dtype", "not_a_dtype"), "unknown dtype 'not_a_dtype'"),
        (_weight(1, "name", "layer.bias"), "the name 'layer.bias' must be a string not used by another weight"),
        (
            _set("mesh", {"axis_names": ["x"], "axis_sizes": [0], "axis_types": ["Auto"]}),
            r"mesh axis_sizes \[0\] must be one size >= 1",
        ),
    ],
    ids=[
        "no-name",
        "format",
        "version-str",
        "version-newer",
        "weights-dict",
        "weight-missing",
        "shape",
        "shape-huge",
        "shape-negative",
        "dtype",
        "dtype-unknown",
        "duplicate-name",
        "mesh",
    ],
)
def test_metadata_edits_are_refused_at_load(artifact, change, message):
    with pytest.raises(ArtifactError, match=message):
        maxfx.load_exported(_edit_meta(artifact[0], change))


def test_renamed_weights_are_labels_only(artifact):
    # Weights are the program's arguments in stored order; swapping names changes no value.
    def swap(meta):
        meta["weights"][0]["name"], meta["weights"][1]["name"] = meta["weights"][1]["name"], meta["weights"][0]["name"]

    assert _loads_equal_or_refused(_edit_meta(artifact[0], swap), artifact[1]) == "equal"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda n, c: c[:7] if n == "weights/0.bin" else c, r"the entry 'weights/0.bin' holds 7 bytes, expected 12"),
        (lambda n, c: None if n == "weights/2.bin" else c, r"the entry 'weights/2.bin' is missing"),
        (lambda n, c: None if n == "program.jaxexport" else c, r"the entry 'program.jaxexport' is missing"),
        (lambda n, c: b"\x00" * 64 if n == "program.jaxexport" else c, r"program.jaxexport cannot be deserialized"),
        (
            lambda n, c: b"[" * 100_000 if n == "maxfx_export.json" else c,
            r"maxfx_export.json is not valid JSON \(RecursionError",
        ),
        (lambda n, c: b"\xff\xfe" if n == "maxfx_export.json" else c, r"maxfx_export.json is not valid JSON"),
        (lambda n, c: b"[1, 2]" if n == "maxfx_export.json" else c, r"does not name the format"),
    ],
    ids=[
        "weight-truncated",
        "weight-missing",
        "program-missing",
        "program-garbage",
        "json-deep",
        "json-bytes",
        "json-list",
    ],
)
def test_damaged_entries_are_refused_at_load(artifact, edit, message):
    with pytest.raises(ArtifactError, match=message):
        maxfx.load_exported(_rewrite(artifact[0], edit))


def test_a_program_whose_stablehlo_is_damaged_is_refused_at_load(artifact):
    def damage(name, content):
        if name != "program.jaxexport":
            return content
        program = jax.export.deserialize(bytearray(content))
        return bytes(dataclasses.replace(program, mlir_module_serialized=b"ML\xefR" + b"\x00" * 40).serialize())

    with pytest.raises(ArtifactError, match=r"the StableHLO in program.jaxexport cannot be parsed"):
        maxfx.load_exported(_rewrite(artifact[0], damage))


def test_error_names_the_file(artifact, tmp_path):
    path = tmp_path / "model.maxfx"
    path.write_bytes(artifact[0][:-30])
    with pytest.raises(
        ArtifactError, match=f"load_exported\\('{path}'\\): not a maxfx export artifact, or a damaged one"
    ):
        maxfx.load_exported(path)


# ─── fuzz: truncations and byte flips ────────────────────────────────────────


def test_truncations_and_byte_flips_are_refused_or_equal(artifact):
    data, want = artifact
    rng = random.Random(19)
    mutants = [data[: rng.randrange(len(data))] for _ in range(30)]
    for _ in range(100):
        flipped = bytearray(data)
        flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        mutants.append(bytes(flipped))
    start = time.monotonic()
    outcomes = [_loads_equal_or_refused(m, want) for m in mutants]
    assert time.monotonic() - start < 60
    assert outcomes.count("refused") >= 100, outcomes.count("equal")  # flips in zip bookkeeping may be harmless


# ─── bounded reads: no inflating, no allocation the file cannot back ───────


def _bomb(data, weight_shape=None):
    """``data`` with ``weights/1.bin`` a deflate bomb: 256 MiB of zeros in 256 KB (2 GiB in 2 MB is the same bomb, 8x
    slower to build).
    """
    bomb = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as src,
        zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst,
    ):
        for name in src.namelist():
            content = src.read(name)
            if name == "weights/1.bin":
                with dst.open(name, "w", force_zip64=True) as f:
                    for _ in range(16):
                        f.write(bytes(16 << 20))
                continue
            if name == "maxfx_export.json" and weight_shape:  # the metadata claims the bomb's size
                meta = json.loads(content)
                meta["weights"][1]["shape"] = weight_shape
                content = json.dumps(meta)
            dst.writestr(name, content, compress_type=zipfile.ZIP_STORED)
    assert len(bomb.getvalue()) < 1 << 20
    return bomb.getvalue()


@pytest.mark.parametrize("weight_shape", [None, [2**24, 4]], ids=["shape-as-exported", "shape-of-the-bomb"])
def test_a_deflate_bomb_weight_is_refused_before_inflating(artifact, weight_shape):
    data = _bomb(artifact[0], weight_shape)
    tracemalloc.start()
    try:
        with pytest.raises(
            ArtifactError,
            match=r"the entry 'weights/1.bin' is compressed|weight 1 .* is float32\[16777216, 4\] in the metadata but",
        ):
            maxfx.load_exported(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # nothing near the 256 MiB was inflated


# ─── hostile artifacts run no Python code ──────────────────────────────────


class _Touch:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("entry", ["maxfx_export.json", "program.jaxexport", "weights/0.bin", "data.pkl"])
def test_a_pickle_anywhere_never_runs(artifact, tmp_path, entry):
    marker = tmp_path / "marker"
    payload = pickle.dumps(_Touch(marker))

    def plant(name, content):
        return payload if name == entry else content

    data = _rewrite(artifact[0], plant)
    if entry == "data.pkl":  # an extra entry: the artifact loads, runs and ignores it
        buf = io.BytesIO(artifact[0])
        with zipfile.ZipFile(buf, "a") as z:
            z.writestr(entry, payload)
        data = buf.getvalue()
    try:
        maxfx.load_exported(data)(X)
    except ArtifactError:
        pass
    assert not marker.exists()
