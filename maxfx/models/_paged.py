"""The runtime of the graph-API models: a `maxfx.nn.Transformer` compiled over a ragged batch and the paged KV cache.

`PagedCausalLM` is what `load_pretrained_graph` returns for every architecture
(`maxfx.models.LlamaGraphModel`, `maxfx.models.GPT2GraphModel`). A subclass says
how its `Transformer` is built (`build_transformer`) and how many layers and KV
heads it has; this class compiles one graph (``tokens [total]``,
``input_row_offsets [B + 1]`` and the cache inputs → every token's logits) with
the checkpoint bound through ``weights_registry``, owns one host-side
`PagedKVCacheManager`, and runs ragged prefill, decode and host-side sampling.
Every decode step has the same input shapes, so it reuses one executable.

Example:
    >>> from maxfx.models import load_pretrained_graph
    >>> model = load_pretrained_graph("tests/data/models/tiny_gpt2")  # doctest: +SKIP
    >>> isinstance(model, PagedCausalLM), model.generate([[5, 6, 7]], max_new_tokens=4).shape  # doctest: +SKIP
    (True, (1, 4))
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.dtypes import DType
from maxfx.engine import InferenceSession
from maxfx.generation._sampling import SamplingRows, choose
from maxfx.graph import Graph, TensorType
from maxfx.models._generate import _progress, _rows, check_generation
from maxfx.models._source import Q8_0
from maxfx.models._token_ids import check_token_ids
from maxfx.nn._q8 import split_q8_0
from maxfx.nn.kv_cache import KVCacheParams, PagedCacheValues, PagedKVCacheManager
from maxfx.nn.transformer import Transformer

__all__ = ["GraphWeight", "PagedCausalLM", "graph_dtype", "q8_graph_entries"]

# A graph weight: (value, format), the format as in StoredTensor (Q8_0 for both parts of a Q8_0 matrix).
GraphWeight = tuple[np.ndarray, Any]


def q8_graph_entries(name: str, value: np.ndarray, fmt: Any) -> dict[str, GraphWeight]:
    """The graph weights of one stored tensor: itself, or a Q8_0 matrix's ``weight`` (int8 quants) and ``scales``
    (float16), a byte view.
    """
    value = np.ascontiguousarray(value)
    if fmt != Q8_0:
        return {name: (value, fmt)}
    quants, scales = split_q8_0(value)
    return {name: (quants, Q8_0), name.removesuffix("weight") + "scales": (scales, Q8_0)}


def graph_dtype(w: Mapping[str, GraphWeight]) -> DType:
    """The float dtype the graph computes in: its final norm's (GGUF and quantized checkpoints keep only norms as
    floats).
    """
    return DType.from_numpy(w["norm.weight"][0].dtype)


class PagedCausalLM(abc.ABC):
    """A causal LM compiled as one `maxfx.nn` graph: ``model(input_ids) -> logits [B, T, vocab]`` and ``generate``.

    The graph takes a ragged batch (``tokens [total]``, ``input_row_offsets [B + 1]``)
    plus the paged KV cache and returns every token's logits; prefill and decode
    run the same program.

    Args:
        config: the architecture's config.
        weights: `Transformer` state-dict name → (array, format) (see `GraphWeight`).
        max_batch_size: sizes the KV-cache pool (see `load_pretrained_graph`).
        max_seq_len: sizes the KV-cache pool; defaults to the config's ``max_position_embeddings``.
        page_size: tokens per KV-cache page (see `load_pretrained_graph`).
        session: the `InferenceSession` to load into (default a new CPU session).

    Attributes:
        config: the config.
        transformer: the `maxfx.nn.Transformer` the graph was built from.
        compiled: the `InferenceSession` model.
        kv_params, cache: the `KVCacheParams` and the `PagedKVCacheManager` (one pool, reused by every call).
    """

    def __init__(
        self,
        config: Any,
        weights: Mapping[str, GraphWeight],
        *,
        max_batch_size: int = 8,
        max_seq_len: int | None = None,
        page_size: int = 16,
        session: InferenceSession | None = None,
    ):
        name = type(self).__name__
        self.config = c = config
        self.max_seq_len = int(max_seq_len or c.max_position_embeddings)
        if self.max_seq_len < 1 or int(max_batch_size) < 1:
            raise ValueError(
                f"{name}: max_seq_len ({self.max_seq_len}) and max_batch_size ({max_batch_size}) must be >= 1"
            )
        n_kv_heads, head_dim = self.kv_shape()
        self.kv_params = KVCacheParams(
            graph_dtype(weights), n_kv_heads=n_kv_heads, head_dim=head_dim, page_size=int(page_size)
        )
        self.transformer = self.build_transformer(weights)
        registry = self.transformer.raw_state_dict()  # also names every Weight for the graph
        if set(registry) != set(weights):
            raise ValueError(
                f"{name}: weights {sorted(set(weights) ^ set(registry))[:4]} do not match the model's state dict"
            )
        types = [
            TensorType(DType.int64, ["total_seq_len"]),
            TensorType(DType.uint32, ["batch_plus_1"]),
            *self.kv_params.input_types(),
        ]
        with Graph(f"{c.architecture}_graph", input_types=types) as graph:
            kv = PagedCacheValues.from_graph_inputs(graph.inputs[2:])
            graph.output(*self.transformer(graph.inputs[0].tensor, kv, 1, graph.inputs[1].tensor))
        self.compiled = (session or InferenceSession()).load(
            graph, weights_registry={k: v for k, (v, _) in weights.items()}
        )
        pages = -(-self.max_seq_len // int(page_size))
        self.cache = PagedKVCacheManager(
            self.kv_params,
            self.num_layers,
            total_num_pages=int(max_batch_size) * pages,
            max_batch_size=int(max_batch_size),
            max_seq_len=self.max_seq_len,
        )

    @property
    def vocab_size(self) -> int:
        """Logits per token: the config's ``vocab_size`` (every architecture's config names it so)."""
        return self.config.vocab_size

    # ── what a subclass says ──
    @property
    @abc.abstractmethod
    def num_layers(self) -> int:
        """Decoder layers (one KV-cache slot each)."""

    @abc.abstractmethod
    def kv_shape(self) -> tuple[int, int]:
        """(KV heads, head dim) of the cache."""

    @abc.abstractmethod
    def build_transformer(self, weights: Mapping[str, GraphWeight]) -> Transformer:
        """The `Transformer` (``ReturnLogits.ALL``) whose state dict is ``weights``'s names, over ``self.kv_params``."""

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
        """``input_ids`` as int64 rows; `TokenIdError` for an id outside the vocabulary (the graph's gather would clamp
        it).
        """
        rows = _rows(input_ids)
        for i, row in enumerate(rows):
            check_token_ids(f"{where}, prompt {i}" if len(rows) > 1 else where, row, self.vocab_size)
        if len(rows) > self.cache.max_batch_size:
            raise ValueError(
                f"{where}: batch of {len(rows)} prompts; this model was built for "
                f"max_batch_size={self.cache.max_batch_size}"
            )
        return rows

    def _session(self, n: int) -> list[int]:
        return [self.cache.claim() for _ in range(n)]

    def _release(self, seq_ids: list[int]) -> None:
        for s in seq_ids:
            self.cache.release(s)

    # ── forward ──
    def forward_ragged(self, prompts: Any) -> list[np.ndarray]:
        """Logits of every token of prompts of different lengths, in one ragged prefill: one float32 ``[T_b, vocab]``
        per prompt.
        """
        return self._forward(prompts, f"{type(self).__name__}.forward_ragged")

    def _forward(self, prompts: Any, where: str) -> list[np.ndarray]:
        rows = self._prompts(prompts, where)
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
            raise ValueError(
                f"{type(self).__name__}: input_ids must be [batch, seq] token ids, got shape {list(ids.shape)}; use "
                "forward_ragged for prompts of different lengths"
            )
        return np.stack(self._forward(list(ids), type(self).__name__))

    # ── generation ──
    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        eos_token_id: int | None = None,
        stream: Callable[[np.ndarray], Any] | None = None,
        progress: bool | None = None,
    ) -> np.ndarray:
        """Generate ``max_new_tokens`` tokens after each prompt: one ragged prefill, then one decode step per token.

        Every decode step feeds ``[B]`` tokens with a fixed-width page table, so all
        steps reuse one compiled executable. Sampling happens on the host.

        Args:
            input_ids: ``[B, T]`` token ids, or a list of B prompts of different lengths.
            max_new_tokens: tokens to append per prompt (>= 1).
            temperature: 0 for greedy; > 0 samples from ``softmax(logits / temperature)``.
            top_k: restrict sampling to the k most likely tokens.
            top_p: restrict sampling to the nucleus of probability mass top_p.
            seed: makes sampling reproducible.
            eos_token_id: a row that emits it keeps emitting it; stops early once every row has.
            stream: called after every step with the new tokens ``int64 [B]``.
            progress: show a tqdm bar over the steps (None: only for long generations, see `generate`).

        Returns:
            int64 ``[B, n]`` with the new tokens only (``n = max_new_tokens`` unless every row hit EOS).
        """
        check_generation(f"{type(self).__name__}.generate", max_new_tokens, temperature, top_k, top_p, self.vocab_size)
        pick = _sampler(temperature, top_k, top_p, seed)
        rows = self._prompts(input_ids, f"{type(self).__name__}.generate")
        longest = max(len(r) for r in rows) + int(max_new_tokens) - 1
        if longest > self.max_seq_len:
            raise ValueError(
                f"{type(self).__name__}.generate: prompt + new tokens need {longest} cache positions; max_seq_len is "
                f"{self.max_seq_len}"
            )
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
        return (
            f"{type(self).__name__}(layers={self.num_layers}, vocab={self.vocab_size}, max_seq_len={self.max_seq_len}, "
            f"page_size={self.kv_params.page_size})"
        )


def _sampler(
    temperature: float, top_k: int | None, top_p: float | None, seed: int | None
) -> Callable[[np.ndarray], np.ndarray]:
    """Next-token choice from float32 logits ``[B, vocab]`` (arguments checked by `check_generation`).

    The engine's sampling (`maxfx.generation._sampling.choose`): argmax for
    ``temperature == 0``, else top-k / top-p filtering and a Gumbel-max draw keyed by
    (row seed, step). Row ``i`` of a batch draws with seed ``seed + i``, so equal
    prompts in one batch still sample independently; no ``seed`` picks a random one.
    """
    if temperature == 0:
        return lambda logits: logits.argmax(-1).astype(np.int64)
    base = int(np.random.SeedSequence().entropy if seed is None else seed) & 0xFFFFFFFFFFFFFFFF
    row = {
        "temperature": float(temperature),
        "top_k": -1 if top_k is None else int(top_k),
        "top_p": 1.0 if top_p is None else float(top_p),
    }
    steps = itertools.count()

    def pick(logits: np.ndarray) -> np.ndarray:
        n, step = logits.shape[0], next(steps)
        rows = SamplingRows.build([{**row, "seed": (base + i) & 0xFFFFFFFFFFFFFFFF} for i in range(n)], step=[step] * n)
        return np.asarray(
            _choose(jnp.asarray(logits, jnp.float32), rows.arrays(), filters=rows.filters, sample=True)
        ).astype(np.int64)

    return pick


_choose = jax.jit(choose, static_argnames=("filters", "sample"))
