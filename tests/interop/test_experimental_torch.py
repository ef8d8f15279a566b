"""maxfx.experimental.torch: MAX's dtype conversions between PyTorch and MAX (torch is optional)."""

import pytest

from maxfx.dtype import DType

torch = pytest.importorskip("torch")

from maxfx.experimental.torch import max_dtype_to_torch, torch_dtype_to_max  # noqa: E402


@pytest.mark.parametrize(
    "name", ["bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64", "float8_e4m3fn"]
)
def test_round_trip_of_every_shared_dtype(name):
    assert torch_dtype_to_max(getattr(torch, name)) is DType[name]
    assert max_dtype_to_torch(DType[name]) is getattr(torch, name)


def test_unsupported_dtypes_are_value_errors():
    with pytest.raises(ValueError, match="complex64"):
        torch_dtype_to_max(torch.complex64)
    with pytest.raises(ValueError, match="MAX DType"):
        max_dtype_to_torch("float32")
