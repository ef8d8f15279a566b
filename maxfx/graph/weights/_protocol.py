"""The `Weights` protocol: hierarchical, lazy access to checkpoint tensors.

``weights.model.layers[0].wq`` names the tensor ``"model.layers.0.wq"``;
``.allocate()`` turns it into a graph `Weight` and records its value in
``allocated_weights``, the mapping ``InferenceSession.load(graph,
weights_registry=...)`` takes. Nothing is read from disk until a value is used:
the loaders hand out memory-mapped views.

Explicit subclasses of `Weights` (the loaders in this package) inherit a full
implementation built on a `TensorSource` stored in ``self._source``, the
current prefix ``self._prefix`` and the shared ``self._allocated`` dict; any
other object with the same public members also satisfies the protocol.

Example:
    >>> weights = SafetensorWeights(["model.safetensors"])  # doctest: +SKIP
    >>> w = weights.model.layers[0].mlp.up_proj.weight.allocate()  # doctest: +SKIP
    >>> w.name  # doctest: +SKIP
    'model.layers.0.mlp.up_proj.weight'
"""

from __future__ import annotations

import abc
import difflib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from lowering.dims import Shape
from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from lowering.types import DeviceRef
from maxfx.graph._weight import Weight
from maxfx.graph.weights._progress import progress_bar
from maxfx.graph.weights._weight_data import WeightData

__all__ = ["TensorInfo", "TensorSource", "Weights"]

_Self = TypeVar("_Self", bound="Weights")


@dataclass(frozen=True)
class TensorInfo:
    """What a checkpoint says about one tensor, before any data is read.

    Attributes:
        dtype, shape: as stored (uint8 ``[rows, bytes_per_row]`` for packed blocks).
        logical_dtype, logical_shape: the values they encode (equal to
            dtype/shape for plain tensors).
        quantization_encoding: the MAX block format of packed tensors, else None.
        nbytes: bytes of the stored data.
        storage_type: the file format's own name for how the tensor is stored,
            where it has one: GGUF's type (``"F32"``, ``"Q4_0"``, ``"Q8_0"``, ...),
            also for block types that are handed out dequantized (no MAX encoding).
            None for safetensors and PyTorch files.
    """

    dtype: DType
    shape: tuple[int, ...]
    logical_dtype: DType
    logical_shape: tuple[int, ...]
    quantization_encoding: QuantizationEncoding | None = None
    nbytes: int = 0
    storage_type: str | None = None


class TensorSource(abc.ABC):
    """One opened checkpoint (a file, or several shards): names, metadata, lazy reads.

    Args:
        label: how error messages name the checkpoint (usually its path).
        align: byte alignment to record on allocated `Weight`s.
    """

    kind = "checkpoint"
    """What error messages call the format (``"Safetensor checkpoint"``...)."""

    def __init__(self, label: str, align: int | None = None):
        self.label = label
        self.align = align

    @abc.abstractmethod
    def names(self) -> Sequence[str]:
        """Every tensor name, in file order."""

    @abc.abstractmethod
    def info(self, name: str) -> TensorInfo:
        """Metadata of ``name`` (KeyError if absent)."""

    @abc.abstractmethod
    def read(self, name: str) -> np.ndarray:
        """The stored tensor, as a (normally memory-mapped) numpy array."""

    def contains(self, name: str) -> bool:
        """Whether ``name`` is a tensor of this checkpoint."""
        names = self.__dict__.get("_name_set")
        if names is None:
            names = self.__dict__["_name_set"] = frozenset(self.names())
        return name in names

    def convert(self, name: str, dtype: DType) -> np.ndarray:
        """The values of ``name`` as ``dtype`` (a new array).

        The base rule converts between floating-point types only; formats with
        packed data override this to dequantize.

        Raises:
            ValueError: the conversion would reinterpret or truncate values.
        """
        info = self.info(name)
        if info.quantization_encoding is None and info.dtype.is_float() and dtype.is_float():
            return np.asarray(self.read(name)).astype(dtype.to_numpy())
        raise ValueError(
            f"Weight {name!r} in {self.label}: is {info.dtype} in the checkpoint; "
            f"converting it to {dtype} is not supported (only float-to-float conversions are; pass dtype=None to keep "
            f"{info.dtype})"
        )


def _join(prefix: str, part: str) -> str:
    return f"{prefix}.{part}" if prefix else part


def _derive[W](weights: W, prefix: str) -> W:
    # A child accessor shares the source and the allocated dict; only the prefix differs.
    child = object.__new__(type(weights))
    child.__dict__.update(weights.__dict__)
    child._prefix = prefix
    return child


def _missing_weight(weights: Any) -> KeyError:
    name: str = weights._prefix
    source: TensorSource = weights._source
    names = list(source.names())
    under = [n for n in names if n.startswith(name + ".")] if name else names
    if under:
        hint = f" It is a prefix of {len(under)} weight(s), e.g. {under[0]!r}; index further or use .items()."
    else:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return KeyError(f"{name!r} is not a weight in the {source.kind}.{hint} (checkpoint: {source.label})")


def _info(weights: Any) -> TensorInfo:
    source: TensorSource = weights._source
    if not source.contains(weights._prefix):
        raise _missing_weight(weights)
    return source.info(weights._prefix)


def _dims(shape: Iterable[Any]) -> list[Any]:
    return [int(d) if isinstance(d, (int, np.integer)) else d for d in shape]


@runtime_checkable
class Weights(Protocol):
    """Hierarchical access to model weights.

    Attribute and index access build dotted names: ``weights.model.layers[0].wq``
    names ``"model.layers.0.wq"`` (use ``weights["_x"]`` for parts that start
    with an underscore). ``allocate()`` makes a graph `Weight` and records its
    value in `allocated_weights`, ready for
    ``InferenceSession.load(graph, weights_registry=weights.allocated_weights)``.
    """

    @property
    def name(self) -> str:
        """The current weight name or prefix (``"model.layers.0"``)."""
        return self._prefix

    @property
    def allocated_weights(self) -> dict[str, Any]:
        """Values (DLPack arrays) of every weight allocated so far through this tree, by name.

        Only weights passed through `allocate` are included, not every weight of the checkpoint.
        """
        return self._allocated

    def __getattr__(self: _Self, attr: str) -> _Self:
        if attr.startswith("_"):
            raise AttributeError(
                f"{type(self).__name__} has no attribute {attr!r} (for a weight name starting with '_', index: "
                f"weights[{attr!r}])"
            )
        return _derive(self, _join(self._prefix, attr))

    def __getitem__(self: _Self, idx: int | str) -> _Self:
        return _derive(self, _join(self._prefix, str(idx)))

    def exists(self) -> bool:
        """True if a weight with exactly the current name exists."""
        return self._source.contains(self._prefix)

    def data(self) -> WeightData:
        """The stored tensor and its metadata (lazy: a memory-mapped view).

        Raises:
            KeyError: no weight has the current name (the message suggests close names).
        """
        info = _info(self)
        return WeightData(
            self._source.read(self._prefix), self._prefix, info.dtype, Shape(info.shape), info.quantization_encoding
        )

    def items(self: _Self) -> Iterator[tuple[str, _Self]]:
        """``(name, accessor)`` for every weight under the current prefix, in file order.

        Names are relative to the prefix (at the root, the full names); a prefix
        that is itself a weight yields it under ``""``. Prefixes match whole
        components: ``layers.1`` does not include ``layers.10``.
        """
        prefix = self._prefix
        for full in self._source.names():
            if not prefix:
                rel = full
            elif full == prefix:
                rel = ""
            elif full.startswith(prefix + "."):
                rel = full[len(prefix) + 1 :]
            else:
                continue
            yield rel, _derive(self, full)

    def allocate(
        self,
        dtype: DType | None = None,
        shape: Iterable[Any] | None = None,
        quantization_encoding: QuantizationEncoding | None = None,
        device: Any = DeviceRef.CPU(),  # noqa: B008 - MAX's documented default; DeviceRef is immutable
    ) -> Weight:
        """A graph `Weight` for the current name; its value goes into `allocated_weights`.

        Args:
            dtype: None keeps the stored dtype. A different float dtype converts
                the values (a copy); a float dtype on a packed GGUF tensor
                dequantizes it. Other changes raise ValueError.
            shape: expected shape, checked (packed tensors accept their logical
                shape or their byte shape).
            quantization_encoding: require a packed tensor (any block format:
                GGUF files mix encodings, so the file's encoding is used).
            device: where the graph places the weight.

        Raises:
            KeyError: no weight has the current name.
            ValueError: the dtype, shape or encoding does not match the checkpoint.
        """
        name = self._prefix
        info = _info(self)
        source: TensorSource = self._source
        if dtype is not None and not isinstance(dtype, DType):
            raise TypeError(f"allocate({name!r}): dtype must be a DType or None, got {type(dtype).__name__}")
        converting = dtype is not None and dtype is not info.dtype
        if quantization_encoding is not None and (converting or info.quantization_encoding is None):
            reason = (
                f"dtype={dtype} asks for unpacked values"
                if converting
                else f"the checkpoint holds an unquantized {info.dtype} tensor"
            )
            raise ValueError(
                f"Weight {name!r} in {source.label}: expected a quantized weight ({quantization_encoding}) but {reason}"
            )
        if converting:
            value = source.convert(name, dtype)
            w_dtype, w_shape, encoding = dtype, tuple(value.shape), None
        else:
            value, w_dtype, w_shape, encoding = source.read(name), info.dtype, info.shape, info.quantization_encoding
        if shape is not None:
            wanted = Shape(_dims(shape))
            accepted = [w_shape] + ([info.logical_shape] if encoding is not None else [])
            if not any(wanted == list(s) for s in accepted):
                raise ValueError(
                    f"Weight {name!r} in {source.label}: expected shape {_dims(shape)}, "
                    f"the checkpoint has {list(accepted[-1])}"
                    + (f" ({list(w_shape)} as {encoding.value} bytes)" if encoding is not None else "")
                )
        weight = Weight(name, w_dtype, list(w_shape), device=device, quantization_encoding=encoding, align=source.align)
        if encoding is not None:
            weight._original = (info.logical_dtype, Shape(info.logical_shape))
        self._allocated[name] = value
        return weight


class CheckpointWeights(Weights):
    """Shared conveniences of the file loaders (not part of the protocol)."""

    _source: TensorSource
    _prefix: str
    _allocated: dict[str, Any]

    def info(self) -> TensorInfo:
        """What the checkpoint says about the current weight (dtype, shapes, encoding, size), without reading it.

        Raises:
            KeyError: no weight has the current name (the message suggests close names).

        Example:
            >>> weights.model.norm.weight.info().logical_shape  # doctest: +SKIP
            (64,)
        """
        return _info(self)

    def values(self, dtype: DType | None = None) -> np.ndarray:
        """The current weight's values as a numpy array of ``dtype`` (default: its logical dtype).

        Packed blocks are dequantized; a stored tensor already of ``dtype`` comes
        back as its (memory-mapped) view, anything else as a new array.

        Raises:
            KeyError: no weight has the current name.
            ValueError: the conversion would reinterpret or truncate values (see `TensorSource.convert`).

        Example:
            >>> weights.blk[0].attn_q.weight.values().dtype  # doctest: +SKIP
            dtype('float32')
        """
        info = _info(self)
        target = info.logical_dtype if dtype is None else dtype
        if info.quantization_encoding is None and target is info.dtype:
            return self._source.read(self._prefix)
        return self._source.convert(self._prefix, target)

    def materialize(self) -> dict[str, np.ndarray]:
        """Read every weight under the prefix into memory (stored representation), by full name.

        Shows a progress bar for large reads (see `maxfx.graph.weights._progress`).
        """
        names = [self._prefix if not rel else _join(self._prefix, rel) for rel, _ in self.items()]
        total = sum(self._source.info(n).nbytes for n in names)
        out: dict[str, np.ndarray] = {}
        with progress_bar(total, f"reading {os.path.basename(self._source.label)}") as bar:
            for n in names:
                out[n] = np.array(self._source.read(n), copy=True)
                bar.update(self._source.info(n).nbytes)
        return out

    def __iter__(self) -> Iterator[Any]:
        # Without this, Python would iterate by calling __getitem__(0), (1), ... forever.
        raise TypeError(f"{type(self).__name__} is not iterable; use .items()")

    def __contains__(self, name: str) -> bool:
        return self._source.contains(_join(self._prefix, str(name)))

    def __dir__(self) -> list[str]:
        prefix = self._prefix + "." if self._prefix else ""
        parts = {n[len(prefix) :].split(".", 1)[0] for n in self._source.names() if n.startswith(prefix)}
        public = {a for a in super().__dir__() if not a.startswith("_")}
        return sorted(public | {p for p in parts if p.isidentifier()})

    def __repr__(self) -> str:
        count = sum(1 for _ in self.items())
        where = f"prefix={self._prefix!r}, " if self._prefix else ""
        return f"{type(self).__name__}({where}{count} weight(s) from {self._source.label})"
