"""`WeightData`: one checkpoint tensor with its name, dtype, shape and encoding.

Example:
    >>> import numpy as np
    >>> from maxfx.dtype import DType
    >>> wd = WeightData.from_numpy(np.ones((2, 3), np.float32), "w")
    >>> wd
    WeightData(name='w', dtype=DType.float32, shape=[2, 3])
    >>> wd.astype(DType.float16).to_numpy().dtype
    dtype('float16')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.dims import Shape, StaticDim
from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding

__all__ = ["WeightData"]


def as_numpy(data: Any) -> np.ndarray:
    """A numpy view of a numpy array, DLPack array or array-like (no copy when possible)."""
    if isinstance(data, np.ndarray):
        return data
    if hasattr(data, "__dlpack__"):
        try:
            return np.from_dlpack(data)
        except (BufferError, TypeError, RuntimeError):
            pass  # e.g. a device array: fall back to a host copy
    return np.asarray(data)


@dataclass(eq=False, repr=False)
class WeightData:
    """A weight tensor (a DLPack array, numpy for the file loaders) plus metadata.

    Quantized weights hold their packed bytes: ``dtype`` is uint8, ``shape`` is
    ``[rows, bytes_per_row]`` and ``quantization_encoding`` names the block format.

    Attributes:
        data: the tensor as a DLPack array.
        name: hierarchical name (``"model.layers.0.weight"``).
        dtype: element type of ``data``.
        shape: shape of ``data``.
        quantization_encoding: block format of packed weights, else None.
    """

    data: Any
    name: str
    dtype: DType
    shape: Shape
    quantization_encoding: QuantizationEncoding | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, DType):
            raise TypeError(f"WeightData {self.name!r}: dtype must be a DType, got {type(self.dtype).__name__}")
        if not isinstance(self.shape, Shape):
            self.shape = Shape(self.shape)

    @classmethod
    def from_numpy(cls, arr: np.ndarray, name: str) -> WeightData:
        """WeightData for ``arr`` (dtype and shape taken from the array).

        Raises:
            ValueError: numpy's dtype has no MAX `DType` (complex, object, ...).
        """
        arr = np.asarray(arr)
        return cls(arr, name, DType.from_numpy(arr.dtype), Shape(arr.shape))

    def astype(self, dtype: DType) -> WeightData:
        """A new WeightData whose values are converted to ``dtype`` (a real conversion, not a view).

        bfloat16 and float8 conversions use ``ml_dtypes`` (round to nearest even).

        Raises:
            ValueError: the weight is quantized (its bytes are blocks, not values:
                allocate it with a float dtype from `GGUFWeights` to dequantize).
        """
        if not isinstance(dtype, DType):
            raise TypeError(f"WeightData.astype({self.name!r}): expected a DType, got {type(dtype).__name__}")
        if self.quantization_encoding is not None:
            raise ValueError(
                f"WeightData.astype({self.name!r}): the weight holds {self.quantization_encoding.value} blocks as "
                "uint8; "
                "converting the bytes would not dequantize them"
            )
        converted = self.to_numpy().astype(dtype.to_numpy())
        return WeightData(converted, self.name, dtype, Shape(self.shape), None)

    def to_numpy(self) -> np.ndarray:
        """The data as a numpy array (a view when the data is already on the host)."""
        return as_numpy(self.data)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.to_numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    # Export the underlying array itself, so device arrays stay on their device.
    def _exportable(self) -> Any:
        return self.data if hasattr(self.data, "__dlpack__") else np.asarray(self.data)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._exportable().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._exportable().__dlpack_device__()

    def __repr__(self) -> str:
        enc = f", quantization_encoding={self.quantization_encoding}" if self.quantization_encoding is not None else ""
        return (
            f"WeightData(name={self.name!r}, dtype={self.dtype}, "
            f"shape={[int(d) if isinstance(d, StaticDim) else str(d) for d in self.shape]}{enc})"
        )
