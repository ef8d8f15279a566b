"""`GGUFWeights`: llama.cpp GGUF checkpoints through the ``gguf`` package.

What a tensor looks like here:

- Float and integer tensors: numpy arrays in row-major (Hugging Face) order.
  GGUF lists dims innermost first (``ne``), so a Linear ``[out, in]`` that
  ``GGUFReader`` reports as ``(in, out)`` comes back as ``[out, in]``.
- Q4_0, Q4_K, Q5_K, Q6_K (MAX's `QuantizationEncoding`\\ s): kept packed, uint8
  ``[rows, row_bytes]`` with the encoding; the allocated `Weight` records the
  logical float32 shape in ``original_dtype_and_shape``.
- Every other block format (Q8_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, ...; MAX has no
  encoding for them): dequantized to float32 on first use (with
  ``gguf.quants.dequantize``), encoding None. ``raw_tensor()`` or
  ``allocate(dtype=DType.uint8)`` give the packed bytes instead.

Names are the file's own (``blk.0.attn_q.weight``); llama.cpp's Q/K row
permutation is left in place (it is a model-level concern).

Before ``gguf.GGUFReader`` sees a file, `maxfx._gguf_header.scan_header` checks its
header with bounded reads, as llama.cpp does (see there).

Example:
    >>> weights = GGUFWeights("model-q4_0.gguf")  # doctest: +SKIP
    >>> weights.blk[0].attn_q.weight.data().quantization_encoding  # doctest: +SKIP
    QuantizationEncoding.Q4_0
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx._gguf_header import open_reader, scan_header
from maxfx.graph.weights._protocol import CheckpointWeights, TensorInfo, TensorSource, _info

__all__ = ["GGUFWeights"]


def _gguf():
    try:
        import gguf  # noqa: PLC0415 - optional at import time of maxfx.graph.weights
    except ImportError as e:
        raise ImportError("GGUFWeights needs the 'gguf' package (pip install gguf)") from e
    return gguf


def _type_tables(gguf: Any) -> tuple[dict[Any, DType], dict[Any, QuantizationEncoding]]:
    q = gguf.GGMLQuantizationType
    plain = {
        q.F32: DType.float32,
        q.F16: DType.float16,
        q.BF16: DType.bfloat16,
        q.F64: DType.float64,
        q.I8: DType.int8,
        q.I16: DType.int16,
        q.I32: DType.int32,
        q.I64: DType.int64,
    }
    packed = {
        q.Q4_0: QuantizationEncoding.Q4_0,
        q.Q4_K: QuantizationEncoding.Q4_K,
        q.Q5_K: QuantizationEncoding.Q5_K,
        q.Q6_K: QuantizationEncoding.Q6_K,
    }
    return plain, packed


class _GGUFSource(TensorSource):
    kind = "GGUF file"

    def __init__(self, reader: Any, tensors: dict[str, Any], label: str):
        super().__init__(label)
        self._gguf = _gguf()
        self._reader = reader
        self._tensors = tensors
        self._plain, self._packed = _type_tables(self._gguf)
        self._dequantized: dict[str, np.ndarray] = {}

    def names(self) -> Sequence[str]:
        return list(self._tensors)

    def _logical_shape(self, tensor: Any) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(tensor.shape.tolist()))

    def info(self, name: str) -> TensorInfo:
        t = self._tensors[name]
        shape = self._logical_shape(t)
        qtype = t.tensor_type
        if qtype in self._plain:
            dtype = self._plain[qtype]
            return TensorInfo(dtype, shape, dtype, shape, None, int(t.n_bytes), qtype.name)
        if qtype in self._packed:
            byte_shape = tuple(int(d) for d in self._gguf.quant_shape_to_byte_shape(shape, qtype))
            return TensorInfo(
                DType.uint8, byte_shape, DType.float32, shape, self._packed[qtype], int(t.n_bytes), qtype.name
            )
        return TensorInfo(DType.float32, shape, DType.float32, shape, None, math.prod(shape) * 4, qtype.name)

    def read(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        qtype = t.tensor_type
        if qtype is self._gguf.GGMLQuantizationType.BF16:
            return t.data.view(DType.bfloat16.to_numpy()).reshape(self._logical_shape(t))
        if qtype in self._plain or qtype in self._packed:
            return t.data
        cached = self._dequantized.get(name)
        if cached is None:
            cached = self._dequantized[name] = self._dequantize(name)
        return cached

    def read_packed(self, name: str) -> np.ndarray:
        """The bytes as stored: uint8 ``[rows, row_bytes]`` for block formats."""
        t = self._tensors[name]
        return t.data if t.data.dtype == np.uint8 else t.data.view(np.uint8)

    def _dequantize(self, name: str) -> np.ndarray:
        t = self._tensors[name]
        try:
            values = self._gguf.quants.dequantize(self.read_packed(name), t.tensor_type)
        except NotImplementedError:
            raise ValueError(
                f"{self.label}: tensor {name!r} is {t.tensor_type.name}, which the gguf package cannot dequantize"
            ) from None
        return np.asarray(values, np.float32).reshape(self._logical_shape(t))

    def convert(self, name: str, dtype: DType) -> np.ndarray:
        t = self._tensors[name]
        qtype = t.tensor_type
        if qtype in self._plain:
            return super().convert(name, dtype)
        if dtype is DType.uint8 and qtype not in self._packed:
            return self.read_packed(name)
        if dtype.is_float():
            values = self._dequantize(name) if qtype in self._packed else self.read(name)
            return values.astype(dtype.to_numpy(), copy=qtype not in self._packed)
        hint = (
            "dtype=None keeps the packed blocks"
            if qtype in self._packed
            else "dtype=None gives float32, DType.uint8 the packed blocks"
        )
        raise ValueError(
            f"Weight {name!r} in {self.label}: is {qtype.name}-quantized and cannot become {dtype}; use a float dtype "
            f"to dequantize ({hint})"
        )


class GGUFWeights(CheckpointWeights):
    """Weights from a GGUF file (llama.cpp's format), memory-mapped.

    Args:
        source: path to a ``.gguf`` file, or an open ``gguf.GGUFReader``.
        tensors: name -> ``gguf.ReaderTensor`` (default: all of the file's).
        prefix: the current name or prefix.
        allocated: dict shared by a tree of accessors for allocated values.

    Raises:
        ValueError: the file is missing, truncated or not GGUF (message names the file).
        ImportError: the ``gguf`` package is not installed.
    """

    def __init__(
        self,
        source: os.PathLike[str] | str | Any,
        tensors: dict[str, Any] | None = None,
        prefix: str = "",
        allocated: dict[str, Any] | None = None,
    ) -> None:
        gguf = _gguf()
        if isinstance(source, gguf.GGUFReader):
            reader, label = source, os.fspath(getattr(source.data, "filename", None) or "<GGUFReader>")
            if os.path.isfile(label):
                scan_header(gguf, label)
        else:
            label = os.fspath(source)
            reader = open_reader(gguf, label)
        if tensors is None:
            tensors = {t.name: t for t in reader.tensors}
        self._reader = reader
        self._tensors = tensors
        self._source = _GGUFSource(reader, tensors, label)
        self._prefix = prefix
        self._allocated = {} if allocated is None else allocated

    @property
    def reader(self) -> Any:
        """The underlying ``gguf.GGUFReader`` (metadata fields, tensor types)."""
        return self._reader

    @property
    def metadata(self) -> dict[str, Any]:
        """The file's key/value metadata as Python values (``"llama.block_count": 2``, ...).

        Raises:
            ValueError: a string value is not UTF-8, as GGUF strings must be
                (names the file and key). The header check leaves values
                undecoded, like llama.cpp, so the tensors of such a file still load.
        """
        values = {}
        for key, field in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                values[key] = field.contents()
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{self._source.label}: corrupt GGUF file (key {key!r}): a string value is not UTF-8 ({e})"
                ) from None
        return values

    def raw_tensor(self) -> np.ndarray:
        """The tensor's bytes as stored (uint8 ``[rows, row_bytes]`` for block formats).

        Raises:
            KeyError: no weight has the current name.
        """
        _info(self)
        return self._source.read_packed(self._prefix)
