"""GGUF Q8_0 weights kept 8-bit: the one Q8_0 math, and the graph layers over it.

MAX's `QuantizationEncoding` has no Q8_0, so ``ops.qmatmul`` does not take it.
A Q8_0 matrix is held as its blocks' two parts instead, ``weight`` (int8
``[rows, cols]``, the quants) and ``scales`` (float16 ``[rows, cols / 32]``, one
per block of 32), the same bytes as the file, and decoded inside the compiled
program (``w = float(weight) * scale``), so nothing is dequantized at load.

`split_q8_0`, `q8_decode`, `q8_matmul` and `q8_lookup` are that math, written
over ``maxfx.graph.ops``: they run on graph values (the `Q8Linear`,
`Q8Embedding` and `Q8AttentionWithRope` layers here), on eager Tensors and
under ``jax.jit`` (the eager modules of `maxfx.models`).

Example:
    >>> lin = Q8Linear(64, 16, DType.float32, DeviceRef.CPU())
    >>> sorted((k, w.dtype.name) for k, w in lin.raw_state_dict().items())
    [('scales', 'float16'), ('weight', 'int8')]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.context import bind
from lowering.dtypes import DType
from lowering.ops.quantized import q8_0_matmul_p
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import Weight
from maxfx.nn._graph_util import device_ref
from maxfx.nn._graph_util import on_device as _on
from maxfx.nn._layer import Module
from maxfx.nn.attention._rope_attention import AttentionWithRope

__all__ = [
    "Q8_BLOCK",
    "Q8AttentionWithRope",
    "Q8Embedding",
    "Q8Linear",
    "q8_decode",
    "q8_lookup",
    "q8_matmul",
    "split_q8_0",
]

Q8_BLOCK = 32  # values per Q8_0 block (a float16 scale + 32 int8 quants)
_Q8_BYTES = 2 + Q8_BLOCK  # bytes per block in a GGUF file


def split_q8_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GGUF Q8_0 bytes ``uint8 [rows, n_blocks * 34]`` → (int8 quants ``[rows, n_blocks * 32]``, float16 scales ``[rows,
    n_blocks]``).

    A view-and-copy of the bytes: no arithmetic, the values stay 8-bit.

    Example:
        >>> raw = np.zeros((2, 34), np.uint8)
        >>> [a.shape for a in split_q8_0(raw)]
        [(2, 32), (2, 1)]
    """
    raw = np.asarray(raw)
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] % _Q8_BYTES:
        raise ValueError(
            f"split_q8_0: expected uint8 [rows, a multiple of {_Q8_BYTES} bytes] (whole Q8_0 blocks), got {raw.dtype} "
            f"{list(raw.shape)}"
        )
    rows, width = raw.shape
    blocks = np.ascontiguousarray(raw).reshape(rows, width // _Q8_BYTES, _Q8_BYTES)
    scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(rows, -1)
    values = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(rows, -1)
    return values, scales


def q8_decode(values: Any, scales: Any, dtype: DType) -> Any:
    """``dtype [..., cols]`` from int8 quants ``[..., cols]`` and float16 scales ``[..., cols / 32]`` (math in
    float32).
    """
    lead = [values.shape[i] for i in range(values.rank - 1)]
    cols = int(values.shape[-1])
    blocks = ops.reshape(ops.cast(values, DType.float32), [*lead, cols // Q8_BLOCK, Q8_BLOCK])
    w = ops.reshape(blocks * ops.unsqueeze(ops.cast(scales, DType.float32), -1), [*lead, cols])
    return w if dtype is DType.float32 else ops.cast(w, dtype)


def q8_matmul(x: Any, values: Any, scales: Any) -> Any:
    """``x @ W.T`` for ``W [out, in]`` held as Q8_0 parts (the ``q8_0_matmul`` op: float32 math, ``x``'s dtype out).

    On a CPU, a float32 ``x`` goes to a kernel that reads the 8-bit values in place
    (``x`` rounded to int16 per 32 values; `custom_calls.qmatmul.cpu`).
    """
    return bind(q8_0_matmul_p, x, values, scales)


def q8_lookup(values: Any, scales: Any, ids: Any, dtype: DType) -> Any:
    """Rows ``ids`` of a Q8_0 table, as ``dtype [*ids.shape, cols]``: gathers the 8-bit rows, then decodes only
    those.
    """
    return q8_decode(ops.gather(values, ids, axis=0), ops.gather(scales, ids, axis=0), dtype)


def _q8_weights(layer: Any, rows: int, cols: int, where: str) -> None:
    if cols % Q8_BLOCK:
        raise ValueError(f"{where}: the Q8_0 dimension {cols} must be a multiple of the block size {Q8_BLOCK}")
    layer.weight = Weight("weight", DType.int8, [rows, cols], DeviceRef.CPU())
    layer.scales = Weight("scales", DType.float16, [rows, cols // Q8_BLOCK], DeviceRef.CPU())


class Q8Linear(Module):
    """``y = x @ W.T`` with ``W [out_dim, in_dim]`` stored as Q8_0 (``weight`` int8, ``scales`` float16).

    Takes `Linear`'s leading arguments, so it can be an attention layer's ``linear_cls``.

    Args:
        in_dim, out_dim: the product's sizes (``in_dim`` a multiple of 32).
        dtype: the dtype ``W`` is decoded to (the activations' dtype).
        device: where the product runs.
        has_bias: must be False (GGUF Llama projections have none).
    """

    def __init__(self, in_dim: int, out_dim: int, dtype: DType, device: Any = None, has_bias: bool = False):
        super().__init__()
        if has_bias:
            raise ValueError("Q8Linear: biases are not supported with Q8_0 weights")
        self.in_dim, self.out_dim, self.dtype, self.device = int(in_dim), int(out_dim), dtype, device_ref(device)
        _q8_weights(self, self.out_dim, self.in_dim, "Q8Linear")

    def decoded(self) -> Any:
        """``W`` as ``dtype [out_dim, in_dim]``, decoded in the graph."""
        return q8_decode(_on(self.weight, self.device), _on(self.scales, self.device), self.dtype)

    def __call__(self, x: Any) -> Any:
        if int(x.shape[-1]) != self.in_dim:
            raise ValueError(f"Q8Linear: input's last dim must be {self.in_dim}, got shape {list(x.shape)}")
        return q8_matmul(x, _on(self.weight, self.device), _on(self.scales, self.device))

    def __repr__(self) -> str:
        return f"Q8Linear(in_dim={self.in_dim}, out_dim={self.out_dim}, dtype={self.dtype.name})"


class Q8Embedding(Module):
    """Row lookup in a Q8_0 table ``[vocab_size, hidden_dim]``: gathers the 8-bit rows, then decodes only those."""

    def __init__(self, vocab_size: int, hidden_dim: int, dtype: DType, device: Any = None):
        super().__init__()
        self.vocab_size, self.hidden_dim, self.dtype, self.device = (
            int(vocab_size),
            int(hidden_dim),
            dtype,
            device_ref(device),
        )
        _q8_weights(self, self.vocab_size, self.hidden_dim, "Q8Embedding")

    def __call__(self, indices: Any) -> Any:
        return q8_lookup(_on(self.weight, self.device), _on(self.scales, self.device), indices, self.dtype)

    def tied_head(self) -> Q8Linear:
        """A `Q8Linear` ``hidden_dim → vocab_size`` reading this table (shared weights, not owned)."""
        head = Q8Linear(self.hidden_dim, self.vocab_size, self.dtype, self.device)
        head.set_shared_weight("weight", self.weight)
        head.set_shared_weight("scales", self.scales)
        return head


class Q8AttentionWithRope(AttentionWithRope):
    """`AttentionWithRope` whose q/k/v/o projections are `Q8Linear`.

    The fused QKV kernel takes one float ``wqkv``; here it is assembled in the
    graph from the decoded q/k/v weights, so the weights stay 8-bit in memory.
    """

    def __init__(self, **kwargs: Any):
        if "linear_cls" in kwargs:
            raise ValueError("Q8AttentionWithRope: linear_cls is fixed to Q8Linear")
        super().__init__(**kwargs, linear_cls=Q8Linear)

    @property
    def wqkv(self) -> Any:
        """The decoded q, k and v weights concatenated along the output dim (``[(n_heads + 2 n_kv_heads) * head_dim,
        hidden]``).
        """
        dev = self.devices[0]
        return ops.concat([_on(p.decoded(), dev) for p in (self.q_proj, self.k_proj, self.v_proj)], axis=0)

    def shard(self, devices: Any) -> list[Any]:
        """Raises ValueError: Q8_0 weights are not split by heads here."""
        raise ValueError(f"{type(self).__name__}.shard: Q8_0 attention does not support tensor parallelism")
