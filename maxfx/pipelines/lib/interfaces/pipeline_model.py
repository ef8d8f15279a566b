"""`PipelineModel` (what a model implements to plug into MAX's pipelines), `ModelInputs`, `ModelOutputs`,
`AlwaysSignalBuffersMixin`.

A `PipelineModel` prepares batched inputs from contexts
(`prepare_initial_token_inputs`, then `prepare_next_token_inputs` for each further
decode step), runs its compiled graph (`execute`, returning `ModelOutputs`), and
answers the memory questions the pipeline asks before loading it
(`calculate_max_seq_len`, `estimate_weights_size`, `estimate_activation_memory`,
`infer_optimal_batch_size`). Models with a KV cache also implement `KVCacheMixin`.

maxfx's own families (`maxfx.models`) are served by the engine directly; this is the
interface for models written against MAX's API.

Example:
    >>> out = ModelOutputs(logits="all", next_token_logits="last")
    >>> out.logit_offsets is None, out.next_token_logits
    (True, 'last')
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from lowering.types import DeviceRef
from maxfx.driver import Tensor, is_virtual_device_mode
from maxfx.interfaces import LogProbabilities
from maxfx.nn.comm import Signals
from maxfx.nn.transformer import ReturnLogits
from maxfx.pipelines.lib.config import HuggingFaceConfig
from maxfx.pipelines.lib.config._model_files import model_max_length
from maxfx.pipelines.lib.interfaces.kv_cache import KVCacheMixin, kv_cache_bytes_per_token
from maxfx.pipelines.lib.log_probabilities import compute_log_probabilities_ragged, log_probabilities_ragged_graph

__all__ = ["AlwaysSignalBuffersMixin", "ModelInputs", "ModelOutputs", "PipelineModel", "RaggedTokenInputs"]

# Top-k levels of the default log-probability graph: 2**3 - 1 = 7 >= OpenAI's maximum of 5.
_LOGPROB_LEVELS = 3


class ModelInputs:
    """Base class of a model's prepared inputs; subclasses add their tensors as attributes.

    Example:
        >>> class TokenInputs(ModelInputs):
        ...     def __init__(self, tokens, input_row_offsets):
        ...         self.tokens, self.input_row_offsets = tokens, input_row_offsets
        >>> inputs = TokenInputs(tokens=[1, 2], input_row_offsets=[0, 2])
        >>> inputs.update(tokens=[3], unknown=1, lora_ids=None)
        >>> inputs.tokens, inputs.kv_cache_inputs, hasattr(inputs, "unknown")
        ([3], None, False)
    """

    kv_cache_inputs: Any = None
    """The KV-cache inputs of this step (None without a KV cache)."""
    lora_ids: Any = None
    """The LoRA adapter id of each sequence (None without LoRA)."""
    lora_ranks: Any = None
    """The LoRA rank of each sequence (None without LoRA)."""

    def update(self, **kwargs: Any) -> None:
        """Set the attributes named in ``kwargs`` that the inputs already have, skipping None values (as MAX)."""
        for key, value in kwargs.items():
            if hasattr(self, key) and value is not None:
                setattr(self, key, value)


class RaggedTokenInputs(ModelInputs):
    """Ragged token inputs (maxfx addition): what `PipelineModel`'s base input preparation builds.

    Args:
        tokens: every sequence's tokens, concatenated (``[total_tokens]``).
        input_row_offsets: ``[batch + 1]``: sequence b is ``tokens[offsets[b]:offsets[b + 1]]``.
        return_n_logits: how many logits per sequence the graph returns (``[1]``), or None.
        kv_cache_inputs: the KV cache inputs of the step, or None.
    """

    def __init__(
        self, tokens: Any, input_row_offsets: Any, return_n_logits: Any = None, kv_cache_inputs: Any = None
    ) -> None:
        self.tokens = tokens
        self.input_row_offsets = input_row_offsets
        self.return_n_logits = return_n_logits
        self.kv_cache_inputs = kv_cache_inputs


def _require_ragged(owner: str, method: str, inputs: Any) -> None:
    if getattr(inputs, "tokens", None) is None or getattr(inputs, "input_row_offsets", None) is None:
        raise TypeError(
            f"{owner}.{method}: the base implementation needs ragged inputs (tokens and input_row_offsets), got "
            f"{type(inputs).__name__}"
        )


@dataclass(frozen=True)
class ModelOutputs:
    """What `PipelineModel.execute` returns."""

    logits: Any
    """Logits of a variable number of tokens per sequence (``[rows, vocab]``)."""
    next_token_logits: Any = None
    """Logits of each sequence's next token only (``[batch, vocab]``)."""
    logit_offsets: Any = None
    """Row offsets of each sequence's logits in ``logits`` (``[batch + 1]``), for ragged logits."""


def _as_hf_config(config: Any) -> HuggingFaceConfig | None:
    """A `HuggingFaceConfig` of a config object or dict (None stays None)."""
    if config is None or isinstance(config, HuggingFaceConfig):
        return config
    return HuggingFaceConfig.from_dict(dict(config) if isinstance(config, dict) else dict(vars(config)))


def _as_numpy(value: Any) -> np.ndarray:
    return value.to_numpy() if hasattr(value, "to_numpy") else np.asarray(value)


class PipelineModel(ABC):
    """A model the pipelines run: input preparation, execution, memory estimates, log probabilities.

    Args:
        pipeline_config: the `PipelineConfig`.
        session: the `InferenceSession` that compiles the model's graphs.
        huggingface_config: the model's ``config.json`` (a `HuggingFaceConfig`).
        encoding: the weights' `SupportedEncoding`.
        devices: driver devices to run on.
        kv_cache_config: the `KVCacheConfig`.
        weights: the checkpoint's `Weights`.
        adapter: converts ``weights`` to the model's state-dict names (or None).
        return_logits: which logits `execute` returns (`ReturnLogits`).

    A model that is also a `KVCacheMixin` gets ``self.kv_manager`` from
    `KVCacheMixin.load_kv_manager` (sized by ``kv_cache_config._available_cache_memory``).

    Raises:
        ValueError: LoRA is configured (maxfx's pipeline models have no LoRA manager).
    """

    _MAX_DEFAULT_BATCH_SIZE = 4096
    _MIN_DEFAULT_BATCH_SIZE = 1

    def __init__(
        self,
        pipeline_config: Any,
        session: Any,
        huggingface_config: Any,
        encoding: Any,
        devices: list[Any],
        kv_cache_config: Any,
        weights: Any,
        adapter: Any,
        return_logits: ReturnLogits,
    ) -> None:
        self.pipeline_config = pipeline_config
        self.session = session
        self.huggingface_config = huggingface_config
        self.encoding = encoding
        self.devices = list(devices)
        self.kv_cache_config = kv_cache_config
        self.weights = weights
        self.adapter = adapter
        self.return_logits = ReturnLogits(return_logits)
        if getattr(pipeline_config, "lora_config", None) is not None:
            raise ValueError(
                f"{type(self).__name__}: LoRA adapters are not supported by maxfx's PipelineModel (it has no LoRA "
                "manager); set enable_lora=False"
            )
        self._lora_manager: Any = None
        self._logprobs_model: Any = None
        self.max_seq_len = self.calculate_max_seq_len(pipeline_config, huggingface_config)
        if isinstance(self, KVCacheMixin):
            self.kv_manager = self.load_kv_manager(session, getattr(kv_cache_config, "_available_cache_memory", None))

    @property
    def dtype(self) -> Any:
        """The `DType` of the weights: ``encoding.dtype`` (else the pipeline config's encoding's).

        Raises:
            ValueError: neither names an encoding.
        """
        encoding = (
            self.encoding if self.encoding is not None else self.pipeline_config.model_config.quantization_encoding
        )
        if encoding is None:
            raise ValueError(
                f"{type(self).__name__}.dtype: no quantization encoding is set (pass encoding= or resolve the pipeline "
                "config)"
            )
        return encoding.dtype

    @property
    def lora_manager(self) -> Any:
        """The LoRA manager: always None in maxfx (``__init__`` refuses LoRA configs)."""
        return self._lora_manager

    @cached_property
    def signal_buffers(self) -> list[Any]:
        """Multi-GPU allreduce signal buffers, one uint8 ``[Signals.NUM_BYTES]`` buffer per device.

        Empty on one device (nothing to synchronize) and in virtual-device
        (compile-only) mode.
        """
        if is_virtual_device_mode() or len(self.devices) <= 1:
            return []
        return Signals([DeviceRef.from_device(d) for d in self.devices]).buffers()

    @classmethod
    @abstractmethod
    def calculate_max_seq_len(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        """The longest sequence the model runs (abstract, as MAX).

        The base body is the usual rule, for overrides to call: ``pipeline_config.max_length``,
        at most the model's ``max_position_embeddings`` (``n_positions``...); the
        model's limit when ``max_length`` is None.

        Raises:
            ValueError: ``max_length`` exceeds the model's limit, or neither is known.
        """
        limit = model_max_length(_as_hf_config(huggingface_config))
        wanted = getattr(pipeline_config, "max_length", None)
        if wanted is None:
            if limit is None:
                raise ValueError(
                    f"{cls.__name__}.calculate_max_seq_len: neither the pipeline config's max_length nor the model "
                    "config's max_position_embeddings is set"
                )
            return limit
        if limit is not None and int(wanted) > limit:
            raise ValueError(
                f"{cls.__name__}.calculate_max_seq_len: max_length {wanted} exceeds the model's "
                f"max_position_embeddings ({limit})"
            )
        return int(wanted)

    @classmethod
    def infer_optimal_batch_size(
        cls,
        pipeline_config: Any,
        available_cache_memory: int,
        huggingface_config: Any,
        devices: list[Any],
        kv_cache_config: Any,
        cache_dtype: Any,
    ) -> int:
        """How many sequences of the longest length fit in ``available_cache_memory`` bytes of KV cache.

        1 for a model without a KV cache (not a `KVCacheMixin`) and on a lone host
        device (batching on the CPU is not worth it, as MAX decides); otherwise
        ``available_cache_memory // (bytes per token * max_seq_len)``, clamped to [1, 4096].
        """
        if not issubclass(cls, KVCacheMixin):
            return 1
        if len(devices) == 1 and getattr(devices[0], "is_host", False):
            return 1
        num_layers = cls.get_num_layers(huggingface_config=huggingface_config)
        params = cls.get_kv_params(
            huggingface_config=huggingface_config,
            n_devices=len(devices),
            kv_cache_config=kv_cache_config,
            cache_dtype=cache_dtype,
        )
        max_seq_len = cls.calculate_max_seq_len(pipeline_config, huggingface_config=huggingface_config)
        per_sequence = kv_cache_bytes_per_token(params, num_layers) * max_seq_len
        inferred = int(available_cache_memory) // max(per_sequence, 1)
        return max(cls._MIN_DEFAULT_BATCH_SIZE, min(inferred, cls._MAX_DEFAULT_BATCH_SIZE))

    @classmethod
    def estimate_weights_size(cls, pipeline_config: Any) -> int:
        """Bytes of the weights: the size of the weight files (``model_config.weights_size()``)."""
        return int(pipeline_config.model_config.weights_size())

    @classmethod
    def estimate_activation_memory(cls, pipeline_config: Any, huggingface_config: Any) -> int:
        """Bytes of temporary buffers while running (0 by default, as MAX; models may override)."""
        del pipeline_config, huggingface_config
        return 0

    @abstractmethod
    def execute(self, model_inputs: ModelInputs) -> ModelOutputs:
        """Run the compiled graph on prepared inputs (abstract, as MAX).

        The base body is the ragged convention of MAX's text models, for overrides
        to call: ``self.model`` (a compiled `~maxfx.engine.Model`) runs on ``tokens,
        input_row_offsets, return_n_logits, *signal_buffers, *kv_cache_inputs``; one
        output is the next-token logits, three are ``(next_token_logits, logits,
        logit_offsets)``, two are ``(next_token_logits, logits)``.

        Raises:
            TypeError: no compiled ``self.model``, or inputs without ``tokens`` / ``input_row_offsets``.
        """
        model = getattr(self, "model", None)
        if model is None or not callable(getattr(model, "execute", None)):
            raise TypeError(
                f"{type(self).__name__}.execute: set self.model to the compiled graph (InferenceSession.load) or "
                "implement execute"
            )
        _require_ragged(type(self).__name__, "execute", model_inputs)
        kv_inputs = [] if model_inputs.kv_cache_inputs is None else list(model_inputs.kv_cache_inputs)
        return_n = getattr(model_inputs, "return_n_logits", None)
        args = [
            model_inputs.tokens,
            model_inputs.input_row_offsets,
            *([] if return_n is None else [return_n]),
            *self.signal_buffers,
            *kv_inputs,
        ]
        outputs = list(model.execute(*args))
        if len(outputs) == 1:
            return ModelOutputs(logits=outputs[0], next_token_logits=outputs[0])
        if len(outputs) in (2, 3):
            return ModelOutputs(
                next_token_logits=outputs[0], logits=outputs[1], logit_offsets=outputs[2] if len(outputs) == 3 else None
            )
        raise TypeError(
            f"{type(self).__name__}.execute: the graph returned {len(outputs)} outputs; expected 1 to 3 (next-token "
            "logits, all logits, offsets)"
        )

    @abstractmethod
    def prepare_initial_token_inputs(
        self, context_batch: Sequence[Any], kv_cache_inputs: Any = None, return_n_logits: int = 1
    ) -> ModelInputs:
        """Batch the contexts' next tokens into the first step's inputs (abstract, as MAX).

        The base body, for overrides to call, builds `RaggedTokenInputs` on the first
        device: every context's ``next_tokens`` concatenated (int64), their row offsets
        (uint32 ``[batch + 1]``), ``return_n_logits`` (int64 ``[1]``) and the given
        ``kv_cache_inputs``.

        Raises:
            ValueError: an empty batch.
        """
        if not context_batch:
            raise ValueError(f"{type(self).__name__}.prepare_initial_token_inputs: the batch is empty")
        chunks = [np.asarray(ctx.next_tokens, np.int64) for ctx in context_batch]
        offsets = np.concatenate([[0], np.cumsum([len(c) for c in chunks])]).astype(np.uint32)
        return RaggedTokenInputs(
            tokens=self._on_device(np.concatenate(chunks)),
            input_row_offsets=self._on_device(offsets),
            return_n_logits=Tensor.from_numpy(np.array([int(return_n_logits)], np.int64)),
            kv_cache_inputs=kv_cache_inputs,
        )

    @abstractmethod
    def prepare_next_token_inputs(self, next_tokens: Any, prev_model_inputs: ModelInputs) -> ModelInputs:
        """The inputs of the next decode step (abstract, as MAX).

        The base body, for overrides to call: one token per sequence (``next_tokens``,
        offsets ``0..batch``), with the previous step's ``return_n_logits`` and KV
        cache inputs.

        Raises:
            TypeError: the previous inputs are not ragged (no ``tokens`` / ``input_row_offsets``).
        """
        _require_ragged(type(self).__name__, "prepare_next_token_inputs", prev_model_inputs)
        batch = int(next_tokens.shape[0])
        tokens = next_tokens if isinstance(next_tokens, Tensor) else self._on_device(np.asarray(next_tokens, np.int64))
        return RaggedTokenInputs(
            tokens=tokens,
            input_row_offsets=self._on_device(np.arange(batch + 1, dtype=np.uint32)),
            return_n_logits=getattr(prev_model_inputs, "return_n_logits", None),
            kv_cache_inputs=prev_model_inputs.kv_cache_inputs,
        )

    def _on_device(self, array: np.ndarray) -> Any:
        tensor = Tensor.from_numpy(np.ascontiguousarray(array))
        return tensor.to(self.devices[0]) if self.devices else tensor

    def compute_log_probabilities(
        self,
        session: Any,
        model_inputs: ModelInputs,
        model_outputs: ModelOutputs,
        next_tokens: Any,
        batch_top_n: list[int],
        batch_echo: list[bool],
    ) -> list[LogProbabilities | None]:
        """Log probabilities of the sampled tokens (and, with echo, the input tokens) of a step.

        The default reads ``model_inputs.tokens`` and ``model_inputs.input_row_offsets``
        (ragged inputs), ``model_outputs.next_token_logits`` and, for echo, the
        all-token ``model_outputs.logits``, and runs
        `~maxfx.pipelines.lib.log_probabilities.compute_log_probabilities_ragged`
        (its graph compiled once in ``session``, on the first device).

        Raises:
            ValueError: the inputs are not ragged (no ``tokens`` / ``input_row_offsets``),
                there are no next-token logits, or echo is asked of a model that does
                not return every token's logits (``enable_echo``).
        """
        tokens, offsets = getattr(model_inputs, "tokens", None), getattr(model_inputs, "input_row_offsets", None)
        if tokens is None or offsets is None:
            raise ValueError(
                f"{type(self).__name__}.compute_log_probabilities: needs ragged model inputs with tokens and "
                "input_row_offsets; override it for other layouts"
            )
        if model_outputs.next_token_logits is None:
            raise ValueError(
                f"{type(self).__name__}.compute_log_probabilities: the model outputs have no next_token_logits"
            )
        all_logits = self.return_logits in (ReturnLogits.ALL, ReturnLogits.VARIABLE)
        if any(batch_echo) and not all_logits:
            raise ValueError(
                f"{type(self).__name__}.compute_log_probabilities: echo needs the logits of every token; build the "
                "pipeline with enable_echo=True"
            )
        device = self.devices[0]
        if self._logprobs_model is None:
            self._logprobs_model = session.load(
                log_probabilities_ragged_graph(DeviceRef.from_device(device), levels=_LOGPROB_LEVELS)
            )
        return compute_log_probabilities_ragged(
            device,
            self._logprobs_model,
            input_row_offsets=_as_numpy(offsets),
            logits=model_outputs.logits if all_logits else None,
            next_token_logits=model_outputs.next_token_logits,
            tokens=_as_numpy(tokens),
            sampled_tokens=_as_numpy(next_tokens),
            batch_top_n=batch_top_n,
            batch_echo=batch_echo,
        )


class AlwaysSignalBuffersMixin:
    """For models whose graphs take allreduce signal buffers on any number of devices (even one).

    Put it before `PipelineModel` in the bases. ``devices`` is the model's device
    list. maxfx's collectives run in XLA and never read the buffers; they exist so
    the graph's inputs (``maxfx.nn.comm.Signals(devices).input_types()``) are met.
    """

    devices: list[Any]
    """The devices of the model (set by `PipelineModel`)."""

    @cached_property
    def signal_buffers(self) -> list[Any]:
        """One zeroed uint8 ``[Signals.NUM_BYTES]`` buffer per device, one device included; empty in virtual-device
        mode.
        """
        if is_virtual_device_mode():
            return []
        return Signals([DeviceRef.from_device(d) for d in self.devices]).buffers()
