"""Layers of the eager Module API: `Linear`, `Embedding`, `Sequential`, `ModuleList`, `LayerNorm`.

Parameters are eager Tensors; every computation calls ``maxfx.functional``
(the op registry), so the layers run eagerly, under ``jax.jit`` and inside
`Module.compile` alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType
from lowering.types import DeviceRef, TensorType
from maxfx.experimental import functional as F
from maxfx.experimental import random
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn.module import Module

__all__ = ["Linear", "Embedding", "Sequential", "ModuleList", "LayerNorm"]


def _dim(d: Any, what: str) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, Dim)) and not hasattr(d, "__index__"):
        raise TypeError(f"{what} must be an int, got {type(d).__name__}")
    n = int(d)
    if n <= 0:
        raise ValueError(f"{what} must be positive, got {n}")
    return n


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight: [out_dim, in_dim]`` and ``bias: [out_dim]``.

    Weights start uniform in ``±1/sqrt(in_dim)`` (PyTorch's default); with
    ``bias=False`` the bias is the literal ``0``.

    Example:
        >>> layer = Linear(4, 2)
        >>> layer(Tensor.ones([3, 4])).shape
        [Dim(3), Dim(2)]
    """

    def __init__(self, in_dim: int, out_dim: int, *, bias: bool = True):
        n_in, n_out = _dim(in_dim, "Linear: in_dim"), _dim(out_dim, "Linear: out_dim")
        bound = 1.0 / math.sqrt(n_in)
        self.weight = random.uniform([n_out, n_in], range=(-bound, bound))
        self.bias = random.uniform([n_out], range=(-bound, bound)) if bias else 0

    @property
    def in_dim(self) -> Dim:
        return StaticDim(int(self.weight.shape[1]))

    @property
    def out_dim(self) -> Dim:
        return StaticDim(int(self.weight.shape[0]))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T + self.bias

    def input_types(self) -> tuple[TensorType, ...]:
        """``[batch, in_dim]`` in the weight's dtype on ``self.device``."""
        return (TensorType(self.weight.dtype, ["batch", int(self.in_dim)], DeviceRef.from_device(self.device)),)

    def __rich_repr__(self) -> Iterator[tuple[Any, ...]]:
        """MAX's: the constructor's arguments, ``bias`` only when False."""
        yield "in_dim", self.in_dim
        yield "out_dim", self.out_dim
        yield "bias", isinstance(self.bias, Tensor), True


class Embedding(Module):
    """A lookup table ``weight: [vocab_size, *dims]``; calling it gathers rows.

    Give exactly one of ``dim`` (one embedding dim) or ``dims`` (several).

    Example:
        >>> emb = Embedding(10, dim=4)
        >>> emb(Tensor([1, 2], dtype=DType.int64)).shape
        [Dim(2), Dim(4)]
    """

    def __init__(self, vocab_size: int, *, dim: int | None = None, dims: Sequence[int] | None = None):
        if (dim is None) == (dims is None):
            raise TypeError("Embedding: give exactly one of dim= or dims=")
        shape = [_dim(vocab_size, "Embedding: vocab_size")] + (
            [_dim(dim, "Embedding: dim")] if dim is not None else [_dim(d, "Embedding: dims") for d in dims]
        )
        self.weight = random.normal(shape)

    @property
    def vocab_size(self) -> Dim:
        return self.weight.shape[0]

    @property
    def dims(self) -> list[Dim]:
        return list(self.weight.shape[1:])

    @property
    def dim(self) -> Dim:
        if len(self.dims) != 1:
            raise TypeError(f"Embedding.dim: this embedding has dims {self.dims}; use .dims")
        return self.dims[0]

    def forward(self, indices: Tensor) -> Tensor:
        if indices.dtype not in (DType.int32, DType.int64):  # token ids often come as uint64
            indices = indices.cast(DType.int64)
        return F.gather(self.weight, indices, axis=0)

    def __rich_repr__(self) -> Iterator[tuple[str, Any]]:
        """MAX's: ``vocab_size`` and ``dim`` (or ``dims`` for a multi-dimensional embedding)."""
        yield "vocab_size", self.vocab_size
        if len(self.weight.shape) == 2:
            yield "dim", self.dim
        else:
            yield "dims", self.dims


class ModuleList(Module):
    """A list of modules whose children are named ``0``, ``1``, ...

    Example:
        >>> layers = ModuleList([Linear(2, 2) for _ in range(3)])
        >>> [name for name, _ in layers.children]
        ['0', '1', '2']
    """

    def __init__(self, modules: Iterable[Module] = ()):
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"{type(self).__name__}: item {i} is a {type(m).__name__}, not a Module")
            setattr(self, str(i), m)

    def _items(self) -> list[Module]:
        return [v for k, v in vars(self).items() if k.isdigit()]

    def __len__(self) -> int:
        return len(self._items())

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items())

    def __getitem__(self, i: int) -> Module:
        return self._items()[i]

    def append(self, module: Module) -> None:
        setattr(self, str(len(self)), module)

    def __rich_repr__(self) -> Iterator[Module]:
        """MAX's: the modules, without their index names."""
        for _, child in self.children:
            yield child


class Sequential(ModuleList):
    """Applies its modules in order: ``Sequential(a, b)(x) == b(a(x))``.

    Example:
        >>> net = Sequential(Linear(4, 8), Linear(8, 2))
        >>> [name for name, _ in net.parameters]
        ['0.weight', '0.bias', '1.weight', '1.bias']
    """

    # Module.compile(use_subgraphs=True) may replace this forward by one subgraph called per block.
    _children_in_order = True

    def __init__(self, *modules: Module):
        super().__init__(modules)

    def forward(self, x: Any) -> Any:
        for m in self:
            x = m(x)
        return x


class LayerNorm(Module):
    """Layer normalisation over the last dim: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Example:
        >>> norm = LayerNorm(3)
        >>> norm(Tensor([[1.0, 2.0, 3.0]])).to_numpy().astype(float).round(3).tolist()
        [[-1.225, 0.0, 1.225]]
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, dtype: DType | None = None):
        n = _dim(dim, "LayerNorm: dim")
        if not eps > 0:
            raise ValueError(f"LayerNorm: eps must be > 0, got {eps}")
        self.weight = Tensor.ones([n], dtype=dtype)
        self.bias = Tensor.zeros([n], dtype=dtype)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def __rich_repr__(self) -> Iterator[tuple[Any, ...]]:
        """MAX's: ``dim`` (an int) and ``eps`` when it is not 1e-5."""
        yield "dim", int(self.weight.shape[0])
        yield "eps", self.eps, 1e-5
