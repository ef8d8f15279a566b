"""maxfx.dtype.DType: members, sizes, predicates and numpy/torch conversions (API_INVENTORY §4.1)."""

import importlib.util

import ml_dtypes
import numpy as np
import pytest

import maxfx.dtype
from maxfx.dtype import DType

# Documented enum values (API_INVENTORY §4.1 "members").
MEMBERS = {
    "bfloat16": 80, "bool": 1, "float16": 79, "float32": 81, "float4_e2m1fn": 64, "float64": 82,
    "float8_e8m0fnu": 73,  # MAX 26.7's value (API_INVENTORY); MAX's own tests use it
    "float8_e4m3fn": 75, "float8_e4m3fnuz": 76, "float8_e5m2": 77, "float8_e5m2fnuz": 78,
    "int16": 137, "int32": 139, "int64": 141, "int8": 135,
    "uint16": 136, "uint32": 138, "uint64": 140, "uint8": 134,
}  # fmt: skip

NUMPY = {
    DType.bool: np.bool_, DType.float16: np.float16, DType.float32: np.float32, DType.float64: np.float64,
    DType.bfloat16: ml_dtypes.bfloat16, DType.float4_e2m1fn: ml_dtypes.float4_e2m1fn,
    DType.float8_e4m3fn: ml_dtypes.float8_e4m3fn, DType.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    DType.float8_e5m2: ml_dtypes.float8_e5m2, DType.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
    DType.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
    DType.int8: np.int8, DType.int16: np.int16, DType.int32: np.int32, DType.int64: np.int64,
    DType.uint8: np.uint8, DType.uint16: np.uint16, DType.uint32: np.uint32, DType.uint64: np.uint64,
}  # fmt: skip


def test_module_exports_the_lowering_enum():
    from lowering.dtypes import DType as LoweringDType

    assert maxfx.dtype.DType is LoweringDType
    assert maxfx.dtype.__all__ == ["DType", "finfo"]  # MAX 26: max.dtype.finfo


def test_members_and_values_match_the_docs():
    assert {d.name: d.value for d in DType} == MEMBERS
    assert DType(81) is DType.float32


@pytest.mark.parametrize("d", list(DType), ids=lambda d: d.name)
def test_str_and_repr(d):
    assert str(d) == f"DType.{d.name}"
    assert f"{d}" == f"DType.{d.name}"
    assert repr(d) == f"<DType.{d.name}: {d.value}>"


@pytest.mark.parametrize("d", list(DType), ids=lambda d: d.name)
def test_sizes_follow_numpy(d):
    expected_bits = 4 if d is DType.float4_e2m1fn else np.dtype(NUMPY[d]).itemsize * 8
    assert d.size_in_bits == expected_bits
    assert d.size_in_bytes == max(1, expected_bits // 8)
    assert d.align == d.size_in_bytes


def test_documented_sizes():
    assert DType.float4_e2m1fn.size_in_bits == 4
    assert DType.bool.size_in_bits == 8
    assert DType.bfloat16.align == 2
    assert DType.float64.size_in_bytes == 8


def test_predicates():
    floats = {d for d in DType if d.name.startswith(("float", "bfloat"))}
    signed = {DType.int8, DType.int16, DType.int32, DType.int64}
    unsigned = {DType.uint8, DType.uint16, DType.uint32, DType.uint64}
    for d in DType:
        assert d.is_float() == (d in floats), d
        assert d.is_float8() == d.name.startswith("float8_"), d
        assert d.is_half() == (d in (DType.float16, DType.bfloat16)), d
        assert d.is_signed_integral() == (d in signed), d
        assert d.is_unsigned_integral() == (d in unsigned), d
        assert d.is_integral() == (d in signed | unsigned), d
    assert not DType.bool.is_integral() and not DType.bool.is_float()
    assert sum(d.is_float8() for d in DType) == 5


@pytest.mark.parametrize("d", list(DType), ids=lambda d: d.name)
def test_numpy_round_trip(d):
    np_dtype = d.to_numpy()
    assert isinstance(np_dtype, np.dtype)
    assert np_dtype == np.dtype(NUMPY[d])
    assert DType.from_numpy(np_dtype) is d
    assert DType.from_numpy(NUMPY[d]) is d  # scalar types are accepted too


def test_bfloat16_uses_ml_dtypes():
    assert DType.bfloat16.to_numpy() == np.dtype(ml_dtypes.bfloat16)
    arr = np.array([1.5, -2.0], dtype=DType.bfloat16.to_numpy())
    assert DType.from_numpy(arr.dtype) is DType.bfloat16


def test_from_numpy_accepts_aliases_and_strings():
    assert DType.from_numpy("float32") is DType.float32
    assert DType.from_numpy(np.dtype("longlong")) is DType.int64
    assert DType.from_numpy(np.intc) is DType.int32


@pytest.mark.parametrize("bad", [np.complex64, np.dtype("complex128"), object, np.dtype(">f4"), "U8", "not-a-dtype"])
def test_from_numpy_rejects_unsupported(bad):
    with pytest.raises(ValueError, match="from_numpy"):
        DType.from_numpy(bad)


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_torch_conversions_need_torch():
    with pytest.raises(ImportError, match="torch"):
        DType.float32.to_torch()
    with pytest.raises(ImportError, match="torch"):
        DType.from_torch("torch.float32")
    sentinel = RuntimeError("no torch here")
    with pytest.raises(RuntimeError, match="no torch here"):
        DType.float32.to_torch(sentinel)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_round_trip():
    import torch

    for d in (DType.float32, DType.bfloat16, DType.int64, DType.bool, DType.uint8):
        assert DType.from_torch(d.to_torch()) is d
    assert d.to_torch() == torch.uint8
