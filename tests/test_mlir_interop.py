"""to_mlir / from_mlir round trips through JAX's MLIR bindings."""

import pytest

from maxfx.dtype import DType
from maxfx.graph import BufferType, ConvInputLayout, DeviceRef, Dim, FilterLayout, Shape, TensorType, Type


@pytest.mark.parametrize("dim", [Dim(5), Dim("batch"), Dim("batch") * 2 + 1, Dim("a") * Dim("b")])
def test_dim_round_trip(dim):
    assert Dim.from_mlir(dim.to_mlir()) == dim


def test_static_dim_is_an_integer_attribute():
    assert str(Dim(5).to_mlir()) == "5 : i64"


def test_shape_round_trip():
    s = Shape([2, "n", Dim("n") + 1])
    assert Shape.from_mlir(s.to_mlir()) == s


def test_tensor_types():
    t = TensorType(DType.float32, ["batch", 3])
    m = t.to_mlir()
    assert str(m) == "tensor<?x3xf32>"
    assert Type.from_mlir(m) == t
    assert str(TensorType(DType.uint8, [4]).to_mlir()) == "tensor<4xui8>"
    assert str(BufferType(DType.bfloat16, [2]).to_mlir()) == "tensor<2xbf16>"


def test_device_and_layouts():
    assert DeviceRef.from_mlir(DeviceRef.GPU(1).to_mlir()) == DeviceRef.GPU(1)
    assert ConvInputLayout.from_mlir(ConvInputLayout.NCHW.to_mlir()) is ConvInputLayout.NCHW
    assert FilterLayout.from_mlir(FilterLayout.FCRS.to_mlir()) is FilterLayout.FCRS


def test_bad_dim_text_is_rejected():
    from lowering.mlir_interop import string_attr

    with pytest.raises(ValueError):
        Dim.from_mlir(string_attr("__import__('os')"))
