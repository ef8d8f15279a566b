"""The graph-API Llama: `load_pretrained_graph` and `LlamaGraphModel`, run by `InferenceSession` over the paged KV cache.

The model is `maxfx.models._llama`'s definition (the same `read_llama` tensors
`load_pretrained` builds eager Modules from) assembled as a `maxfx.nn.Transformer`
(Embedding, TransformerBlock(AttentionWithRope, MLP, RMSNorm), RMSNorm, Linear
head) by `llama_transformer`. This module sizes and runs it: the RoPE table for
``max_seq_len``, one graph compiled over a ragged batch with the checkpoint bound
through ``weights_registry``, and one host-side `PagedKVCacheManager` owning the
cache pool. Every decode step has the same input shapes, so it reuses one executable.

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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lowering.dtypes import DType
from maxfx.engine import InferenceSession
from maxfx.graph import Graph, TensorType
from maxfx.models._config import LlamaConfig
from maxfx.models._generate import _progress, check_generation, prompt_rows
from maxfx.models._llama import GraphWeight, graph_dtype, graph_weights, llama_transformer, read_llama
from maxfx.models._loading import open_checkpoint
from maxfx.nn.kv_cache import KVCacheParams, PagedCacheValues, PagedKVCacheManager
from maxfx.nn.rotary_embedding import Llama3RotaryEmbedding

__all__ = ["LlamaGraphModel", "load_pretrained_graph"]


# ─── loading ──────────────────────────────────────────────────────────────


def load_pretrained_graph(
    path: os.PathLike[str] | str, *, max_batch_size: int = 8, max_seq_len: int | None = None, page_size: int = 16, dtype: DType | None = None,
) -> LlamaGraphModel:  # fmt: skip
    """Load a Llama checkpoint as a compiled `maxfx.nn` graph (`LlamaGraphModel`).

    Args:
        path: a folder with ``config.json`` and safetensors (or ``pytorch_model.bin``)
            weights, or a ``.gguf`` file, as for `load_pretrained`.
        max_batch_size: most sequences per call (sizes the KV-cache pool).
        max_seq_len: longest prompt + generation (default: the config's
            ``max_position_embeddings``).
        page_size: tokens per KV-cache page.
        dtype: convert float weights to this dtype (default: float32 for GGUF, as stored otherwise).

    Raises:
        FileNotFoundError, ConfigError, CheckpointMismatchError, ValueError: as `load_pretrained`;
        ConfigError also for an architecture other than llama.

    Example:
        >>> model = load_pretrained_graph("tests/data/models/tiny_llama/tiny_llama-q4_0.gguf", max_batch_size=2)  # doctest: +SKIP
        >>> model.generate([[1, 2, 3]], max_new_tokens=4).shape  # doctest: +SKIP
        (1, 4)
    """
    p = Path(path)
    read = _from_gguf if p.is_file() and p.suffix.lower() == ".gguf" else _from_checkpoint
    config, weights = read(p, dtype)
    return LlamaGraphModel(config, weights, max_batch_size=max_batch_size, max_seq_len=max_seq_len, page_size=page_size)


def _from_checkpoint(path: Path, dtype: DType | None) -> tuple[LlamaConfig, dict[str, GraphWeight]]:
    """The config and the graph weights (`graph_weights` of `read_llama`) of any checkpoint `load_pretrained` reads."""
    config, src = open_checkpoint(path, dtype, "load_pretrained_graph", only=("llama",))
    return config, graph_weights(read_llama(config, src))


def _from_gguf(path: Path, dtype: DType | None) -> tuple[LlamaConfig, dict[str, GraphWeight]]:
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


class LlamaGraphModel:
    """A Llama compiled as one `maxfx.nn` graph: ``model(input_ids) -> logits [B, T, vocab]`` and ``generate``.

    Build one with `load_pretrained_graph`. The graph takes a ragged batch
    (``tokens [total]``, ``input_row_offsets [B + 1]``) plus the paged KV cache
    and returns every token's logits; prefill and decode run the same program.

    Args:
        config: the `LlamaConfig`.
        weights: state-dict name (HF's without ``model.``) → (array, format): the `QuantizationEncoding`
            of packed blocks, ``Q8_0`` for the int8 ``*.weight`` / float16 ``*.scales`` of a Q8_0 matrix, or None.
        interleaved: Q/K rows are in the interleaved-RoPE (llama.cpp) order; default HF's rotate-half order.
        max_batch_size, max_seq_len, page_size: size the KV-cache pool (see `load_pretrained_graph`).
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
        self, config: LlamaConfig, weights: Mapping[str, GraphWeight], *, interleaved: bool = False, max_batch_size: int = 8, max_seq_len: int | None = None,
        page_size: int = 16, session: InferenceSession | None = None,
    ):  # fmt: skip
        self.config = c = config
        self.max_seq_len = int(max_seq_len or c.max_position_embeddings)
        if self.max_seq_len < 1 or int(max_batch_size) < 1:
            raise ValueError(f"LlamaGraphModel: max_seq_len ({self.max_seq_len}) and max_batch_size ({max_batch_size}) must be >= 1")
        self.kv_params = KVCacheParams(graph_dtype(weights), n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, page_size=int(page_size))
        self.transformer = llama_transformer(c, weights, self.kv_params, _rope(c, self.max_seq_len, interleaved))
        registry = self.transformer.raw_state_dict()  # also names every Weight for the graph
        if set(registry) != set(weights):
            raise ValueError(f"LlamaGraphModel: weights {sorted(set(weights) ^ set(registry))[:4]} do not match the model's state dict")
        types = [TensorType(DType.int64, ["total_seq_len"]), TensorType(DType.uint32, ["batch_plus_1"]), *self.kv_params.input_types()]
        with Graph("llama_graph", input_types=types) as graph:
            kv = PagedCacheValues.from_graph_inputs(graph.inputs[2:])
            graph.output(*self.transformer(graph.inputs[0].tensor, kv, 1, graph.inputs[1].tensor))
        self.compiled = (session or InferenceSession()).load(graph, weights_registry={k: v for k, (v, _) in weights.items()})
        pages = -(-self.max_seq_len // int(page_size))
        self.cache = PagedKVCacheManager(self.kv_params, c.num_hidden_layers, total_num_pages=int(max_batch_size) * pages, max_batch_size=int(max_batch_size), max_seq_len=self.max_seq_len)

    # ── one step ──
    def _step(self, seq_ids: list[int], chunks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Run the new tokens ``chunks[b]`` of each sequence; returns (last logits [B, V], all logits [total, V])."""
        counts = [len(t) for t in chunks]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.uint32)
        tokens = np.concatenate(chunks).astype(np.int64)
        last, logits, _ = self.compiled.execute(tokens, offsets, *self.cache.fetch(seq_ids, counts))
        self.cache.step(seq_ids, counts)
        return last.to_numpy(), logits.to_numpy()

    def _prompts(self, input_ids: Any, where: str) -> list[np.ndarray]:
        rows = prompt_rows(f"LlamaGraphModel.{where}", input_ids, self.config.vocab_size)
        if len(rows) > self.cache.max_batch_size:
            raise ValueError(f"LlamaGraphModel.{where}: batch of {len(rows)} prompts; this model was built for max_batch_size={self.cache.max_batch_size}")
        return rows

    def _session(self, n: int) -> list[int]:
        return [self.cache.claim() for _ in range(n)]

    def _release(self, seq_ids: list[int]) -> None:
        for s in seq_ids:
            self.cache.release(s)

    # ── forward ──
    def forward_ragged(self, prompts: Any) -> list[np.ndarray]:
        """Logits of every token of prompts of different lengths, in one ragged prefill: one float32 ``[T_b, vocab]`` per prompt."""
        rows = self._prompts(prompts, "forward_ragged")
        ids = self._session(len(rows))
        try:
            _, logits = self._step(ids, rows)
        finally:
            self._release(ids)
        bounds = np.cumsum([0] + [len(r) for r in rows])
        return [logits[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def __call__(self, input_ids: Any) -> np.ndarray:
        """float32 logits ``[B, T, vocab]`` of ``[B, T]`` token ids (array or nested list)."""
        ids = np.asarray(input_ids.to_numpy() if hasattr(input_ids, "to_numpy") else input_ids)
        if ids.ndim != 2:
            raise ValueError(f"LlamaGraphModel: input_ids must be [batch, seq] token ids, got shape {list(ids.shape)}; use forward_ragged for prompts of different lengths")
        return np.stack(self.forward_ragged(list(ids)))

    # ── generation ──
    def generate(
        self, input_ids: Any, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
        *, eos_token_id: int | None = None, stream: Callable[[np.ndarray], Any] | None = None, progress: bool = False,
    ) -> np.ndarray:  # fmt: skip
        """Generate ``max_new_tokens`` tokens after each prompt: one ragged prefill, then one decode step per token.

        Every decode step feeds ``[B]`` tokens with a fixed-width page table, so all
        steps reuse one compiled executable. Sampling happens on the host.

        Args:
            input_ids: ``[B, T]`` token ids, or a list of B prompts of different lengths.
            max_new_tokens: tokens to append per prompt (>= 1).
            temperature: 0 for greedy; > 0 samples from ``softmax(logits / temperature)``.
            top_k, top_p: restrict sampling to the k most likely tokens / the nucleus of mass top_p.
            seed: makes sampling reproducible.
            eos_token_id: a row that emits it keeps emitting it; stops early once every row has.
            stream: called after every step with the new tokens ``int64 [B]``.
            progress: show a tqdm bar over the steps.

        Returns:
            int64 ``[B, n]`` with the new tokens only (``n = max_new_tokens`` unless every row hit EOS).
        """
        check_generation("LlamaGraphModel.generate", max_new_tokens, temperature, top_k, top_p, self.config.vocab_size)
        pick = _sampler(temperature, top_k, top_p, seed, self.config.vocab_size)
        rows = self._prompts(input_ids, "generate")
        longest = max(len(r) for r in rows) + int(max_new_tokens) - 1
        if longest > self.max_seq_len:
            raise ValueError(f"LlamaGraphModel.generate: prompt + new tokens need {longest} cache positions; max_seq_len is {self.max_seq_len}")
        ids = self._session(len(rows))
        out: list[np.ndarray] = []
        done = np.zeros(len(rows), bool)
        bar = _progress(progress, int(max_new_tokens))
        try:
            last, _ = self._step(ids, rows)
            for step in range(int(max_new_tokens)):
                tokens = pick(last)
                if eos_token_id is not None:
                    tokens = np.where(done, eos_token_id, tokens)
                    done |= tokens == eos_token_id
                out.append(tokens)
                bar.update(1)
                if stream is not None:
                    stream(tokens)
                if step + 1 == max_new_tokens or done.all():
                    break
                last, _ = self._step(ids, [t[None] for t in tokens])
        finally:
            bar.close()
            self._release(ids)
        return np.stack(out, axis=1)

    def __repr__(self) -> str:
        c = self.config
        return f"LlamaGraphModel(layers={c.num_hidden_layers}, hidden={c.hidden_size}, vocab={c.vocab_size}, max_seq_len={self.max_seq_len}, page_size={self.kv_params.page_size})"


def _sampler(temperature: float, top_k: int | None, top_p: float | None, seed: int | None, vocab: int) -> Callable[[np.ndarray], np.ndarray]:
    """Next-token choice from float32 logits ``[B, vocab]``: argmax, or temperature / top-k / top-p sampling (arguments checked by `check_generation`)."""
    if temperature == 0:
        return lambda logits: logits.argmax(-1).astype(np.int64)
    rng = np.random.default_rng(seed)

    def pick(logits: np.ndarray) -> np.ndarray:
        z = logits.astype(np.float64) / temperature
        if top_k is not None:
            kth = np.sort(z, -1)[:, -int(top_k)][:, None]
            z = np.where(z < kth, -np.inf, z)
        probs = np.exp(z - z.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        if top_p is not None:
            order = np.argsort(-probs, -1)
            sorted_p = np.take_along_axis(probs, order, -1)
            keep_sorted = np.cumsum(sorted_p, -1) - sorted_p < top_p  # the smallest prefix reaching top_p
            keep = np.zeros_like(keep_sorted)
            np.put_along_axis(keep, order, keep_sorted, -1)
            probs = np.where(keep, probs, 0.0)
            probs /= probs.sum(-1, keepdims=True)
        return np.array([rng.choice(vocab, p=p) for p in probs], np.int64)

    return pick
