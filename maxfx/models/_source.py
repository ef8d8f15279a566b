"""Where a model's parameters come from: a checkpoint (HF names or GGUF) or a random init.

The public checkpoint-reader interface of `maxfx.models`. A model definition
asks a `ParamSource` for each tensor by Hugging Face name and logical shape
(`ParamSource.read`); the source checks the shape against the checkpoint,
converts float values to the requested dtype and returns a `StoredTensor`
(the array and its format), or raises `CheckpointMismatchError` naming the
file and tensor. `ParamSource.finish` reports tensors nobody asked for. A
model is assembled only after every tensor was read and checked, so a failed
load leaves nothing behind. The eager Modules and the graph-API model are
both built from what `read` returns.

Example:
    >>> src = RandomSource(seed=0)
    >>> w = src.read("model.layers.0.mlp.up_proj.weight", (8, 4), fan_in=4)
    >>> w.value.shape, w.format
    ((8, 4), None)
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Module, QuantizedLinear
from maxfx.graph.weights._progress import progress_bar
from maxfx.models._layers import PackedEmbedding, Q8Embedding, Q8Linear, embedding, linear
from maxfx.nn._q8 import split_q8_0

__all__ = [
    "Q8_0",
    "CheckpointMismatchError",
    "CheckpointSource",
    "GGUFSource",
    "ParamSource",
    "RandomSource",
    "StoredTensor",
    "eager_embedding",
    "eager_linear",
    "eager_tensor",
]

# GGUF Q8_0, which MAX's QuantizationEncoding lacks: the `StoredTensor.format` of its raw blocks.
Q8_0 = "Q8_0"
_PACKED = {e.value: e for e in QuantizationEncoding if e.is_gguf}


class CheckpointMismatchError(ValueError):
    """The checkpoint does not hold what the config describes (missing, extra or mis-shaped tensors)."""


@dataclass(frozen=True)
class StoredTensor:
    """One parameter as a `ParamSource` read it: a numpy array and the format it is in.

    Attributes:
        value: float values of the requested shape (``format`` None); packed GGUF
            rows uint8 ``[rows, row_bytes]`` (``format`` a `QuantizationEncoding`);
            or GGUF Q8_0 blocks uint8 ``[rows, cols / 32 * 34]`` (``format`` `Q8_0`,
            see `maxfx.nn._q8.split_q8_0`).
        format: None, a `QuantizationEncoding` or `Q8_0`.
    """

    value: np.ndarray
    format: QuantizationEncoding | str | None = None


def _to_tensor(array: np.ndarray) -> Tensor:
    return Tensor.from_dlpack(np.ascontiguousarray(array))


def eager_tensor(w: StoredTensor) -> Tensor:
    """A float `StoredTensor` as an eager `Tensor` (sharing the array's memory where it can)."""
    if w.format is not None:
        raise ValueError(
            f"eager_tensor: expected float values, got a {w.format} block array {list(w.value.shape)}; build a layer "
            "with eager_linear/eager_embedding"
        )
    return _to_tensor(w.value)


def _eager_layer(
    w: StoredTensor,
    plain: Callable[[Tensor], Module],
    q8: Callable[[Tensor, Tensor], Module],
    packed: Callable[[Tensor, Any], Module],
) -> Module:
    """The eager layer for ``w``'s format: ``plain(values)``, ``q8(quants, scales)`` (`Q8_0`) or ``packed(blocks,
    encoding)``.
    """
    if w.format is None:
        return plain(_to_tensor(w.value))
    if w.format == Q8_0:
        return q8(*(_to_tensor(a) for a in split_q8_0(w.value)))
    return packed(_to_tensor(w.value), w.format)


def eager_linear(w: StoredTensor) -> Module:
    """The eager ``[out, in]`` projection (no bias) holding ``w`` in its format: `Linear`, `QuantizedLinear` or
    `Q8Linear`.
    """
    return _eager_layer(w, linear, Q8Linear, QuantizedLinear)


def eager_embedding(w: StoredTensor) -> Module:
    """The eager embedding over the table ``w`` in its format: `Embedding`, `PackedEmbedding` or `Q8Embedding`."""
    return _eager_layer(w, embedding, Q8Embedding, PackedEmbedding)


class ParamSource(abc.ABC):
    """Hands out parameters by Hugging Face name; subclasses read or invent them.

    Subclasses implement `read` (and `finish` where there is something to check);
    `tensor`, `norm`, `linear` and `embedding` build eager Tensors and Modules from it.
    """

    @abc.abstractmethod
    def read(
        self,
        name: str,
        shape: tuple[int, ...],
        *,
        kind: str = "weight",
        fan_in: int | None = None,
        rope_heads: int | None = None,
        keep_blocks: bool = False,
    ) -> StoredTensor:
        """The tensor ``name`` (a Hugging Face name) of logical shape ``shape``.

        Args:
            name: e.g. ``"model.layers.0.self_attn.q_proj.weight"``.
            shape: the shape the model needs; a checkpoint that differs raises.
            kind: ``"weight"``, ``"bias"``, ``"norm"`` or ``"embedding"`` (guides random init).
            fan_in: the input size of a weight (random init's scale).
            rope_heads: the rows are the q or k projection of this many heads; they
                come back in Hugging Face's rotate-half order whatever the file's order.
            keep_blocks: a block-quantized matrix may come back packed (``format`` says
                how) instead of dequantized; float values are returned either way otherwise.

        Raises:
            CheckpointMismatchError: the tensor is missing, mis-shaped, or cannot be converted.
        """

    def finish(self, ignore: Iterable[str] = ()) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Called once every parameter was read: raises `CheckpointMismatchError` for tensors nobody asked for (except
        ``ignore``).
        """

    # -- eager conveniences --------------------------------------------------
    def tensor(self, name: str, shape: tuple[int, ...], *, kind: str = "weight", fan_in: int | None = None) -> Tensor:
        """`read` as an eager float `Tensor`."""
        return eager_tensor(self.read(name, shape, kind=kind, fan_in=fan_in))

    def norm(self, name: str, dim: int) -> Tensor:
        return self.tensor(name, (dim,), kind="norm")

    def linear(self, name: str, out_dim: int, in_dim: int, *, rope_heads: int | None = None) -> Module:
        """The eager ``[out_dim, in_dim]`` projection named ``name + ".weight"`` (no bias), packed weights kept
        packed.
        """
        return eager_linear(
            self.read(name + ".weight", (out_dim, in_dim), fan_in=in_dim, rope_heads=rope_heads, keep_blocks=True)
        )

    def embedding(self, name: str, vocab: int, dim: int) -> Module:
        return eager_embedding(self.read(name + ".weight", (vocab, dim), kind="embedding", keep_blocks=True))


class RandomSource(ParamSource):
    """Random initialisation: normal weights with std ``1/sqrt(fan_in)``, norms near 1, embeddings std 0.5.

    Args:
        seed: numpy seed.
        dtype: parameter dtype (float32 default; bfloat16 for big models).
    """

    def __init__(self, seed: int = 0, dtype: DType = DType.float32):
        self._rng = np.random.default_rng(seed)
        self._dtype = dtype

    def read(
        self,
        name: str,
        shape: tuple[int, ...],
        *,
        kind: str = "weight",
        fan_in: int | None = None,
        rope_heads: int | None = None,
        keep_blocks: bool = False,
    ) -> StoredTensor:
        rng = self._rng
        if kind == "norm":
            value = 1.0 + 0.1 * rng.standard_normal(shape, np.float32)
        elif kind == "bias":
            value = 0.1 * rng.standard_normal(shape, np.float32)
        else:
            std = 0.5 if kind == "embedding" else 1.0 / np.sqrt(fan_in or shape[-1])
            value = rng.standard_normal(shape, np.float32) * np.float32(std)
        return StoredTensor(value.astype(self._dtype.to_numpy()))


class _Checked(ParamSource):
    """Shared bookkeeping of the checkpoint sources: used names, progress, shape checks, dtype conversion."""

    def __init__(
        self, weights: Any, label: str, dtype: DType | None, config_label: str, *, config_dtype: str | None = None
    ):
        self._weights = weights
        self._label = label
        self._dtype = dtype
        self._config_label = config_label
        self._config_dtype = config_dtype
        self._used: set[str] = set()
        self._names = [n for n, _ in weights.items()]
        self._info = {n: weights[n].info() for n in self._names}
        self._bar = progress_bar(sum(i.nbytes for i in self._info.values()), f"loading {os.path.basename(label)}")

    def _checked(self, name: str, shape: tuple[int, ...], hf: str) -> Any:
        """The `TensorInfo` of the file's tensor ``name`` after checking it exists and has the logical ``shape``; marks
        it used.
        """
        info = self._info.get(name)
        if info is None:
            what = "required by the model" if name == hf else f"HF {hf!r}"
            raise CheckpointMismatchError(
                f"{self._label}: tensor {name!r} ({what}) is missing; {self._config_label} describes it"
            )
        if tuple(info.logical_shape) != tuple(shape):
            raise CheckpointMismatchError(
                f"{self._label}: tensor {name!r} has shape {list(info.logical_shape)} but {self._config_label} needs "
                f"{list(shape)}"
            )
        self._used.add(name)
        self._bar.update(info.nbytes)
        return info

    def _floats(self, name: str) -> np.ndarray:
        """The values of ``name`` (dequantized if stored in blocks) as the source's dtype (default: as stored)."""
        logical = self._info[name].logical_dtype
        if not logical.is_float():
            # Every parameter a model reads is float: an integer tensor of the same byte size would
            # otherwise load and fail only at the first forward, deep inside an op.
            want = self._dtype.name if self._dtype is not None else self._config_dtype or "a float dtype"
            raise CheckpointMismatchError(
                f"{self._label}: tensor {name!r} is stored as {logical.name}, but {self._config_label} needs {want} "
                "(model parameters are float)"
            )
        return np.asarray(self._weights[name].values(self._dtype))

    def finish(self, ignore: Iterable[str] = ()) -> None:
        self._bar.close()
        skip = set(ignore)
        extra = [
            n for n in self._names if n not in self._used and n not in skip and not n.endswith("rotary_emb.inv_freq")
        ]
        if extra:
            raise CheckpointMismatchError(
                f"{self._label}: {len(extra)} tensor(s) are not part of the model {self._config_label} describes, e.g. "
                f"{extra[:3]}"
            )


class CheckpointSource(_Checked):
    """Parameters from a safetensors or PyTorch checkpoint with Hugging Face names (rows already in HF order).

    Args:
        weights: the opened checkpoint (`maxfx.graph.weights.load_weights`).
        label: how messages name it (a path).
        dtype: convert float tensors to this dtype (None: as stored).
        config_label: how messages name the config (``".../config.json"``).
        config_dtype: the config's ``torch_dtype``, named when a tensor is not float.
    """

    def read(
        self,
        name: str,
        shape: tuple[int, ...],
        *,
        kind: str = "weight",
        fan_in: int | None = None,
        rope_heads: int | None = None,
        keep_blocks: bool = False,
    ) -> StoredTensor:
        self._checked(name, shape, name)
        return StoredTensor(self._floats(name))


# HF name (without ".weight") -> GGUF name, for the tensors of a Llama checkpoint.
_GGUF_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_GGUF_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def rename_tensor(
    hf: str, *, top: Mapping[str, str], layer: Mapping[str, str], hf_layers: str, layers: str, what: str
) -> str:
    """The Hugging Face tensor name ``hf`` in another naming, by tables; its last part (``weight``, ``bias``) is kept.

    A top-level tensor is renamed by ``top``; a layer's tensor ``{hf_layers}.N.part``
    becomes ``{layers}.N.{layer[part]}``. The one renaming behind `gguf_name` and GPT-2's
    graph state-dict names (`maxfx.models._gpt2`).

    Raises:
        KeyError: neither table names ``hf`` (``no {what} name for ...``).

    Example:
        >>> rename_tensor("model.layers.3.mlp.up_proj.weight", top={}, layer={"mlp.up_proj": "ffn_up"},
        ...     hf_layers="model.layers", layers="blk", what="GGUF")
        'blk.3.ffn_up.weight'
    """
    base, suffix = hf.rsplit(".", 1)
    if base in top:
        return f"{top[base]}.{suffix}"
    prefix = hf_layers + "."
    index, _, part = base.removeprefix(prefix).partition(".")
    if base.startswith(prefix) and part in layer:
        return f"{layers}.{index}.{layer[part]}.{suffix}"
    raise KeyError(f"no {what} name for {hf!r}")


def gguf_name(hf: str) -> str:
    """``model.layers.3.mlp.up_proj.weight`` -> ``blk.3.ffn_up.weight``."""
    return rename_tensor(hf, top=_GGUF_TOP, layer=_GGUF_LAYER, hf_layers="model.layers", layers="blk", what="GGUF")


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's interleaved-RoPE row order within each head (works on packed rows too)."""
    r = rows.shape[0]
    return rows.reshape(n_head, r // n_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


class GGUFSource(_Checked):
    """Parameters from a llama.cpp GGUF file, asked for by HF name.

    With ``keep_blocks``, Q4_0/Q4_K/Q5_K/Q6_K matrices stay packed and Q8_0
    matrices stay 8-bit (their raw blocks); float tensors, and block formats
    with neither, come back as floats (float32 unless ``dtype`` says otherwise).
    Q/K rows (``rope_heads``) are put back into HF's rotate-half order.

    Args:
        weights: the opened `maxfx.graph.weights.GGUFWeights`.
        label, dtype, config_label: as `CheckpointSource`.
    """

    def read(
        self,
        name: str,
        shape: tuple[int, ...],
        *,
        kind: str = "weight",
        fan_in: int | None = None,
        rope_heads: int | None = None,
        keep_blocks: bool = False,
    ) -> StoredTensor:
        gname = gguf_name(name)
        stored = self._checked(gname, shape, name).storage_type
        if keep_blocks and len(shape) == 2 and (stored in _PACKED or stored == Q8_0):
            out = StoredTensor(np.asarray(self._weights[gname].raw_tensor()), _PACKED.get(stored, Q8_0))
        else:
            out = StoredTensor(self._floats(gname))
        return out if not rope_heads else StoredTensor(unpermute_rows(out.value, rope_heads), out.format)

    def finish(self, ignore: Iterable[str] = ()) -> None:
        super().finish(tuple(ignore) + ("rope_freqs.weight",))
