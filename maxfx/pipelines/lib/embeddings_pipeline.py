"""`EmbeddingsPipeline`: MAX's single-step embeddings pipeline, on a `maxfx.models` decoder.

The pipeline loads the configured checkpoint with `maxfx.models.load_pretrained`
(a Hugging Face folder or a ``.gguf`` file) and embeds token ids with the model's
final hidden states (after the final norm), ``model.hidden(ids, positions, None)``.
``execute`` takes `~maxfx.interfaces.EmbeddingsGenerationInputs` and returns one
`~maxfx.interfaces.EmbeddingsGenerationOutput` (float32) per request in one step:

- ``pipeline_config.pool_embeddings=True`` (MAX's default): one ``[hidden]`` vector
  per request, pooled over its tokens with `EmbeddingsPipeline.pooling`;
- ``pool_embeddings=False``: the per-token states ``[tokens, hidden]``.

Pooling kinds (`POOLING_KINDS`): ``"mean"`` (the average over the request's tokens),
``"last_token"`` (the state of its last token, as Qwen3-Embedding and other
decoder embedders use) and ``"cls"`` (its first token). The kind is, in order:
the ``pooling=`` keyword; the checkpoint's sentence-transformers pooling config
(``modules.json`` → ``1_Pooling/config.json``: ``pooling_mode_mean_tokens``,
``pooling_mode_lasttoken``, ``pooling_mode_cls_token``); ``"last_token"`` for the
Qwen3 architecture (Qwen3-Embedding style, as MAX's Qwen3 embedding graph); else
``"mean"``. ``normalize=True`` divides pooled vectors by their L2 norm; by default
it is on only when the checkpoint's ``modules.json`` lists a sentence-transformers
``Normalize`` module.

One ``execute`` call runs its requests in as few programs as it can: requests are
sorted by length, grouped (at most ``pipeline_config.max_batch_size`` rows and
``prefill_chunk_size`` padded tokens a group), right-padded to a power-of-two
length (at least 8) and a power-of-two row count, and run through one jitted
forward per (rows, length) shape. The models are causal, so the padding after a
row's tokens never reaches them; pooling reads only the row's own tokens.

Example:
    >>> import numpy as np
    >>> from maxfx.interfaces import EmbeddingsGenerationInputs
    >>> from maxfx.pipelines import PipelineConfig
    >>> config = PipelineConfig(model_path="tests/data/models/tiny_llama")
    >>> pipeline = EmbeddingsPipeline(config, None, None, {}, None)  # doctest: +SKIP
    >>> ctx = EmbeddingsRequestContext([1, 5, 6, 7])
    >>> out = pipeline.execute(EmbeddingsGenerationInputs([{ctx.request_id: ctx}]))  # doctest: +SKIP
    >>> out[ctx.request_id].embeddings.shape, pipeline.pooling  # doctest: +SKIP
    ((64,), 'mean')
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt

from lowering.dtypes import DType
from lowering.x64 import jit
from maxfx import driver
from maxfx._json_file import read_json_file
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.interfaces import (
    EmbeddingsContext,
    EmbeddingsGenerationInputs,
    EmbeddingsGenerationOutput,
    GenerationStatus,
    Pipeline,
    RequestID,
)
from maxfx.models import load_pretrained
from maxfx.models._layers import positions

__all__ = ["POOLING_KINDS", "EmbeddingsPipeline", "EmbeddingsRequestContext"]

logger = logging.getLogger("max.pipelines")

POOLING_KINDS: tuple[str, ...] = ("mean", "last_token", "cls")
"""The pooling kinds `EmbeddingsPipeline` takes (``pooling=``)."""

# Architectures (maxfx.models config ``architecture``) whose embedding models pool the last token.
_LAST_TOKEN_ARCHITECTURES = frozenset({"qwen3"})
# sentence-transformers 1_Pooling/config.json switches -> our kinds.
_ST_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last_token",
    "pooling_mode_cls_token": "cls",
}
_ST_UNSUPPORTED = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
_MIN_LENGTH_BUCKET = 8
_NORM_EPS = 1e-12  # torch.nn.functional.normalize's, which sentence-transformers' Normalize uses
_OWNER = "EmbeddingsPipeline"


class EmbeddingsRequestContext(EmbeddingsContext):
    """A concrete `~maxfx.interfaces.EmbeddingsContext`: the token ids of one embeddings request.

    maxfx's interfaces define the protocol only; `TextTokenizer.new_context` returns a
    `~maxfx.generation.TextContext`, which `EmbeddingsPipeline` takes too. Use this
    class to embed token ids without a tokenizer.

    Args:
        tokens: the token ids to embed (1-D integers).
        request_id: the request's id (default: a fresh `RequestID`).
        model_name: the model the request targets.

    Raises:
        ValueError: ``tokens`` is not a 1-D sequence of integers.

    Example:
        >>> ctx = EmbeddingsRequestContext([5, 6, 7], request_id="a")
        >>> ctx.request_id, ctx.tokens.tolist(), ctx.active_length, ctx.is_done
        (RequestID('a'), [5, 6, 7], 3, False)
    """

    def __init__(
        self, tokens: Iterable[int] | npt.ArrayLike, request_id: RequestID | str | None = None, model_name: str = ""
    ) -> None:
        arr = np.asarray(list(tokens) if not isinstance(tokens, np.ndarray) else tokens)
        if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
            raise ValueError(
                f"EmbeddingsRequestContext: tokens must be a 1-D sequence of int token ids, got {arr.dtype} of shape "
                f"{list(arr.shape)}"
            )
        self._tokens = arr.astype(np.int64)
        self._request_id = RequestID() if request_id is None else RequestID(str(request_id))
        self._model_name = str(model_name)
        self._status = GenerationStatus.ACTIVE

    def __repr__(self) -> str:
        return f"EmbeddingsRequestContext(request_id={self._request_id!r}, tokens={len(self._tokens)})"


class EmbeddingsPipeline(Pipeline[EmbeddingsGenerationInputs, EmbeddingsGenerationOutput]):
    """MAX's ``EmbeddingsPipeline``: embeddings of token ids in one step (see the module docstring).

    Args:
        pipeline_config: the `PipelineConfig`; its ``model_config.local_model_path``
            is loaded with `maxfx.models.load_pretrained` (float ``quantization_encoding``
            values convert the weights; explicit ``device_specs`` pick the device),
            ``pool_embeddings`` chooses pooled or per-token output, ``max_length``
            bounds a request's tokens, ``max_batch_size`` and ``prefill_chunk_size``
            bound one program's rows and padded tokens.
        pipeline_model: MAX's model class; accepted and unused (maxfx builds the model
            from the checkpoint).
        eos_token_id: accepted for MAX compatibility (kept as `eos_token_id`; unused).
        weight_adapters: accepted for MAX compatibility (unused).
        tokenizer: the `PipelineTokenizer` (kept as `tokenizer`; the pipeline takes
            token ids, so it is not used to embed).
        pooling: a kind of `POOLING_KINDS`; None picks the checkpoint's (see the module docstring).
        normalize: L2-normalize pooled embeddings; None: as the checkpoint's
            sentence-transformers modules say (off when it has none).
        model: an already loaded `maxfx.models.CausalLM` to use instead of loading one.

    Raises:
        ValueError: an unknown ``pooling``, a sentence-transformers pooling mode maxfx
            does not implement (pass ``pooling=``), or a checkpoint that does not load.
        TypeError: ``model`` (or the loaded model) has no ``hidden`` method.
    """

    POOLING_KINDS: ClassVar[tuple[str, ...]] = POOLING_KINDS

    def __init__(
        self,
        pipeline_config: Any,
        pipeline_model: Any = None,
        eos_token_id: int | None = None,
        weight_adapters: Mapping[Any, Any] | None = None,
        tokenizer: Any = None,
        *,
        pooling: str | None = None,
        normalize: bool | None = None,
        model: Any = None,
    ) -> None:
        if pooling is not None and pooling not in POOLING_KINDS:
            raise ValueError(f"{_OWNER}: pooling must be one of {list(POOLING_KINDS)} or None, got {pooling!r}")
        if normalize is not None and not isinstance(normalize, (bool, np.bool_)):
            raise ValueError(f"{_OWNER}: normalize must be a bool or None, got {normalize!r}")
        self._pipeline_config = pipeline_config
        self._pipeline_model = pipeline_model
        self._weight_adapters = dict(weight_adapters or {})
        self.eos_token_id = eos_token_id
        """The EOS id the registry passed (unused: embeddings take one step)."""
        self.tokenizer = tokenizer
        """The pipeline's tokenizer, as given (None when none was)."""
        model_config = pipeline_config.model_config
        self.model = model if model is not None else _load(model_config)
        """The `maxfx.models.CausalLM` whose final hidden states are the embeddings."""
        if not callable(getattr(self.model, "hidden", None)):
            raise TypeError(
                f"{_OWNER}: the model must be a maxfx.models.CausalLM (with hidden(ids, positions, caches)), got "
                f"{type(self.model).__name__}"
            )
        folder = _model_folder(model_config)
        modules = _st_modules(folder)
        self.pooling: str = pooling if pooling is not None else _default_pooling(folder, modules, self.model)
        """The pooling kind in use (one of `POOLING_KINDS`); applies when ``pool_embeddings`` is True."""
        self.normalize: bool = (
            bool(normalize) if normalize is not None else any(m.get("type") == _ST_NORMALIZE for m in modules)
        )
        """Whether pooled embeddings are divided by their L2 norm."""
        self.pool_embeddings: bool = bool(pipeline_config.pool_embeddings)
        """``pipeline_config.pool_embeddings``: one vector per request (True) or per-token states (False)."""
        cfg = self.model.config
        limits = [
            int(v)
            for v in (getattr(pipeline_config, "max_length", None), getattr(cfg, "max_position_embeddings", None))
            if v is not None
        ]
        self.max_length: int | None = min(limits) if limits else None
        """The most tokens a request may have (the config's ``max_length`` and the model's context)."""
        self._vocab = int(cfg.vocab_size)
        budgets = [
            int(v)
            for v in (
                getattr(pipeline_config, "max_batch_context_length", None),
                getattr(pipeline_config, "prefill_chunk_size", None),
            )
            if v
        ]
        self._token_budget = min(budgets) if budgets else 8192
        configured = getattr(pipeline_config, "max_batch_size", None)
        self._max_batch_size = (
            int(configured)
            if configured
            else max(1, self._token_budget // _length_bucket(self.max_length or _MIN_LENGTH_BUCKET, None))
        )
        logger.debug(
            "%s: pooling=%s normalize=%s pool_embeddings=%s max_length=%s",
            _OWNER,
            self.pooling,
            self.normalize,
            self.pool_embeddings,
            self.max_length,
        )

    # ─── MAX's members ────────────────────────────────────────────────────────

    @property
    def pipeline_config(self) -> Any:
        """The `PipelineConfig` the pipeline was built from."""
        return self._pipeline_config

    @property
    def max_batch_size(self) -> int:
        """The most requests one program runs: ``pipeline_config.max_batch_size``, else ``prefill_chunk_size`` tokens'
        worth of ``max_length`` rows.

        ``execute`` takes any number of requests and splits them itself.
        """
        return self._max_batch_size

    def execute(self, inputs: EmbeddingsGenerationInputs) -> dict[RequestID, EmbeddingsGenerationOutput]:
        """The embeddings of every request of ``inputs`` (all replica batches), keyed as in ``inputs.batch``.

        A context is a `~maxfx.interfaces.EmbeddingsContext` (``tokens``), a
        `TextContext` (its ``all_tokens``, from `TextTokenizer.new_context`), or any
        object with ``tokens``. Each output is float32: ``[hidden]`` when
        ``pool_embeddings``, else ``[tokens, hidden]``.

        Raises:
            ValueError: a request with no tokens, more than `max_length` tokens,
                non-integer ids or ids outside the vocabulary (the message names the
                request); nothing runs then.
            TypeError: ``inputs`` has no ``batches``, or a context has no tokens.
        """
        if not hasattr(inputs, "batches"):
            raise TypeError(
                f"{_OWNER}.execute: expected EmbeddingsGenerationInputs(batches=[{{request_id: context}}]), got "
                f"{type(inputs).__name__}"
            )
        batch = (
            inputs.batch
            if isinstance(inputs, EmbeddingsGenerationInputs)
            else EmbeddingsGenerationInputs(list(inputs.batches)).batch
        )
        rows = [(rid, self._tokens_of(rid, ctx)) for rid, ctx in batch.items()]
        results: dict[RequestID, EmbeddingsGenerationOutput] = {}
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][1]))
        for group in self._groups([len(rows[i][1]) for i in order]):
            members = [order[i] for i in group]
            out = self._run([rows[i][1] for i in members])
            for k, i in enumerate(members):
                rid, tokens = rows[i]
                emb = out[k] if self.pool_embeddings else out[k, : len(tokens)]
                results[rid] = EmbeddingsGenerationOutput(np.array(emb, dtype=np.float32))
        return {rid: results[rid] for rid, _ in rows}  # the order of inputs.batch

    def release(self, request_id: RequestID) -> None:
        """Free what the pipeline holds for ``request_id``: nothing, since an embeddings request ends in its `execute`
        (any id is accepted).

        Raises:
            TypeError: ``request_id`` is not a `RequestID` (or str).
        """
        if not isinstance(request_id, (RequestID, str)):
            raise TypeError(f"{_OWNER}.release: request_id must be a RequestID, got {type(request_id).__name__}")

    # ─── the batch ────────────────────────────────────────────────────────────

    def _tokens_of(self, rid: RequestID, ctx: Any) -> np.ndarray:
        """A request's token ids as int64, checked (ValueError / TypeError naming the request)."""
        where = f"{_OWNER}.execute: request {str(rid)!r}"
        # A TextContext's `tokens` is its whole preallocated buffer; `all_tokens` are the valid ones.
        raw = getattr(ctx, "all_tokens", None)
        if raw is None:
            try:
                raw = ctx.tokens
            except AttributeError:
                raw = None
        if raw is None:
            raise TypeError(
                f"{where}: the context ({type(ctx).__name__}) has no tokens; pass an EmbeddingsContext, a TextContext "
                "from TextTokenizer.new_context, or an EmbeddingsRequestContext"
            )
        arr = np.asarray(raw)
        if arr.ndim != 1:
            raise ValueError(f"{where}: tokens must be a 1-D array of token ids, got shape {list(arr.shape)}")
        if arr.size == 0:
            raise ValueError(f"{where}: no tokens to embed (the prompt is empty)")
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{where}: tokens must be integer token ids, got {arr.dtype}")
        if self.max_length is not None and arr.size > self.max_length:
            raise ValueError(
                f"{where} has {arr.size} tokens, more than max_length {self.max_length} (the model's context and "
                "pipeline_config.max_length); shorten the input"
            )
        bad = np.nonzero((arr < 0) | (arr >= self._vocab))[0]
        if bad.size:
            raise ValueError(
                f"{where}: token ids must be in [0, {self._vocab}); got {arr[bad[:8]].tolist()} at positions "
                f"{bad[:8].tolist()}"
            )
        return arr.astype(np.int64)

    def _groups(self, lengths: list[int]) -> list[list[int]]:
        """Consecutive index groups of ascending ``lengths``: at most `max_batch_size` rows and the token budget of
        padded tokens each.
        """
        groups: list[list[int]] = []
        current: list[int] = []
        for i, n in enumerate(lengths):
            rows = len(current) + 1
            padded = _row_bucket(rows, self._max_batch_size) * _length_bucket(n, self.max_length)
            if current and (rows > self._max_batch_size or padded > self._token_budget):
                groups.append(current)
                current = []
            current.append(i)
        if current:
            groups.append(current)
        return groups

    def _run(self, token_rows: list[np.ndarray]) -> np.ndarray:
        """One program over ``token_rows`` (ascending lengths): ``[rows, hidden]`` pooled, else ``[rows, T,
        hidden]``.
        """
        lengths = np.array([len(r) for r in token_rows], np.int64)
        t = _length_bucket(int(lengths.max()), self.max_length)
        b = _row_bucket(len(token_rows), self._max_batch_size)
        ids = np.zeros((b, t), np.int64)
        for i, r in enumerate(token_rows):
            ids[i, : len(r)] = r
        padded_lengths = np.ones(b, np.int64)  # filler rows: one token (id 0), dropped below
        padded_lengths[: len(token_rows)] = lengths
        weights, tree = jax.tree_util.tree_flatten(self.model)
        out = _embed_step(
            weights,
            ids,
            padded_lengths,
            model_tree=tree,
            pooling=self.pooling if self.pool_embeddings else None,
            normalize=self.normalize and self.pool_embeddings,
        )
        return np.asarray(out)[: len(token_rows)]


# ─── the jitted forward ──────────────────────────────────────────────────────


def _embed_arrays(weights, ids, lengths, *, model_tree, pooling, normalize):
    """Final hidden states of ``ids [B, T]`` (float32), pooled over each row's first ``lengths`` tokens unless
    ``pooling`` is None.
    """
    model = jax.tree_util.tree_unflatten(model_tree, weights)
    tokens = Tensor.from_dlpack(ids)
    h, _ = model.hidden(tokens, positions(tokens), None)
    if h.dtype is not DType.float32:
        h = F.cast(h, DType.float32)
    states = h._array()  # [B, T, hidden]
    if pooling is None:
        return states
    if pooling == "mean":
        mask = (jnp.arange(states.shape[1])[None, :] < lengths[:, None]).astype(states.dtype)
        pooled = jnp.einsum("bt,bth->bh", mask, states) / lengths[:, None].astype(states.dtype)
    elif pooling == "last_token":
        pooled = jnp.take_along_axis(states, (lengths - 1)[:, None, None], axis=1)[:, 0]
    else:  # "cls": the first token
        pooled = states[:, 0]
    if normalize:
        pooled = pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), _NORM_EPS)
    return pooled


# One jitted forward per process: pipelines of equal models share its programs.
_embed_step = jit(
    _embed_arrays, static_argnames=("model_tree", "pooling", "normalize")
)  # traced with 64-bit types (int64 ids)


def compiled_programs() -> int:
    """How many embedding programs have been compiled in this process (for tests and benchmarks)."""
    return _embed_step.jitted._cache_size()


def _length_bucket(n: int, limit: int | None) -> int:
    """The padded length of a group whose longest row has ``n`` tokens: a power of two >= 8, at most ``limit``."""
    t = max(_MIN_LENGTH_BUCKET, 1 << (int(n) - 1).bit_length())
    return max(int(n), min(t, limit)) if limit is not None else t


def _row_bucket(rows: int, most: int) -> int:
    """The padded row count of ``rows`` requests: a power of two, at most ``most`` (and never below ``rows``)."""
    return max(int(rows), min(1 << (int(rows) - 1).bit_length(), int(most)))


# ─── loading and the checkpoint's pooling ────────────────────────────────────

_FLOAT_ENCODINGS = ("float32", "bfloat16", "float16")


def _load(model_config: Any) -> Any:
    """`load_pretrained` of the config's model: its float encoding as the dtype, its device when ``device_specs`` was
    set.
    """
    path = model_config.local_model_path
    encoding = getattr(model_config.quantization_encoding, "value", model_config.quantization_encoding)
    dtype = DType[encoding] if encoding in _FLOAT_ENCODINGS and not str(path).lower().endswith(".gguf") else None
    specs = list(model_config.device_specs)
    # The scanned default keeps load_pretrained's own default (MAX's default device, MAXFX_DEFAULT_DEVICE); explicit
    # specs pick their first device.
    device = None if specs == list(driver.scan_available_devices()) else driver.load_devices(specs[:1])[0]
    try:
        return load_pretrained(path, dtype=dtype, device=device)
    except (OSError, ValueError) as e:
        raise ValueError(f"{_OWNER}: cannot load the model at {str(path)!r}: {e}") from e


def _model_folder(model_config: Any) -> Path | None:
    try:
        path = Path(model_config.local_model_path)
    except (AttributeError, OSError, ValueError, TypeError):
        return None
    return path if path.is_dir() else None


def _read_json(path: Path) -> Any:
    try:
        return read_json_file(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{_OWNER}: cannot read {path}: {e}") from e


def _st_modules(folder: Path | None) -> list[dict[str, Any]]:
    """The sentence-transformers ``modules.json`` entries of the checkpoint folder ([] when it has none)."""
    if folder is None or not (folder / "modules.json").is_file():
        return []
    modules = _read_json(folder / "modules.json")
    if not isinstance(modules, list):
        raise ValueError(f"{_OWNER}: {folder / 'modules.json'} must be a list of modules, got {type(modules).__name__}")
    return [m for m in modules if isinstance(m, dict)]


def _st_pooling(folder: Path | None, modules: list[dict[str, Any]]) -> str | None:
    """The pooling kind the checkpoint's sentence-transformers Pooling config names (None: no such config)."""
    if folder is None:
        return None
    paths = [str(m.get("path", "")) for m in modules if m.get("type") == _ST_POOLING]
    config_path = folder / paths[0] / "config.json" if paths else folder / "1_Pooling" / "config.json"
    if not config_path.is_file():
        return None
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{_OWNER}: {config_path} must be a JSON object, got {type(config).__name__}")
    chosen = [kind for key, kind in _ST_MODES.items() if config.get(key)]
    if len(chosen) == 1 and not any(config.get(key) for key in _ST_UNSUPPORTED):
        return chosen[0]
    named = [key for key in (*_ST_MODES, *_ST_UNSUPPORTED) if config.get(key)]
    raise ValueError(
        f"{_OWNER}: {config_path} asks for pooling {named or 'none'}; maxfx pools one way at a time, with "
        f"{list(POOLING_KINDS)} "
        "(pooling_mode_mean_tokens, pooling_mode_lasttoken, pooling_mode_cls_token): pass EmbeddingsPipeline(..., "
        "pooling=...)"
    )


def _default_pooling(folder: Path | None, modules: list[dict[str, Any]], model: Any) -> str:
    st = _st_pooling(folder, modules)
    if st is not None:
        return st
    return "last_token" if getattr(model.config, "architecture", None) in _LAST_TOKEN_ARCHITECTURES else "mean"
