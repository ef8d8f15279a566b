"""`load_pretrained_graph` (Llama and GPT-2) and the graph-API Llama, `LlamaGraphModel`, run by `InferenceSession` over
the paged KV cache.

`load_pretrained_graph` reads any checkpoint through `open_checkpoint` and the
architecture's reader (`GRAPH_ARCHITECTURES`: `read_llama`, `read_gpt2`), then
builds that architecture's `PagedCausalLM` (`maxfx.models._paged`, the shared
runtime). The Llama model is `maxfx.models._llama`'s definition (the same `read_llama` tensors
`load_pretrained` builds eager Modules from) assembled as a `maxfx.nn.Transformer`
(Embedding, TransformerBlock(AttentionWithRope, MLP, RMSNorm), RMSNorm, Linear
head) by `llama_transformer`, with the RoPE table sized for ``max_seq_len``.

Weight formats: float tensors as stored; GGUF Q4_0/Q4_K/Q5_K/Q6_K matrices stay
packed (``ops.qmatmul`` in `Linear`, GGUF attention kernel); GGUF Q8_0 (no MAX
encoding) stays 8-bit as int8 quants + float16 scales, decoded inside the graph
(`maxfx.nn._q8`: ``Q8Linear``, ``Q8Embedding``, ``Q8AttentionWithRope``). GGUF's Q/K rows (llama.cpp's
interleaved-RoPE order) are put back into HF's order at load (packed rows too),
so every format runs the same rotate-half RoPE graph and shares its executables.

Example:
    >>> from maxfx.models import load_pretrained_graph
    >>> model = load_pretrained_graph("tests/data/models/tiny_llama")  # doctest: +SKIP
    >>> model([[5, 6, 7]]).shape  # doctest: +SKIP
    (1, 3, 256)
    >>> model.generate([[5, 6, 7]], max_new_tokens=4)  # doctest: +SKIP
    array([[...]])
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lowering.dtypes import DType
from maxfx.engine import InferenceSession
from maxfx.models._config import LlamaConfig
from maxfx.models._gpt2 import GPT2GraphModel, gpt2_graph_weights, read_gpt2
from maxfx.models._llama import LlamaForCausalLM, graph_weights, llama_transformer, read_llama
from maxfx.models._loading import open_checkpoint
from maxfx.models._paged import GraphWeight, PagedCausalLM
from maxfx.nn.rotary_embedding import Llama3RotaryEmbedding
from maxfx.nn.transformer import Transformer

__all__ = ["GRAPH_ARCHITECTURES", "LlamaGraphModel", "load_pretrained_graph"]


# ─── loading ──────────────────────────────────────────────────────────────


def load_pretrained_graph(
    path: os.PathLike[str] | str,
    *,
    max_batch_size: int = 8,
    max_seq_len: int | None = None,
    page_size: int = 16,
    dtype: DType | None = None,
) -> PagedCausalLM:
    """Load a Llama or GPT-2 checkpoint as a compiled `maxfx.nn` graph (`LlamaGraphModel`, `GPT2GraphModel`).

    Args:
        path: a folder with ``config.json`` and safetensors (or ``pytorch_model.bin``)
            weights, or a ``.gguf`` file (Llama), as for `load_pretrained`.
        max_batch_size: most sequences per call (sizes the KV-cache pool).
        max_seq_len: longest prompt + generation (default: the config's
            ``max_position_embeddings``; GPT-2 cannot go past its learned positions).
        page_size: tokens per KV-cache page.
        dtype: convert float weights to this dtype (default: float32 for GGUF, as stored otherwise).

    Raises:
        FileNotFoundError: as `load_pretrained`.
        ConfigError: as `load_pretrained`, and for an architecture without a graph model
            (the message lists those in `GRAPH_ARCHITECTURES`).
        CheckpointMismatchError: as `load_pretrained`.
        ValueError: as `load_pretrained`.

    Example:
        >>> model = load_pretrained_graph("tests/data/models/tiny_llama/tiny_llama-q4_0.gguf",
        ...     max_batch_size=2)  # doctest: +SKIP
        >>> model.generate([[1, 2, 3]], max_new_tokens=4).shape  # doctest: +SKIP
        (1, 4)
    """
    p = Path(path)
    read = _from_gguf if p.is_file() and p.suffix.lower() == ".gguf" else _from_checkpoint
    config, weights = read(p, dtype)
    model_cls = GRAPH_ARCHITECTURES[config.architecture][0]
    return model_cls(config, weights, max_batch_size=max_batch_size, max_seq_len=max_seq_len, page_size=page_size)


def _from_checkpoint(path: Path, dtype: DType | None) -> tuple[Any, dict[str, GraphWeight]]:
    """The config and the graph weights (the architecture's reader, then its graph names) of any checkpoint
    `load_pretrained` reads.
    """
    config, src = open_checkpoint(path, dtype, "load_pretrained_graph", only=tuple(GRAPH_ARCHITECTURES))
    _, read, to_graph = GRAPH_ARCHITECTURES[config.architecture]
    return config, to_graph(read(config, src))


def _from_gguf(path: Path, dtype: DType | None) -> tuple[Any, dict[str, GraphWeight]]:
    # float32 unless told: the graph computes in its norms' dtype, and a GGUF file may store those as F16.
    return _from_checkpoint(path, dtype or DType.float32)


def _rope(c: LlamaConfig, max_seq_len: int, interleaved: bool) -> Any:
    """The RoPE layer of ``c`` with a table for ``2 * max_seq_len`` positions."""
    args = (c.hidden_size, c.num_attention_heads, c.rope_theta, max_seq_len)
    if c.rope_freq_factors is not None:
        # GGUF stores per-frequency divisors instead of Llama-3 parameters: hand the layer its table.
        angles = np.outer(np.arange(2 * max_seq_len, dtype=np.float64), c.inv_freq())
        table = np.stack([np.cos(angles), np.sin(angles)], -1).reshape(2 * max_seq_len, c.head_dim).astype(np.float32)
        return Llama3RotaryEmbedding(*args, head_dim=c.head_dim, _freqs_cis=table, interleaved=interleaved)
    return Llama3RotaryEmbedding(*args, head_dim=c.head_dim, interleaved=interleaved, scaling_params=c.llama3_scaling())


# ─── the model ────────────────────────────────────────────────────────────


class LlamaGraphModel(PagedCausalLM):
    """A Llama compiled as one `maxfx.nn` graph: ``model(input_ids) -> logits [B, T, vocab]`` and ``generate``.

    Build one with `load_pretrained_graph`. The graph takes a ragged batch
    (``tokens [total]``, ``input_row_offsets [B + 1]``) plus the paged KV cache
    and returns every token's logits; prefill and decode run the same program.

    Args:
        config: the `LlamaConfig`.
        weights: state-dict name (HF's without ``model.``) → (array, format): the `QuantizationEncoding`
            of packed blocks, ``Q8_0`` for the int8 ``*.weight`` / float16 ``*.scales`` of a Q8_0 matrix, or None.
        interleaved: Q/K rows are in the interleaved-RoPE (llama.cpp) order; default HF's rotate-half order.
        max_batch_size: sizes the KV-cache pool (see `load_pretrained_graph`).
        max_seq_len: sizes the KV-cache pool (see `load_pretrained_graph`).
        page_size: tokens per KV-cache page (see `load_pretrained_graph`).
        session: the `InferenceSession` to load into (default a new CPU session).

    Attributes:
        config: the `LlamaConfig`.
        transformer: the `maxfx.nn.Transformer` the graph was built from.
        compiled: the `InferenceSession` model.
        kv_params, cache: the `KVCacheParams` and the `PagedKVCacheManager` (one pool, reused by every call).

    Example:
        >>> model = load_pretrained_graph("tests/data/models/tiny_llama")  # doctest: +SKIP
        >>> model.generate([[1, 2, 3], [4, 5]], max_new_tokens=8).shape  # doctest: +SKIP
        (2, 8)
    """

    def __init__(
        self,
        config: LlamaConfig,
        weights: Mapping[str, GraphWeight],
        *,
        interleaved: bool = False,
        max_batch_size: int = 8,
        max_seq_len: int | None = None,
        page_size: int = 16,
        session: InferenceSession | None = None,
    ):
        self.interleaved = bool(interleaved)
        super().__init__(
            config,
            weights,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            page_size=page_size,
            session=session,
        )

    # The eager model's reading of the config: one place says how Llama's layers and KV heads are counted, for both
    # runtimes.
    num_layers = LlamaForCausalLM.num_layers
    kv_shape = LlamaForCausalLM.kv_shape

    def build_transformer(self, weights: Mapping[str, GraphWeight]) -> Transformer:
        return llama_transformer(
            self.config, weights, self.kv_params, _rope(self.config, self.max_seq_len, self.interleaved)
        )


# model_type -> (graph model class, checkpoint reader, reader's tensors -> graph weights)
GRAPH_ARCHITECTURES: dict[str, tuple[type[PagedCausalLM], Any, Any]] = {
    **{
        arch: (LlamaGraphModel, read_llama, graph_weights)
        for arch in ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma")
    },
    "gpt2": (GPT2GraphModel, read_gpt2, gpt2_graph_weights),
}
