"""``max.pipelines.lib.registry``: which architectures maxfx serves, and how a `PipelineConfig` becomes a pipeline.

- `SupportedArchitecture`: the record of one architecture for one task (its Hugging
  Face ``architectures`` name, model class, tokenizer, weight encodings and the KV
  cache strategies each allows, RoPE flavour, required options, context validators).
- `PipelineRegistry`: architectures keyed by name (and task: one name may serve
  text generation and embeddings). `retrieve_factory` resolves a config to
  ``(tokenizer, zero-argument pipeline factory)``; `retrieve` calls the factory.
- `PIPELINE_REGISTRY`: the shared registry. It fills itself with maxfx's built-in
  architectures (`maxfx.pipelines.architectures.register_all_models`) the first
  time it is used, unless it was `reset` first.
- `get_pipeline_for_task`: the pipeline class of a task (speculative decoding when
  the config has a draft model).

The architecture of a model is read from its local ``config.json``
(``architectures``, else ``model_type``) or, for a ``.gguf`` checkpoint, from its
``general.architecture`` metadata (``llama`` -> ``LlamaForCausalLM``, ...).

Example:
    >>> from maxfx.pipelines.lib.hf_utils import HuggingFaceRepo
    >>> arch = PIPELINE_REGISTRY.retrieve_architecture(HuggingFaceRepo("tests/data/models/tiny_llama"))
    >>> arch.name, arch.task.value, sorted(e.value for e in arch.supported_encodings)[:2]
    ('LlamaForCausalLM', 'text_generation', ['bfloat16', 'float32'])
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxfx.graph.weights import WeightsFormat
from maxfx.interfaces import PipelineTask, PipelineTokenizer
from maxfx.nn.kv_cache import KVCacheStrategy
from maxfx.pipelines.lib.config import (
    ConfigError,
    HuggingFaceConfig,
    MAXModelConfig,
    PipelineConfig,
    RopeType,
    SupportedEncoding,
)
from maxfx.pipelines.lib.config._base import default_of
from maxfx.pipelines.lib.config._model_files import gguf_config, model_max_length, read_json
from maxfx.pipelines.lib.hf_utils import HuggingFaceRepo
from maxfx.pipelines.lib.interfaces import PipelineModel
from maxfx.pipelines.lib.tokenizer import TextTokenizer

__all__ = ["PIPELINE_REGISTRY", "PipelineRegistry", "SupportedArchitecture", "get_pipeline_for_task"]

logger = logging.getLogger("max.pipelines")

# Hugging Face config.json ``model_type`` -> the ``architectures`` name of its causal LM,
# for configs that leave ``architectures`` out (transformers' own mapping for these types).
_MODEL_TYPE_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}
# Architectures whose (SentencePiece) tokenizers MAX decodes with the Llama whitespace fix.
_WHITESPACE_FIX_ARCHITECTURES = ("MistralForCausalLM", "Phi3ForCausalLM")
# Where the pipeline classes live: imported when a factory is built, so that importing the registry stays light.
_PIPELINE_CLASSES = {
    "text": ("maxfx.pipelines.lib.pipeline_variants.text_generation", "TextGenerationPipeline"),
    "speculative": ("maxfx.pipelines.lib.speculative_decoding", "SpeculativeDecodingTextGenerationPipeline"),
    "embeddings": ("maxfx.pipelines.lib.embeddings_pipeline", "EmbeddingsPipeline"),
}
_BUILTIN_ARCHITECTURES = "maxfx.pipelines.architectures"


def _import_pipeline_class(kind: str) -> type:
    module_name, class_name = _PIPELINE_CLASSES[kind]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise ImportError(
            f"get_pipeline_for_task: {module_name}.{class_name} is not available in this maxfx ({err})"
        ) from err
    return getattr(module, class_name)


def get_pipeline_for_task(task: PipelineTask | str, pipeline_config: Any) -> type:
    """The pipeline class serving ``task``.

    ``TEXT_GENERATION``: `SpeculativeDecodingTextGenerationPipeline` when
    ``pipeline_config.draft_model_config`` is set, else `TextGenerationPipeline`;
    ``EMBEDDINGS_GENERATION``: `EmbeddingsPipeline`.

    Raises:
        ValueError: an audio task (maxfx has no audio pipelines) or an unknown task.
        ImportError: the pipeline's module is missing from this maxfx.

    Example:
        >>> get_pipeline_for_task("embeddings_generation", None).__name__
        'EmbeddingsPipeline'
    """
    try:
        task = PipelineTask(task)
    except ValueError:
        raise ValueError(
            f"get_pipeline_for_task: unknown task {task!r}; tasks: {', '.join(t.value for t in PipelineTask)}"
        ) from None
    if task is PipelineTask.TEXT_GENERATION:
        return _import_pipeline_class(
            "speculative" if getattr(pipeline_config, "draft_model_config", None) is not None else "text"
        )
    if task is PipelineTask.EMBEDDINGS_GENERATION:
        return _import_pipeline_class("embeddings")
    raise ValueError(
        f"get_pipeline_for_task: maxfx has no pipeline for the task {task.value!r} (MAX's audio and speech-token "
        "pipelines are out of maxfx's scope)"
    )


def _coerce(owner: str, what: str, value: Any, enum_cls: type) -> Any:
    try:
        return enum_cls(value)
    except ValueError:
        raise ValueError(f"{owner}: {what} must be one of {[m.value for m in enum_cls]}, got {value!r}") from None


@dataclass
class SupportedArchitecture:
    """One architecture maxfx serves for one task (register it in a `PipelineRegistry`).

    Strings are accepted for the enums (``"bfloat16"``, ``"paged"``,
    ``"text_generation"``, ``"safetensors"``, ``"neox"``) and converted.

    Raises:
        ValueError: an empty name, an unknown enum value, or a ``default_encoding``
            missing from ``supported_encodings``.
        TypeError: a ``tokenizer`` that is not callable, or validators that are not.

    Example:
        >>> from maxfx.models import LlamaForCausalLM
        >>> arch = SupportedArchitecture(name="MyLlamaForCausalLM", example_repo_ids=[], default_encoding="float32",
        ...     supported_encodings={"float32": ["paged"]}, pipeline_model=LlamaForCausalLM, task="text_generation",
        ...     tokenizer=TextTokenizer, default_weights_format="safetensors")
        >>> arch.supported_encodings, arch.tokenizer_cls.__name__
        ({<SupportedEncoding.float32: 'float32'>: [<KVCacheStrategy.PAGED: 'paged'>]}, 'TextTokenizer')
    """

    name: str
    """The Hugging Face ``config.json`` ``architectures`` entry this record serves (e.g. ``LlamaForCausalLM``)."""
    example_repo_ids: list[str]
    """Repos known to work with it."""
    default_encoding: SupportedEncoding
    """The encoding used when the user names none."""
    supported_encodings: dict[SupportedEncoding, list[KVCacheStrategy]]
    """Each weight encoding it runs, with the KV cache strategies allowed with it (empty: no KV cache)."""
    pipeline_model: type
    """The model class (a `maxfx.models` class, or a `PipelineModel` subclass)."""
    task: PipelineTask
    """The task it serves."""
    tokenizer: Callable[..., PipelineTokenizer]
    """Builds the tokenizer (usually `TextTokenizer`), called with ``model_path``, ``revision``, ``max_length``..."""
    default_weights_format: WeightsFormat
    """The checkpoint format ``pipeline_model`` expects."""
    rope_type: RopeType = RopeType.none
    """The RoPE flavour (what GGUF weights are laid out for)."""
    weight_adapters: dict[WeightsFormat, Callable[..., Any]] = field(default_factory=dict)
    """Checkpoint format -> converter of its state dict to ``pipeline_model``'s names."""
    multi_gpu_supported: bool = False
    """Whether it runs on several GPUs."""
    required_arguments: dict[str, bool | int | float] = field(default_factory=dict)
    """`PipelineConfig` options it needs set to these values (checked unless ``force``)."""
    context_validators: list[Callable[[Any], None]] = field(default_factory=list)
    """Checks run on every new context (they raise to reject a request)."""
    supports_empty_batches: bool = False
    """Whether the model can run a batch of no requests."""

    def __post_init__(self) -> None:
        owner = "SupportedArchitecture"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(
                f"{owner}: name must be a non-empty str (the config.json architectures entry), got {self.name!r}"
            )
        owner = f"SupportedArchitecture({self.name!r})"
        self.example_repo_ids = list(self.example_repo_ids)
        self.task = _coerce(owner, "task", self.task, PipelineTask)
        self.default_encoding = _coerce(owner, "default_encoding", self.default_encoding, SupportedEncoding)
        if isinstance(self.supported_encodings, (set, frozenset, list, tuple)):
            self.supported_encodings = {e: [] for e in self.supported_encodings}  # later MAX: a set of encodings
        self.supported_encodings = {
            _coerce(owner, "supported_encodings key", enc, SupportedEncoding): [
                _coerce(owner, "KV cache strategy", s, KVCacheStrategy) for s in strategies
            ]
            for enc, strategies in dict(self.supported_encodings).items()
        }
        if self.default_encoding not in self.supported_encodings:
            raise ValueError(
                f"{owner}: default_encoding {self.default_encoding.value!r} must be one of supported_encodings "
                f"{[e.value for e in self.supported_encodings]}"
            )
        self.default_weights_format = _coerce(
            owner, "default_weights_format", self.default_weights_format, WeightsFormat
        )
        self.rope_type = _coerce(owner, "rope_type", self.rope_type, RopeType)
        self.weight_adapters = {
            _coerce(owner, "weight_adapters key", k, WeightsFormat): v for k, v in dict(self.weight_adapters).items()
        }
        if not callable(self.tokenizer):
            raise TypeError(
                f"{owner}: tokenizer must be a callable returning a PipelineTokenizer (e.g. TextTokenizer), got "
                f"{self.tokenizer!r}"
            )
        self.context_validators = list(self.context_validators)
        if not all(callable(v) for v in self.context_validators):
            raise TypeError(f"{owner}: context_validators must be callables taking a context")
        self.required_arguments = dict(self.required_arguments)

    @property
    def tokenizer_cls(self) -> type:
        """The tokenizer class: ``tokenizer`` when it is a class, else `TextTokenizer` (as MAX)."""
        return self.tokenizer if isinstance(self.tokenizer, type) else TextTokenizer


class _ValidatedNewContext:
    """``new_context`` of a tokenizer that cannot take ``context_validators``, running them after it (picklable)."""

    def __init__(self, tokenizer: Any, validators: list[Callable[[Any], None]]) -> None:
        self._tokenizer, self._validators = tokenizer, list(validators)

    async def __call__(self, request: Any) -> Any:
        context = await type(self._tokenizer).new_context(self._tokenizer, request)
        for validator in self._validators:
            validator(context)
        return context


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _architecture_names(config: Any) -> list[str]:
    """The architecture names a config states: ``architectures``, else the causal LM of its ``model_type``."""
    names = config.get("architectures") if hasattr(config, "get") else getattr(config, "architectures", None)
    if isinstance(names, str):
        names = [names]
    names = [str(n) for n in names or []]
    model_type = config.get("model_type") if hasattr(config, "get") else getattr(config, "model_type", None)
    if not names and model_type in _MODEL_TYPE_ARCHITECTURES:
        names = [_MODEL_TYPE_ARCHITECTURES[model_type]]
    return names


def _model_path(config: Any) -> str:
    model_config = getattr(config, "model_config", config)
    return str(getattr(model_config, "model_path", config))


class PipelineRegistry:
    """Architectures by name and task, and the resolution of a `PipelineConfig` to a tokenizer and pipeline.

    Args:
        architectures: the initial `SupportedArchitecture` records.

    Example:
        >>> registry = PipelineRegistry([])
        >>> registry.register(PIPELINE_REGISTRY.architectures["GPT2LMHeadModel"])
        >>> list(registry.architectures)
        ['GPT2LMHeadModel']
    """

    def __init__(self, architectures: list[SupportedArchitecture]) -> None:
        self._architectures: dict[str, SupportedArchitecture] = {}
        self._architectures_by_task: dict[tuple[str, PipelineTask], SupportedArchitecture] = {}
        self._cached_huggingface_configs: dict[HuggingFaceRepo, HuggingFaceConfig] = {}
        self._cached_huggingface_tokenizers: dict[HuggingFaceRepo, Any] = {}
        self._autoload: str | None = None
        for arch in architectures:
            self.register(arch)

    # ─── the records ──────────────────────────────────────────────────────────

    def _ensure_builtins(self) -> None:
        if self._autoload is not None:
            module, self._autoload = self._autoload, None  # cleared first: register_all_models registers into self
            importlib.import_module(module).register_all_models()

    @property
    def architectures(self) -> dict[str, SupportedArchitecture]:
        """Name -> architecture (for a name registered for several tasks: the first one registered)."""
        self._ensure_builtins()
        return self._architectures

    def architectures_for(self, name: str) -> list[SupportedArchitecture]:
        """Every architecture registered under ``name``, one per task (maxfx addition)."""
        self._ensure_builtins()
        return [arch for (n, _), arch in self._architectures_by_task.items() if n == name]

    def register(self, architecture: SupportedArchitecture, *, allow_override: bool = False) -> None:
        """Add an architecture; a name may be registered once per task.

        Raises:
            TypeError: ``architecture`` is not a `SupportedArchitecture`.
            ValueError: the name is already registered for that task and ``allow_override`` is False.
        """
        if not isinstance(architecture, SupportedArchitecture):
            raise TypeError(
                f"PipelineRegistry.register: expected a SupportedArchitecture, got {type(architecture).__name__}"
            )
        self._ensure_builtins()
        key = (architecture.name, architecture.task)
        if key in self._architectures_by_task:
            if not allow_override:
                raise ValueError(
                    f"Refusing to override existing architecture for {architecture.name!r} with task "
                    f"{architecture.task.value!r}; pass allow_override=True to replace it"
                )
            if self._architectures_by_task[key] is not architecture:
                logger.warning(
                    "Overriding existing architecture for %r with task %s", architecture.name, architecture.task.value
                )
        self._architectures_by_task[key] = architecture
        current = self._architectures.get(architecture.name)
        if current is None or current.task is architecture.task:
            self._architectures[architecture.name] = architecture

    def reset(self) -> None:
        """Remove every architecture and cached config/tokenizer (built-ins are not loaded again)."""
        self._autoload = None
        self._architectures.clear()
        self._architectures_by_task.clear()
        self._cached_huggingface_configs.clear()
        self._cached_huggingface_tokenizers.clear()

    def _resolve_architecture(self, name: str, task: PipelineTask | None = None) -> SupportedArchitecture | None:
        self._ensure_builtins()
        if task is not None and (name, task) in self._architectures_by_task:
            return self._architectures_by_task[(name, task)]
        return self._architectures.get(name)

    def _supported(self, task: PipelineTask | None = None) -> str:
        names = sorted({n for (n, t) in self._architectures_by_task if task is None or t is task})
        return ", ".join(names) if names else "(none registered)"

    # ─── configs and tokenizers of repos ──────────────────────────────────────

    def get_active_huggingface_config(self, huggingface_repo: HuggingFaceRepo) -> HuggingFaceConfig:
        """The repo's ``config.json`` (or its GGUF file's metadata) as a `HuggingFaceConfig`, cached per repo.

        maxfx reads it offline and never runs a repo's code, so the cache also
        serves ``trust_remote_code`` repos.

        Raises:
            FileNotFoundError: the repo has neither a ``config.json`` nor a ``.gguf`` file.
            ValueError: ``config.json`` is not a JSON object.
        """
        if huggingface_repo not in self._cached_huggingface_configs:
            root = huggingface_repo.local_path
            data = read_json(root / "config.json")
            if data is None:
                ggufs = sorted(root.glob("*.gguf"))
                if not ggufs:
                    raise FileNotFoundError(
                        f"PipelineRegistry: {huggingface_repo.repo_id!r} has no config.json and no .gguf file to read "
                        "the architecture from"
                    )
                data = gguf_config(ggufs[0])
            self._cached_huggingface_configs[huggingface_repo] = HuggingFaceConfig.from_dict(data)
        return self._cached_huggingface_configs[huggingface_repo]

    def get_active_tokenizer(self, huggingface_repo: HuggingFaceRepo) -> Any:
        """The repo's tokenizer (``tokenizer.json``, else a ``.gguf`` file's vocabulary) as a `maxfx.models.Tokenizer`,
        cached per repo.

        It stands in for transformers' ``AutoTokenizer``: ``encode``, ``decode``, ``eos_token_ids``.

        Raises:
            ValueError: the repo has no tokenizer maxfx can read.
        """
        if huggingface_repo not in self._cached_huggingface_tokenizers:
            root = huggingface_repo.local_path
            ggufs = sorted(root.glob("*.gguf"))
            source = ggufs[0] if not (root / "tokenizer.json").is_file() and ggufs else root
            tokenizer, why = importlib.import_module("maxfx.models._tokenizer").load_tokenizer(source)
            if tokenizer is None:
                raise ValueError(
                    f"PipelineRegistry.get_active_tokenizer: no tokenizer for {huggingface_repo.repo_id!r}: {why}"
                )
            self._cached_huggingface_tokenizers[huggingface_repo] = tokenizer
        return self._cached_huggingface_tokenizers[huggingface_repo]

    def _config_of(self, source: Any) -> tuple[Any, str]:
        """(Hugging Face config, where) of a repo, a `PipelineConfig`, a `MAXModelConfig`, or a path / repo id."""
        if isinstance(source, PipelineConfig):
            source = source.model_config
        if isinstance(source, MAXModelConfig):
            return source.huggingface_config, source.model_path
        if isinstance(source, HuggingFaceRepo):
            return self.get_active_huggingface_config(source), source.repo_id
        if isinstance(source, (str, Path)):
            path = Path(source).expanduser()
            if path.is_file():
                if path.suffix.lower() != ".gguf":
                    raise ValueError(
                        f"PipelineRegistry: {str(source)!r} is a file but not .gguf; pass a model folder, a .gguf file "
                        "or a repo id"
                    )
                return HuggingFaceConfig.from_dict(gguf_config(path)), str(source)
            return self.get_active_huggingface_config(HuggingFaceRepo(str(source))), str(source)
        raise TypeError(
            "PipelineRegistry: expected a HuggingFaceRepo, PipelineConfig, MAXModelConfig or a path, got "
            f"{type(source).__name__}"
        )

    # ─── lookups ──────────────────────────────────────────────────────────────

    def retrieve_architecture(
        self, huggingface_repo: Any, *, task: PipelineTask | str | None = None
    ) -> SupportedArchitecture | None:
        """The registered architecture of a model, or None when none matches (as MAX).

        Args:
            huggingface_repo: a `HuggingFaceRepo`, a `PipelineConfig` or `MAXModelConfig`
                (its model), a local folder / ``.gguf`` path or cached ``org/name`` repo
                id, or an architecture name (as later MAX).
            task: prefer the record for this task when the name serves several.

        Raises:
            FileNotFoundError / RepoNotAvailableOfflineError: no config to read.
        """
        task = None if task is None else _coerce("PipelineRegistry.retrieve_architecture", "task", task, PipelineTask)
        if (
            isinstance(huggingface_repo, str)
            and (arch := self._resolve_architecture(huggingface_repo, task)) is not None
        ):
            return arch
        if (
            isinstance(huggingface_repo, str)
            and "/" not in huggingface_repo
            and not Path(huggingface_repo).expanduser().exists()
        ):
            return None  # an architecture name that is not registered (neither a path nor an org/name repo id)
        config, where = self._config_of(huggingface_repo)
        names = _architecture_names(config)
        if not names:
            logger.debug("PipelineRegistry: the config of %s names no architecture", where)
            return None
        for name in names:
            if (arch := self._resolve_architecture(name, task)) is not None:
                return arch
        logger.debug("PipelineRegistry: no registered architecture for %s (%s)", where, names)
        return None

    def _register_custom(self, pipeline_config: Any) -> None:
        """Register the ``custom_architectures`` modules' ARCHITECTURES (imported by ``PipelineConfig.resolve``)."""
        for arch in getattr(pipeline_config, "custom_architecture_list", []) or []:
            if self._architectures_by_task.get((arch.name, arch.task)) is not arch:
                self.register(arch, allow_override=True)

    def _architecture(
        self, pipeline_config: Any, task: PipelineTask | None, override_architecture: str | None
    ) -> SupportedArchitecture:
        """The architecture a config resolves to, with clear errors."""
        self._register_custom(pipeline_config)
        if override_architecture:
            arch = self._resolve_architecture(override_architecture, task)
            if arch is None:
                raise ValueError(
                    f"override_architecture {override_architecture!r} is not registered; supported: "
                    f"{self._supported(task)}"
                )
        else:
            config, where = self._config_of(pipeline_config)
            names = _architecture_names(config)
            arch = next((a for n in names if (a := self._resolve_architecture(n, task)) is not None), None)
            if arch is None:
                stated = ", ".join(names) if names else "none (its config has no architectures or known model_type)"
                raise ValueError(
                    f"architecture {stated} of {where!r} is not supported; supported: {self._supported(task)}"
                )
        if task is not None and arch.task is not task:
            raise ValueError(
                f"architecture {arch.name} is registered for the task {arch.task.value!r}, not {task.value!r}"
            )
        return arch

    def retrieve_pipeline_task(self, pipeline_config: Any) -> PipelineTask:
        """The task of the configured model's architecture (text generation when its name serves several).

        Raises:
            ValueError: no registered architecture matches.
        """
        arch = self._architecture(pipeline_config, None, None)
        tasks = [a.task for a in self.architectures_for(arch.name)]
        return PipelineTask.TEXT_GENERATION if PipelineTask.TEXT_GENERATION in tasks else arch.task

    def _max_length(self, arch: SupportedArchitecture, pipeline_config: Any) -> int | None:
        hf_config = pipeline_config.model_config.huggingface_config
        if isinstance(arch.pipeline_model, type) and issubclass(arch.pipeline_model, PipelineModel):
            return arch.pipeline_model.calculate_max_seq_len(pipeline_config, huggingface_config=hf_config)
        return pipeline_config.max_length if pipeline_config.max_length is not None else model_max_length(hf_config)

    def retrieve_tokenizer(
        self, pipeline_config: Any, override_architecture: str | None = None, *, task: PipelineTask | str | None = None
    ) -> PipelineTokenizer:
        """The tokenizer of the configured model, built by its architecture's ``tokenizer`` factory.

        The factory gets ``model_path``, ``revision``, ``max_length`` (the model's
        ``calculate_max_seq_len`` for a `PipelineModel`, else the config's
        ``max_length``), ``trust_remote_code``, ``pipeline_config``, ``chat_template``
        (`PipelineConfig.retrieve_chat_template`) and ``context_validators``
        (when it cannot take them, ``new_context`` is wrapped to run them);
        ``enable_llama_whitespace_fix=True`` for Mistral and Phi-3 with `TextTokenizer`, as MAX.

        Raises:
            ValueError: no registered architecture matches (the message lists the supported ones).
        """
        task = None if task is None else _coerce("PipelineRegistry.retrieve_tokenizer", "task", task, PipelineTask)
        arch = self._architecture(pipeline_config, task, override_architecture)
        return self._build_tokenizer(arch, pipeline_config)

    def _build_tokenizer(self, arch: SupportedArchitecture, pipeline_config: Any) -> PipelineTokenizer:
        model_config = pipeline_config.model_config
        kwargs: dict[str, Any] = {
            "model_path": model_config.model_path,
            "revision": model_config.huggingface_model_revision,
            "max_length": self._max_length(arch, pipeline_config),
            "trust_remote_code": model_config.trust_remote_code,
            "pipeline_config": pipeline_config,
            "chat_template": pipeline_config.retrieve_chat_template(),
        }
        if arch.tokenizer is TextTokenizer and arch.name in _WHITESPACE_FIX_ARCHITECTURES:
            kwargs["enable_llama_whitespace_fix"] = True
        wrap = bool(arch.context_validators) and not _accepts(arch.tokenizer, "context_validators")
        if arch.context_validators and not wrap:
            kwargs["context_validators"] = list(arch.context_validators)
        tokenizer = arch.tokenizer(**kwargs)
        if wrap:
            tokenizer.new_context = _ValidatedNewContext(tokenizer, arch.context_validators)
        return tokenizer

    # ─── checks against the architecture ──────────────────────────────────────

    def _validate(self, arch: SupportedArchitecture, pipeline_config: Any) -> None:
        model_config = pipeline_config.model_config
        encoding = model_config.quantization_encoding
        if encoding is None:
            model_config.quantization_encoding = encoding = arch.default_encoding
        if encoding not in arch.supported_encodings:
            raise ValueError(
                f"architecture {arch.name} does not support the encoding {encoding.value!r} of "
                f"{model_config.model_path!r}; supported: {', '.join(e.value for e in arch.supported_encodings)}"
            )
        strategies = arch.supported_encodings[encoding]
        kv_cache = model_config.kv_cache
        if strategies:
            if kv_cache.cache_strategy is KVCacheStrategy.MODEL_DEFAULT:
                kv_cache.cache_strategy = strategies[0]
            elif kv_cache.cache_strategy not in strategies:
                raise ValueError(
                    f"architecture {arch.name} with {encoding.value} weights does not support the KV cache strategy "
                    f"{kv_cache.cache_strategy.value!r}; supported: {', '.join(s.value for s in strategies)}"
                )
        self._check_required_arguments(arch, pipeline_config)
        model_config.validate_multi_gpu_supported(arch.multi_gpu_supported)
        model_config.validate_and_resolve_rope_type(arch.rope_type)

    @staticmethod
    def _check_required_arguments(arch: SupportedArchitecture, pipeline_config: Any) -> None:
        """Each required option must hold its value: a default is set to it; an explicit other value is an error unless
        ``force``.
        """
        paths = PipelineConfig.option_paths()
        for name, required in arch.required_arguments.items():
            path = paths.get(name, name).split(".")
            owner = pipeline_config
            for part in path[:-1]:
                owner = getattr(owner, part, None)
            attr = path[-1]
            if owner is None or not hasattr(owner, attr):
                raise ValueError(
                    f"architecture {arch.name} requires the option {name}={required!r}, which no config has"
                )
            current = getattr(owner, attr)
            if current == required:
                continue
            fields = {f.name: f for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else {}
            if attr in fields and current == default_of(fields[attr]):
                logger.info(
                    "architecture %s requires %s=%r; setting it (was the default %r)",
                    arch.name,
                    name,
                    required,
                    current,
                )
                setattr(owner, attr, required)
            elif pipeline_config.force:
                logger.warning(
                    "architecture %s requires %s=%r, got %r (kept: force=True)", arch.name, name, required, current
                )
            else:
                raise ConfigError(
                    f"architecture {arch.name} requires {name}={required!r}, got {current!r} (force=True skips this "
                    "check)"
                )

    # ─── building pipelines ───────────────────────────────────────────────────

    def retrieve_factory(
        self,
        pipeline_config: Any,
        task: PipelineTask | str = PipelineTask.TEXT_GENERATION,
        override_architecture: str | None = None,
    ) -> tuple[PipelineTokenizer, Callable[[], Any]]:
        """The tokenizer and a zero-argument factory of the pipeline, without loading the model.

        Steps: register the config's ``custom_architectures``; find the architecture
        (``override_architecture``, else the model's config) for ``task``; check the
        encoding, KV cache strategy (``model_default`` becomes the architecture's),
        ``required_arguments``, devices and RoPE type against it; build the tokenizer
        (`retrieve_tokenizer`); pick the pipeline class (`get_pipeline_for_task`). The
        factory calls ``cls(pipeline_config=, pipeline_model=arch.pipeline_model,
        eos_token_id=tokenizer.eos, weight_adapters=arch.weight_adapters, tokenizer=)``.

        Raises:
            ValueError: an unsupported architecture, encoding or KV cache strategy, a
                task the architecture does not serve, an audio task, or a tokenizer without EOS.
            ConfigError: an option conflicting with ``required_arguments`` (unless ``force``).
            ImportError: the pipeline class is missing from this maxfx.
        """
        task = _coerce("PipelineRegistry.retrieve_factory", "task", task, PipelineTask)
        arch = self._architecture(pipeline_config, task, override_architecture)
        self._validate(arch, pipeline_config)
        pipeline_class = get_pipeline_for_task(task, pipeline_config)
        tokenizer = self._build_tokenizer(arch, pipeline_config)
        if tokenizer.eos is None:
            raise ValueError(
                f"the tokenizer of {pipeline_config.model_config.model_path!r} has no EOS token (tokenizer.eos is "
                "None): its tokenizer configuration is incomplete"
            )
        logger.info(
            "Loading %s and %s(%s) factory for %s: architecture %s, encoding %s, devices %s",
            type(tokenizer).__name__,
            pipeline_class.__name__,
            getattr(arch.pipeline_model, "__name__", arch.pipeline_model),
            pipeline_config.model_config.model_path,
            arch.name,
            pipeline_config.model_config.quantization_encoding.value,
            pipeline_config.model_config.device_specs,
        )
        factory = functools.partial(
            pipeline_class,
            pipeline_config=pipeline_config,
            pipeline_model=arch.pipeline_model,
            eos_token_id=tokenizer.eos,
            weight_adapters=arch.weight_adapters,
            tokenizer=tokenizer,
        )
        return tokenizer, factory

    def retrieve(
        self,
        pipeline_config: Any,
        task: PipelineTask | str = PipelineTask.TEXT_GENERATION,
        override_architecture: str | None = None,
    ) -> tuple[PipelineTokenizer, Any]:
        """The tokenizer and the pipeline (`retrieve_factory`, then the factory: this loads the model).

        Raises:
            as `retrieve_factory`, and whatever loading the model raises.
        """
        tokenizer, factory = self.retrieve_factory(pipeline_config, task, override_architecture)
        return tokenizer, factory()


PIPELINE_REGISTRY = PipelineRegistry([])
"""The shared registry; holds maxfx's built-in architectures once first used (until `reset`)."""
PIPELINE_REGISTRY._autoload = _BUILTIN_ARCHITECTURES
