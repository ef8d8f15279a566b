"""Llama as a graph of `maxfx.nn` layers, run by `InferenceSession` over the paged KV cache.

The second style of `maxfx.models`' Llama (the first is the eager-Module
`LlamaForCausalLM`): `load_pretrained_graph` reads the same checkpoints (HF
folder with safetensors or ``.bin``, or a ``.gguf`` file), builds a
`maxfx.nn.Transformer` (Embedding, TransformerBlock(AttentionWithRope, MLP,
RMSNorm), RMSNorm, Linear head), binds the checkpoint through
``weights_registry`` and compiles one graph over a ragged batch. One host-side
`PagedKVCacheManager` owns the cache pool; every decode step has the same input
shapes, so it reuses one executable.

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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx import nn
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType
from maxfx.graph.weights import GGUFWeights
from maxfx.models._config import ConfigError, LlamaConfig
from maxfx.models._generate import _progress, _rows
from maxfx.models._loading import check_architecture, hf_checkpoint_source, read_hf_config
from maxfx.models._source import Q8_0, GGUFSource, ParamSource
from maxfx.nn._q8 import Q8AttentionWithRope, Q8Embedding, Q8Linear, split_q8_0
from maxfx.nn.attention import AttentionWithRope, GGUFQAttentionWithRope
from maxfx.nn.kv_cache import KVCacheParams, PagedCacheValues, PagedKVCacheManager
from maxfx.nn.rotary_embedding import Llama3RotaryEmbedding
from maxfx.nn.transformer import ReturnLogits, Transformer, TransformerBlock

__all__ = ["LlamaGraphModel", "load_pretrained_graph"]

_CPU = DeviceRef.CPU()
# A weight: (value, format). Packed GGUF blocks carry their QuantizationEncoding, Q8_0 parts Q8_0, floats None.
_Format = QuantizationEncoding | str | None
_Weight = tuple[np.ndarray, _Format]
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


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
    if not p.exists():
        raise FileNotFoundError(f"load_pretrained_graph: {str(p)!r} does not exist")
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"load_pretrained_graph: {str(p)!r} is a file but not .gguf; pass a folder with config.json and weights, or a .gguf file")
        config, weights = _from_gguf(p, dtype)
    else:
        config, weights = _from_folder(p, dtype)
    return LlamaGraphModel(config, weights, max_batch_size=max_batch_size, max_seq_len=max_seq_len, page_size=page_size)


def _llama_only(arch: Any, where: str, key: str) -> None:
    check_architecture(arch, where, key)  # unknown architectures: the same error as load_pretrained
    if arch != "llama":
        raise ConfigError(f"{where}: the graph-API model supports the llama architecture only, got {key}={arch!r} (use load_pretrained)")


def _from_folder(folder: Path, dtype: DType | None) -> tuple[LlamaConfig, dict[str, _Weight]]:
    raw, where = read_hf_config(folder, "load_pretrained_graph")
    _llama_only(raw["model_type"], where, "model_type")
    config = LlamaConfig.from_hf(raw, where)
    return config, _collect(config, hf_checkpoint_source(folder, dtype, where))


def _from_gguf(path: Path, dtype: DType | None) -> tuple[LlamaConfig, dict[str, _Weight]]:
    reader = GGUFWeights(path)
    _llama_only(reader.metadata.get("general.architecture"), str(path), "general.architecture")
    names = {n for n, _ in reader.items()}
    factors = reader["rope_freqs.weight"].data().to_numpy() if "rope_freqs.weight" in names else None
    config = LlamaConfig.from_gguf(reader.metadata, names, factors, str(path))
    return config, _collect(config, GGUFSource(reader, str(path), dtype or DType.float32, f"the metadata of {path.name}"))


class _StateDict(dict):
    """State-dict name → `_Weight`; a Q8_0 matrix's raw blocks become two entries, ``weight`` (int8) and ``scales`` (float16)."""

    def __setitem__(self, name: str, weight: _Weight) -> None:
        value, fmt = weight
        if fmt != Q8_0:
            return super().__setitem__(name, weight)
        quants, scales = split_q8_0(value)  # a byte view: the values stay 8-bit
        super().__setitem__(name, (quants, Q8_0))
        super().__setitem__(name.removesuffix("weight") + "scales", (scales, Q8_0))


def _collect(c: LlamaConfig, src: ParamSource) -> dict[str, _Weight]:
    """Every tensor of the model under its `Transformer` state-dict name (HF's without ``model.``), packed weights kept packed."""
    hd, e, ff = c.head_dim, c.hidden_size, c.intermediate_size
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    shapes = {"q_proj": (q, e), "k_proj": (kv, e), "v_proj": (kv, e), "o_proj": (e, q), "gate_proj": (ff, e), "up_proj": (ff, e), "down_proj": (e, ff)}
    heads = {"q_proj": c.num_attention_heads, "k_proj": c.num_key_value_heads}

    def read(hf: str, shape: tuple[int, ...]) -> _Weight:
        w = src.read(hf, shape, rope_heads=heads.get(hf.rsplit(".", 2)[-2]), keep_blocks=True)
        return np.ascontiguousarray(w.value), w.format

    out: dict[str, _Weight] = _StateDict()
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        for n in _PROJ:
            out[f"{p}self_attn.{n}.weight"] = read(f"model.{p}self_attn.{n}.weight", shapes[n])
        for n in _MLP:
            out[f"{p}mlp.{n}.weight"] = read(f"model.{p}mlp.{n}.weight", shapes[n])
        for n in ("input_layernorm", "post_attention_layernorm"):
            out[f"{p}{n}.weight"] = read(f"model.{p}{n}.weight", (e,))
    out["embed_tokens.weight"] = read("model.embed_tokens.weight", (c.vocab_size, e))
    out["norm.weight"] = read("model.norm.weight", (e,))
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = read("lm_head.weight", (c.vocab_size, e))
    src.finish()
    return dict(out)


# ─── the graph ────────────────────────────────────────────────────────────


def _float_dtype(weights: dict[str, _Weight]) -> DType:
    return DType.from_numpy(weights["norm.weight"][0].dtype)


def _rope(c: LlamaConfig, max_seq_len: int, interleaved: bool) -> Any:
    args = (c.hidden_size, c.num_attention_heads, c.rope_theta, max_seq_len)
    if c.rope_freq_factors is not None:
        # GGUF stores per-frequency divisors instead of Llama-3 parameters: hand the layer its table.
        angles = np.outer(np.arange(2 * max_seq_len, dtype=np.float64), c.inv_freq())
        table = np.stack([np.cos(angles), np.sin(angles)], -1).reshape(2 * max_seq_len, c.head_dim).astype(np.float32)
        return Llama3RotaryEmbedding(*args, head_dim=c.head_dim, _freqs_cis=table, interleaved=interleaved)
    return Llama3RotaryEmbedding(*args, head_dim=c.head_dim, interleaved=interleaved, scaling_params=c.llama3_scaling())


def _linear(in_dim: int, out_dim: int, dtype: DType, enc: _Format) -> nn.Linear | Q8Linear:
    if enc == Q8_0:
        return Q8Linear(in_dim, out_dim, dtype, _CPU)
    return nn.Linear(in_dim, out_dim, dtype, _CPU, quantization_encoding=enc)


def _attention(c: LlamaConfig, w: dict[str, _Weight], prefix: str, rope: Any, kv_params: KVCacheParams, dtype: DType) -> Any:
    encs = {n: w[f"{prefix}self_attn.{n}.weight"][1] for n in _PROJ}
    qkv = {encs["q_proj"], encs["k_proj"], encs["v_proj"]}
    if len(qkv) != 1:
        raise ValueError(f"LlamaGraphModel: {prefix}self_attn q/k/v projections mix weight formats {encs}; the fused QKV kernels need one format")
    (enc,) = qkv
    kw = dict(rope=rope, num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, hidden_size=c.hidden_size, kv_params=kv_params)
    if enc is None:
        attn = AttentionWithRope(**kw, dtype=dtype)
    elif enc == Q8_0:  # the fused QKV kernel gets a wqkv decoded in the graph
        attn = Q8AttentionWithRope(**kw, dtype=dtype)
    else:
        attn = GGUFQAttentionWithRope(**kw, dtype=dtype, quantization_encoding=enc)
    if encs["o_proj"] != enc:
        attn.o_proj = _linear(c.num_attention_heads * c.head_dim, c.hidden_size, dtype, encs["o_proj"])
    return attn


def _mlp(c: LlamaConfig, w: dict[str, _Weight], prefix: str, dtype: DType) -> nn.MLP:
    mlp = nn.MLP(dtype, None, c.hidden_size, c.intermediate_size, [_CPU])
    dims = {"gate_proj": (c.hidden_size, c.intermediate_size), "up_proj": (c.hidden_size, c.intermediate_size), "down_proj": (c.intermediate_size, c.hidden_size)}
    for n in _MLP:  # each projection in its own format (GGUF files mix block types)
        setattr(mlp, n, _linear(*dims[n], dtype, w[f"{prefix}mlp.{n}.weight"][1]))
    return mlp


def build_transformer(c: LlamaConfig, w: dict[str, _Weight], kv_params: KVCacheParams, max_seq_len: int, interleaved: bool) -> Transformer:
    """The `maxfx.nn.Transformer` for ``c`` whose weight formats follow ``w`` (state-dict name → (value, encoding))."""
    dtype = _float_dtype(w)
    rope = _rope(c, max_seq_len, interleaved)
    blocks = []
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        norms = [nn.RMSNorm(c.hidden_size, dtype, eps=c.rms_norm_eps) for _ in range(2)]
        blocks.append(TransformerBlock(_attention(c, w, p, rope, kv_params, dtype), _mlp(c, w, p, dtype), *norms))
    emb_enc = w["embed_tokens.weight"][1]
    if emb_enc == Q8_0:
        embedding = Q8Embedding(c.vocab_size, c.hidden_size, dtype, _CPU)
    else:
        embedding = nn.Embedding(c.vocab_size, c.hidden_size, dtype, _CPU, quantization_encoding=emb_enc)
    if c.tie_word_embeddings and emb_enc == Q8_0:
        head = embedding.tied_head()  # one table (quants + scales), two uses
    elif c.tie_word_embeddings:
        head = _linear(c.hidden_size, c.vocab_size, dtype, emb_enc)
        head.set_shared_weight("weight", embedding.weight)  # one tensor, two uses
    else:
        head = _linear(c.hidden_size, c.vocab_size, dtype, w["lm_head.weight"][1])
    norm = nn.RMSNorm(c.hidden_size, dtype, eps=c.rms_norm_eps)
    return Transformer(c.hidden_size, c.num_attention_heads, blocks, norm, head, embedding, kv_params, rope, return_logits=ReturnLogits.ALL)


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
        self, config: LlamaConfig, weights: dict[str, _Weight], *, interleaved: bool = False, max_batch_size: int = 8, max_seq_len: int | None = None,
        page_size: int = 16, session: InferenceSession | None = None,
    ):  # fmt: skip
        self.config = c = config
        self.max_seq_len = int(max_seq_len or c.max_position_embeddings)
        if self.max_seq_len < 1 or int(max_batch_size) < 1:
            raise ValueError(f"LlamaGraphModel: max_seq_len ({self.max_seq_len}) and max_batch_size ({max_batch_size}) must be >= 1")
        dtype = _float_dtype(weights)
        self.kv_params = KVCacheParams(dtype, n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, page_size=int(page_size))
        self.transformer = build_transformer(c, weights, self.kv_params, self.max_seq_len, interleaved)
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
        rows = _rows(input_ids)
        if len(rows) > self.cache.max_batch_size:
            raise ValueError(f"LlamaGraphModel.{where}: batch of {len(rows)} prompts; this model was built for max_batch_size={self.cache.max_batch_size}")
        for i, r in enumerate(rows):
            if r.min() < 0 or r.max() >= self.config.vocab_size:
                raise ValueError(f"LlamaGraphModel.{where}: prompt {i} has token ids outside [0, {self.config.vocab_size})")
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
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise ValueError(f"LlamaGraphModel.generate: max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
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
    """Next-token choice from float32 logits ``[B, vocab]``: argmax, or temperature / top-k / top-p sampling."""
    if not temperature >= 0:
        raise ValueError(f"LlamaGraphModel.generate: temperature must be >= 0, got {temperature!r}")
    if top_k is not None and not 1 <= int(top_k) <= vocab:
        raise ValueError(f"LlamaGraphModel.generate: top_k must be in [1, {vocab}], got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"LlamaGraphModel.generate: top_p must be in (0, 1], got {top_p!r}")
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
