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


def _parse_type(text):
    from jax._src.lib.mlir import ir

    from lowering.mlir_interop import _Scope

    with _Scope():
        return ir.Type.parse(text)


def test_tensor_types():
    t = TensorType(DType.float32, ["batch", 3])
    m = t.to_mlir()
    assert str(m) == 'tensor<?x3xf32, {dims = ["batch", 3]}>'
    assert Type.from_mlir(m) == t
    assert Type.from_mlir(_parse_type(str(m))) == t  # the printed form carries everything
    assert str(TensorType(DType.uint8, [4]).to_mlir()) == "tensor<4xui8>"
    assert str(TensorType(DType.bool, [2, 2]).to_mlir()) == "tensor<2x2xi1>"
    assert str(TensorType(DType.float8_e4m3fn, [1]).to_mlir()) == "tensor<1xf8E4M3FN>"


@pytest.mark.parametrize(
    "t",
    [
        TensorType(DType.float32, [2, 3]),
        TensorType(DType.bfloat16, ["batch", "seq", 64]),
        TensorType(DType.int64, [Dim("n") * 2 + 1]),
        TensorType(DType.uint16, []),
        TensorType(DType.float16, ["batch", 8], device=DeviceRef.GPU(1)),
        BufferType(DType.bfloat16, [2]),
        BufferType(DType.int32, ["n"], device=DeviceRef.GPU(0)),
    ],
    ids=repr,
)
def test_type_round_trip(t):
    back = Type.from_mlir(t.to_mlir())
    assert back == t and type(back) is type(t)


def test_same_mlir_shape_different_names_stay_apart():
    a, b = TensorType(DType.float32, ["batch", 3]), TensorType(DType.float32, ["seq", 3])
    ma, mb = a.to_mlir(), b.to_mlir()
    assert Type.from_mlir(ma) == a and Type.from_mlir(mb) == b


def test_types_made_elsewhere():
    assert Type.from_mlir(_parse_type("tensor<?x4x?xui32>")) == TensorType(DType.uint32, ["d0", 4, "d2"])
    assert Type.from_mlir(_parse_type('tensor<2xf32, "not ours">')) == TensorType(DType.float32, [2])
    with pytest.raises(ValueError, match="ranked tensor"):
        Type.from_mlir(_parse_type("tensor<*xf32>"))
    with pytest.raises(ValueError, match="no MAX DType"):
        Type.from_mlir(_parse_type("tensor<2xcomplex<f32>>"))


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_every_dtype_has_an_element_type(dtype):
    t = TensorType(dtype, [2])
    assert Type.from_mlir(t.to_mlir()) == t


def test_device_and_layouts():
    assert DeviceRef.from_mlir(DeviceRef.GPU(1).to_mlir()) == DeviceRef.GPU(1)
    assert ConvInputLayout.from_mlir(ConvInputLayout.NCHW.to_mlir()) is ConvInputLayout.NCHW
    assert FilterLayout.from_mlir(FilterLayout.FCRS.to_mlir()) is FilterLayout.FCRS


def test_bad_dim_text_is_rejected():
    from lowering.mlir_interop import string_attr

    with pytest.raises(ValueError):
        Dim.from_mlir(string_attr("__import__('os')"))
