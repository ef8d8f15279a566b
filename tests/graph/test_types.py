"""TensorType/BufferType/DeviceRef reprs and equality, DType promotion rules."""

import pytest

from lowering.dtypes import promote_strong, promote_weak
from maxfx.dtype import DType
from maxfx.graph import BufferType, DeviceKind, DeviceRef, TensorType


def test_tensor_type_repr_matches_the_guide():
    t = TensorType(DType.float32, shape=[5], device=DeviceRef.CPU())
    assert repr(t) == "TensorType(dtype=float32, shape=[Dim(5)], device=cpu:0)"
    assert (
        repr(TensorType(DType.float32, ["batch", 3]))
        == "TensorType(dtype=float32, shape=[Dim('batch'), Dim(3)], device=cpu:0)"
    )


def test_tensor_type_defaults_and_equality():
    a = TensorType(DType.int32, (2, 3))
    assert a.device == DeviceRef.CPU()
    assert a == TensorType(DType.int32, [2, 3], DeviceRef.CPU())
    assert a != TensorType(DType.int32, [2, 3], DeviceRef.GPU())
    assert hash(a) == hash(TensorType(DType.int32, [2, 3]))
    assert a.shape == [2, 3] and a.rank == 2
    assert a.as_buffer() == BufferType(DType.int32, [2, 3]) and a.as_buffer().as_tensor() == a


def test_tensor_type_rejects_bad_dtype():
    with pytest.raises(TypeError, match="dtype"):
        TensorType("float32", [2])


def test_device_ref():
    assert str(DeviceRef.GPU()) == "gpu:0"
    assert str(DeviceRef.CPU(id=1)) == "cpu:1"
    assert DeviceRef("gpu", 1) == DeviceRef.GPU(1)
    assert DeviceRef.GPU().is_gpu() and DeviceRef.CPU().is_cpu()
    assert DeviceKind.from_string("GPU") is DeviceKind.GPU
    assert DeviceRef.from_device(DeviceRef.CPU()) == DeviceRef.CPU()


@pytest.mark.parametrize(
    "a,b,out",
    [
        (DType.float16, DType.float32, DType.float32),
        (DType.bool, DType.int32, DType.int32),
        (DType.uint8, DType.int16, DType.int16),
        (DType.int8, DType.float16, DType.float16),
        (DType.int16, DType.float32, DType.float32),
        (DType.int32, DType.float64, DType.float64),
        (DType.bfloat16, DType.float32, DType.float32),
    ],
)
def test_promotion_of_typed_operands(a, b, out):
    assert promote_strong(a, b) is out and promote_strong(b, a) is out


@pytest.mark.parametrize(
    "a,b",
    [
        (DType.int32, DType.float32),
        (DType.uint8, DType.int8),
        (DType.bfloat16, DType.float16),
        (DType.int64, DType.float32),
    ],
)
def test_lossy_promotion_is_an_error(a, b):
    with pytest.raises(ValueError, match="Unsafe cast"):
        promote_strong(a, b)


def test_python_scalars_take_the_tensor_dtype():
    assert promote_weak(DType.float16, 0.1) is DType.float16
    assert promote_weak(DType.int32, 7) is DType.int32
    with pytest.raises(ValueError, match="python float"):
        promote_weak(DType.int32, 1.5)
    with pytest.raises(ValueError):
        promote_weak(DType.uint8, 300)
    with pytest.raises(ValueError):
        promote_weak(DType.int8, -129)


def test_shaped_type_utilities_follow_max():
    """MAX's _TensorTypeBase: num_elements (RuntimeError when symbolic), parameters, cast keeping the kind."""
    assert TensorType(DType.int8, [2, 3, 4]).num_elements() == 24
    assert TensorType(DType.int8, []).num_elements() == 1
    with pytest.raises(RuntimeError, match="symbolic dims"):
        TensorType(DType.int8, ["batch", 3]).num_elements()
    assert [d.name for d in TensorType(DType.float32, ["batch", "seq", 3]).parameters] == ["batch", "seq"]
    assert BufferType(DType.float32, [2]).cast(DType.int32) == BufferType(DType.int32, [2])
    assert TensorType(DType.float32, ["n"]).cast(DType.bfloat16) == TensorType(DType.bfloat16, ["n"])
