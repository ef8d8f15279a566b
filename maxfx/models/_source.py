"""Where a model's parameters come from: a checkpoint (HF names or GGUF) or a random init.

Model builders ask a `ParamSource` for tensors by Hugging Face name and shape;
the source checks the shape against the checkpoint and raises
`CheckpointMismatchError` naming the file and tensor. A model is assembled only
after every tensor was read and checked, so a failed load leaves nothing behind.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Module, QuantizedLinear
from maxfx.graph.weights._progress import progress_bar
from maxfx.models._layers import PackedEmbedding, Q8Embedding, Q8Linear, embedding, linear
from maxfx.nn._q8 import split_q8_0

__all__ = ["CheckpointMismatchError", "CheckpointSource", "GGUFSource", "ParamSource", "RandomSource"]


class CheckpointMismatchError(ValueError):
    """The checkpoint does not hold what the config describes (missing, extra or mis-shaped tensors)."""


def _to_tensor(array: np.ndarray) -> Tensor:
    return Tensor.from_dlpack(np.ascontiguousarray(array))


class ParamSource(abc.ABC):
    """Hands out parameters by Hugging Face name; subclasses read or invent them."""

    @abc.abstractmethod
    def tensor(self, name: str, shape: tuple[int, ...], *, kind: str = "weight", fan_in: int | None = None) -> Tensor:
        """The ``shape`` tensor ``name``; ``kind`` ("weight", "bias", "norm", "embedding") guides random init."""

    def norm(self, name: str, dim: int) -> Tensor:
        return self.tensor(name, (dim,), kind="norm")

    def linear(self, name: str, out_dim: int, in_dim: int, *, rope_heads: int | None = None) -> Module:
        """A ``[out_dim, in_dim]`` projection named ``name + ".weight"`` (no bias)."""
        return linear(self.tensor(name + ".weight", (out_dim, in_dim), fan_in=in_dim))

    def embedding(self, name: str, vocab: int, dim: int) -> Module:
        return embedding(self.tensor(name + ".weight", (vocab, dim), kind="embedding"))

    def finish(self, ignore: Iterable[str] = ()) -> None:
        """Called once every parameter was requested (checks for leftovers)."""


class RandomSource(ParamSource):
    """Random initialisation: normal weights with std ``1/sqrt(fan_in)``, norms near 1, embeddings std 0.5.

    Args:
        seed: numpy seed.
        dtype: parameter dtype (float32 default; bfloat16 for big models).
    """

    def __init__(self, seed: int = 0, dtype: DType = DType.float32):
        self._rng = np.random.default_rng(seed)
        self._dtype = dtype

    def tensor(self, name: str, shape: tuple[int, ...], *, kind: str = "weight", fan_in: int | None = None) -> Tensor:
        rng, np_dtype = self._rng, self._dtype.to_numpy()
        if kind == "norm":
            value = 1.0 + 0.1 * rng.standard_normal(shape, np.float32)
        elif kind == "bias":
            value = 0.1 * rng.standard_normal(shape, np.float32)
        else:
            std = 0.5 if kind == "embedding" else 1.0 / np.sqrt(fan_in or shape[-1])
            value = rng.standard_normal(shape, np.float32) * np.float32(std)
        return _to_tensor(value.astype(np_dtype))


class _Checked(ParamSource):
    """Shared bookkeeping of the checkpoint sources: used names, progress, error messages."""

    def __init__(self, weights: Any, label: str, dtype: DType | None, config_label: str):
        self._weights = weights
        self._label = label
        self._dtype = dtype
        self._config_label = config_label
        self._used: set[str] = set()
        names = [n for n, _ in weights.items()]
        self._names = names
        self._name_set = set(names)
        total = sum(weights._source.info(n).nbytes for n in names)
        self._bar = progress_bar(total, f"loading {os.path.basename(label)}")

    def _missing(self, name: str, what: str) -> CheckpointMismatchError:
        return CheckpointMismatchError(f"{self._label}: tensor {name!r} ({what}) is missing; {self._config_label} describes it")

    def _read(self, name: str) -> np.ndarray:
        if name not in self._name_set:
            raise self._missing(name, "required by the model")
        self._used.add(name)
        value = np.asarray(self._weights[name].data().to_numpy())
        self._bar.update(self._weights._source.info(name).nbytes)
        return value

    def _check_shape(self, name: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
        if tuple(got) != tuple(want):
            raise CheckpointMismatchError(f"{self._label}: tensor {name!r} has shape {list(got)} but {self._config_label} needs {list(want)}")

    def _cast(self, value: np.ndarray, name: str) -> np.ndarray:
        if self._dtype is None or value.dtype == self._dtype.to_numpy():
            return value
        if not np.issubdtype(value.dtype, np.floating) and value.dtype.name != "bfloat16":
            raise CheckpointMismatchError(f"{self._label}: tensor {name!r} is {value.dtype}, cannot convert to {self._dtype}")
        return value.astype(self._dtype.to_numpy())

    def finish(self, ignore: Iterable[str] = ()) -> None:
        self._bar.close()
        skip = set(ignore)
        extra = [n for n in self._names if n not in self._used and n not in skip and not n.endswith("rotary_emb.inv_freq")]
        if extra:
            raise CheckpointMismatchError(
                f"{self._label}: {len(extra)} tensor(s) are not part of the model {self._config_label} describes, e.g. {extra[:3]}"
            )


class CheckpointSource(_Checked):
    """Parameters from a safetensors or PyTorch checkpoint with Hugging Face names."""

    def tensor(self, name: str, shape: tuple[int, ...], *, kind: str = "weight", fan_in: int | None = None) -> Tensor:
        value = self._read(name)
        self._check_shape(name, value.shape, shape)
        return _to_tensor(self._cast(value, name))


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


def gguf_name(hf: str) -> str:
    """``model.layers.3.mlp.up_proj.weight`` -> ``blk.3.ffn_up.weight``."""
    base, suffix = hf.rsplit(".", 1)
    if base in _GGUF_TOP:
        return f"{_GGUF_TOP[base]}.{suffix}"
    parts = base.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _GGUF_LAYER:
        return f"blk.{parts[2]}.{_GGUF_LAYER[parts[3]]}.{suffix}"
    raise KeyError(f"no GGUF name for {hf!r}")


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's interleaved-RoPE row order within each head (works on packed rows too)."""
    r = rows.shape[0]
    return rows.reshape(n_head, r // n_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


_PACKED = {e.value: e for e in QuantizationEncoding if e.is_gguf}


class GGUFSource(_Checked):
    """Parameters from a llama.cpp GGUF file, asked for by HF name.

    Q4_0/Q4_K/Q5_K/Q6_K matrices stay packed (`QuantizedLinear`, `PackedEmbedding`),
    Q8_0 stays 8-bit (`Q8Linear`, `Q8Embedding`), float tensors become plain
    layers; other block formats are dequantized by the reader (float32).
    Q/K rows are put back into HF's rotate-half order.
    """

    def __init__(self, weights: Any, label: str, dtype: DType | None, config_label: str):
        super().__init__(weights, label, dtype, config_label)
        self._types = {t.name: t.tensor_type.name for t in weights.reader.tensors}

    def _raw(self, hf: str, shape: tuple[int, ...]) -> tuple[str, str]:
        name = gguf_name(hf)
        if name not in self._name_set:
            raise self._missing(name, f"HF {hf!r}")
        self._check_shape(name, tuple(self._weights._source.info(name).logical_shape), shape)
        return name, self._types[name]

    def tensor(self, name: str, shape: tuple[int, ...], *, kind: str = "weight", fan_in: int | None = None) -> Tensor:
        gname, _ = self._raw(name, shape)
        return _to_tensor(self._cast(self._read(gname), gname))

    def linear(self, name: str, out_dim: int, in_dim: int, *, rope_heads: int | None = None) -> Module:
        gname, qtype = self._raw(name + ".weight", (out_dim, in_dim))
        fix = (lambda rows: unpermute_rows(rows, rope_heads)) if rope_heads else (lambda rows: rows)
        if qtype in _PACKED:
            return QuantizedLinear(_to_tensor(fix(self._packed(gname))), _PACKED[qtype])
        if qtype == "Q8_0":
            values, scales = split_q8_0(fix(self._packed(gname)))
            return Q8Linear(_to_tensor(values), _to_tensor(scales))
        return linear(_to_tensor(self._cast(fix(self._read(gname)), gname)))

    def embedding(self, name: str, vocab: int, dim: int) -> Module:
        gname, qtype = self._raw(name + ".weight", (vocab, dim))
        if qtype in _PACKED:
            return PackedEmbedding(_to_tensor(self._packed(gname)), _PACKED[qtype])
        if qtype == "Q8_0":
            return Q8Embedding(*(_to_tensor(a) for a in split_q8_0(self._packed(gname))))
        return embedding(_to_tensor(self._cast(self._read(gname), gname)))

    def _packed(self, name: str) -> np.ndarray:
        self._used.add(name)
        raw = np.asarray(self._weights[name].raw_tensor())
        self._bar.update(self._weights._source.info(name).nbytes)
        return raw

    def finish(self, ignore: Iterable[str] = ()) -> None:
        super().finish(tuple(ignore) + ("rope_freqs.weight",))
