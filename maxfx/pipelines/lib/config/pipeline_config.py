"""`PipelineConfig`: the one config of a text-generation or embeddings pipeline.

It takes flat keyword arguments and routes each to the config that owns it
(see `option_paths`): batching and scheduling options stay on the
`PipelineConfig`; model options go to `model_config` (a `MAXModelConfig`), KV
cache options to ``model_config.kv_cache``, sampling switches to
`sampling_config`, LoRA options to `lora_config`, ``draft_*`` options to
`draft_model_config`. Building one calls `resolve`, which checks every value.

Example:
    >>> config = PipelineConfig(model_path="tests/data/models/tiny_llama", max_batch_size=4, kv_cache_page_size=16,
    ...     enable_penalties=True)
    >>> config.max_length, config.model_config.kv_cache.kv_cache_page_size, config.sampling_config.enable_penalties
    (128, 16, True)
    >>> config.model_config.quantization_encoding, config.max_num_steps
    (<SupportedEncoding.float32: 'float32'>, 1)
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from maxfx.pipelines.lib.config._base import (
    ConfigError,
    MAXConfig,
    check_bool,
    check_int,
    check_number,
    check_str,
    coerce_enum,
    default_of,
    option,
    options,
)
from maxfx.pipelines.lib.config._enums import PipelineRole
from maxfx.pipelines.lib.config._model_files import model_max_length
from maxfx.pipelines.lib.config._routing import NESTED_CONFIGS, RoutedOptions, option_paths, route_options
from maxfx.pipelines.lib.config.kv_cache_config import KVCacheConfig
from maxfx.pipelines.lib.config.lora_config import LoRAConfig
from maxfx.pipelines.lib.config.model_config import MAXModelConfig
from maxfx.pipelines.lib.config.profiling_config import ProfilingConfig
from maxfx.pipelines.lib.config.sampling_config import SamplingConfig
from maxfx.pipelines.lib.config.speculative_config import SpeculativeConfig

__all__ = ["DEFAULT_PREFILL_CHUNK_SIZE", "PipelineConfig"]

logger = logging.getLogger("max.pipelines")

DEFAULT_PREFILL_CHUNK_SIZE = 8192
# Share of device_memory_utilization the target model keeps when a draft model shares the device (as MAX).
_TARGET_MEMORY_SHARE = 0.7
_OWNER = "PipelineConfig"


def _zmq_endpoint_base() -> str:
    return f"ipc://{tempfile.gettempdir()}/{uuid.uuid4()}"


def _env(name: str, default: str) -> Any:
    return lambda: os.environ.get(name, default)


@dataclass(init=False)
class PipelineConfig(MAXConfig):
    """The configuration of a pipeline, built from flat keyword arguments (``PipelineConfig(**kwargs)``).

    Args:
        **kwargs: any option of `PipelineConfig`, `MAXModelConfig`, `KVCacheConfig`,
            `SamplingConfig`, `LoRAConfig`, `ProfilingConfig` or `SpeculativeConfig`;
            ``draft_<option>`` for the draft model; or a whole nested config
            (``model_config=``, ``sampling_config=``...). `help` lists them all.

    Raises:
        UnknownConfigOptionError: an option no config has (the closest valid name is suggested).
        ConfigError: a value `resolve` rejects (the message names the option, the value and what it must be).
        RepoNotAvailableOfflineError: ``model_path`` is neither local nor in the Hugging Face cache.
    """

    max_length: int | None = option(
        None, doc="Longest sequence (prompt + generated tokens), >= 1 (default: the model's max_position_embeddings)."
    )
    pipeline_role: PipelineRole = option(
        PipelineRole.PrefillAndDecode,
        doc="Role in disaggregated serving: 'prefill_and_decode', 'prefill_only' or 'decode_only'.",
    )
    max_batch_size: int | None = option(
        None, doc="Most sequences decoded at once, >= 1 (default: the engine derives it from free memory)."
    )
    max_ce_batch_size: int = option(
        192,
        doc=(
            "Most requests in one prefill (context-encoding) batch; the lesser of this and max_batch_size applies "
            "(192)."
        ),
    )
    max_queue_size_tg: int | None = option(
        None, doc="Most requests waiting in the decode queue (default: max_batch_size)."
    )
    min_batch_size_tg: int | None = option(
        None, doc="TTS scheduler: soft floor on the decode batch size (default: max_queue_size_tg)."
    )
    ep_size: int = option(1, doc="Expert-parallel degree (1: none).")
    ce_delay_ms: float = option(0.0, doc="TTS scheduler: sleep before each prefill batch, in ms (0.0).")
    enable_prioritize_first_decode: bool = option(
        False, doc="TTS scheduler: run a decode batch right after each prefill, on the same requests (False)."
    )
    experimental_background_queue: bool = option(False, doc="Drain the request queues on a background thread (False).")
    enable_chunked_prefill: bool = option(True, doc="Split long prompts into prefill_chunk_size chunks (True).")
    enable_in_flight_batching: bool = option(False, doc="Let decode tokens ride along in prefill batches (False).")
    max_num_steps: int = option(
        -1, doc="Decode steps per scheduler iteration, >= 1; -1 picks the platform default (1 on CPU, 10 on GPU)."
    )
    prefill_chunk_size: int = option(
        DEFAULT_PREFILL_CHUNK_SIZE,
        doc="Target number of un-encoded tokens per batch, for chunked prefill and memory planning (8192).",
    )
    enable_echo: bool = option(False, doc="Build the model with echo (prompt log-probabilities) support (False).")
    pool_embeddings: bool = option(True, doc="Pool embedding outputs (True).")
    chat_template: Path | None = option(
        None,
        doc="File with a chat template overriding the model's (a Jinja template, or JSON with a 'chat_template' key).",
    )
    use_experimental_kernels: str = option(
        factory=_env("USE_EXPERIMENTAL_KERNELS", "false"),
        doc="Use experimental kernels ('false'; MAX's Mojo kernels, accepted for compatibility).",
    )
    use_vendor_blas: str = option(
        factory=_env("MAX_SERVE_USE_VENDOR_BLAS", "false"),
        doc="Use the vendor BLAS for matmuls ('false'; accepted for compatibility, XLA picks).",
    )
    pdl_level: str = option(
        factory=_env("PDL_LEVEL", "0"), doc="GPU kernel-launch overlap level ('0'; accepted for compatibility)."
    )
    custom_architectures: list[str] = option(
        factory=list, doc="Modules ('mod' or 'path/to/folder:mod') whose ARCHITECTURES list is registered ([])."
    )
    zmq_endpoint_base: str = option(
        factory=_zmq_endpoint_base, doc="Prefix of the IPC endpoint names, unique per config (random)."
    )
    execute_empty_batches: bool = option(False, doc="Run the model on empty batches too (expert parallelism) (False).")
    max_batch_context_length: int | None = option(
        None, doc="Cap on the summed context length of a batch, >= 1 (None: no cap)."
    )
    force: bool = option(
        False, doc="Skip checks against the architecture's required arguments and the model's limits (False)."
    )

    _model_config: MAXModelConfig = field(default_factory=MAXModelConfig, repr=False)
    _draft_model_config: MAXModelConfig | None = field(default=None, repr=False)
    _sampling_config: SamplingConfig = field(default_factory=SamplingConfig, repr=False)
    _profiling_config: ProfilingConfig = field(default_factory=ProfilingConfig, repr=False)
    _lora_config: LoRAConfig | None = field(default=None, repr=False)
    _speculative_config: SpeculativeConfig | None = field(default=None, repr=False)

    def __init__(self, **kwargs: Any) -> None:
        routed = route_options(type(self), kwargs)
        for f in options(type(self)):
            setattr(self, f.name, routed.pipeline[f.name] if f.name in routed.pipeline else default_of(f))
        self._custom_architecture_list: list[Any] = []
        self._model_config = _build_model(
            routed.objects.get("model_config"), routed.model, routed.kv_cache, "model_config"
        )
        self._draft_model_config = _build_draft(routed)
        if self._draft_model_config is not None:
            self._split_memory_with_draft(routed)
        self._lora_config = _build_lora(routed.objects.get("lora_config"), routed.lora)
        self._profiling_config = _merge(
            routed.objects.get("profiling_config"), ProfilingConfig, routed.profiling, "profiling_config"
        )
        self._speculative_config = _build_speculative(routed, self._draft_model_config)
        self._sampling_config = self._build_sampling(routed)
        self.resolve()

    # ─── building the nested configs ──────────────────────────────────────────

    def _split_memory_with_draft(self, routed: RoutedOptions) -> None:
        """Share device memory as MAX does: the target keeps 70% of the utilization, the draft the rest."""
        if "device_memory_utilization" in routed.draft_kv_cache:
            return
        total = self._model_config.kv_cache.device_memory_utilization
        self._model_config.kv_cache.device_memory_utilization = total * _TARGET_MEMORY_SHARE
        self._draft_model_config.kv_cache.device_memory_utilization = total - total * _TARGET_MEMORY_SHARE

    def _build_sampling(self, routed: RoutedOptions) -> SamplingConfig:
        given = routed.objects.get("sampling_config")
        if given is not None:
            sampling = _merge(given, SamplingConfig, routed.sampling, "sampling_config")
        else:
            sampling = SamplingConfig.from_generation_config_sampling_defaults(
                self._model_config.sampling_params_defaults, **routed.sampling
            )
        if self._draft_model_config is not None:
            sampling.enable_variable_logits = True
        return sampling

    # ─── the nested configs ───────────────────────────────────────────────────

    @property
    def model_config(self) -> MAXModelConfig:
        """The `MAXModelConfig` of the served model (its KV cache: ``model_config.kv_cache``)."""
        return self._model_config

    @property
    def draft_model_config(self) -> MAXModelConfig | None:
        """The `MAXModelConfig` of the speculative-decoding draft model, or None."""
        return self._draft_model_config

    @property
    def sampling_config(self) -> SamplingConfig:
        """The `SamplingConfig` (structured output, penalties, min_tokens, variable logits)."""
        return self._sampling_config

    @property
    def lora_config(self) -> LoRAConfig | None:
        """The `LoRAConfig`, or None unless ``enable_lora``."""
        return self._lora_config

    @property
    def profiling_config(self) -> ProfilingConfig:
        """The `ProfilingConfig`."""
        return self._profiling_config

    @property
    def speculative_config(self) -> SpeculativeConfig | None:
        """The `SpeculativeConfig` (set with a draft model), or None."""
        return self._speculative_config

    @property
    def graph_quantization_encoding(self) -> Any:
        """The model's encoding as a graph `QuantizationEncoding` (None for float encodings and q8_0)."""
        return self._model_config.graph_quantization_encoding

    # ─── checking ─────────────────────────────────────────────────────────────

    def resolve(self) -> None:
        """Check every option, resolve the model(s) and fill in derived values.

        Fills in ``max_length`` (the model's limit when None), ``max_num_steps``
        (-1 -> 1 on CPU, 10 on GPU), the encoding and weight files of the model.
        With a draft model: variable logits on, penalties and (unless ``force``)
        prefix caching off, echo and structured output rejected. Safe to call again
        after changing options.

        Raises:
            ConfigError: an invalid value (the message names the option, the value and what it must be).
            RepoNotAvailableOfflineError: a model neither local nor in the Hugging Face cache.
        """
        self._validate_options()
        self._import_custom_architectures()
        self._resolve_chat_template()
        self._model_config.resolve()
        self._sampling_config.validate()
        self._profiling_config.validate()
        if self._lora_config is not None:
            self._lora_config.resolve()
            if len(self._model_config.device_specs) > 1:
                raise ConfigError(
                    f"{_OWNER}.lora_config: LoRA runs on one device, got "
                    f"device_specs={self._model_config.device_specs!r}"
                )
        self._resolve_max_length()
        if self.max_num_steps == -1:
            self.max_num_steps = 1 if self._model_config.default_device_spec.device_type == "cpu" else 10
        if self.enable_echo:
            self._sampling_config.enable_variable_logits = True
        if self._draft_model_config is not None:
            self._draft_model_config.resolve()
            self._validate_speculative_decoding()

    def _validate_options(self) -> None:
        for name in ("max_length", "max_batch_size", "max_queue_size_tg", "max_batch_context_length"):
            setattr(self, name, check_int(_OWNER, name, getattr(self, name), minimum=1, optional=True))
        self.min_batch_size_tg = check_int(
            _OWNER, "min_batch_size_tg", self.min_batch_size_tg, minimum=0, optional=True
        )
        for name in ("max_ce_batch_size", "ep_size", "prefill_chunk_size"):
            setattr(self, name, check_int(_OWNER, name, getattr(self, name), minimum=1))
        self.max_num_steps = check_int(_OWNER, "max_num_steps", self.max_num_steps, minimum=1, also=(-1,))
        self.ce_delay_ms = check_number(_OWNER, "ce_delay_ms", self.ce_delay_ms, minimum=0.0)
        self.pipeline_role = coerce_enum(_OWNER, "pipeline_role", self.pipeline_role, PipelineRole)
        for name in (
            "enable_prioritize_first_decode",
            "experimental_background_queue",
            "enable_chunked_prefill",
            "enable_in_flight_batching",
            "enable_echo",
            "pool_embeddings",
            "execute_empty_batches",
            "force",
        ):
            setattr(self, name, check_bool(_OWNER, name, getattr(self, name)))
        for name in ("use_experimental_kernels", "use_vendor_blas", "pdl_level", "zmq_endpoint_base"):
            setattr(self, name, check_str(_OWNER, name, getattr(self, name)))
        if self.chat_template is not None:
            self.chat_template = Path(check_str(_OWNER, "chat_template", self.chat_template))
        if isinstance(self.custom_architectures, str):
            self.custom_architectures = [self.custom_architectures]
        if not isinstance(self.custom_architectures, (list, tuple)) or not all(
            isinstance(m, str) for m in self.custom_architectures
        ):
            raise ConfigError(
                f"{_OWNER}.custom_architectures must be a list of module names ('mod' or 'path:mod'), got "
                f"{self.custom_architectures!r}"
            )
        self.custom_architectures = list(self.custom_architectures)

    def _resolve_max_length(self) -> None:
        try:
            limit = model_max_length(self._model_config.huggingface_config)
        except (OSError, ValueError) as err:
            logger.debug("%s: no model config to bound max_length (%s)", _OWNER, err)
            return
        if limit is None:
            return
        if self.max_length is None:
            self.max_length = limit
        elif self.max_length > limit:
            if not self.force:
                raise ConfigError(
                    f"{_OWNER}.max_length must be at most the model's max_position_embeddings ({limit}) of "
                    f"{self._model_config.model_path!r}, got {self.max_length} (force=True skips this check)"
                )
            logger.warning(
                "%s: max_length %d exceeds the model's limit %d (kept: force=True)", _OWNER, self.max_length, limit
            )

    def _validate_speculative_decoding(self) -> None:
        draft, target = self._draft_model_config, self._model_config
        if self.enable_echo:
            raise ConfigError(
                f"{_OWNER}.enable_echo must be False with speculative decoding "
                f"(draft_model_path={draft.model_path!r}), got True"
            )
        if self._sampling_config.enable_structured_output:
            raise ConfigError(
                f"{_OWNER}.enable_structured_output must be False with speculative decoding "
                f"(draft_model_path={draft.model_path!r}), got True"
            )
        if self._speculative_config is not None and self._speculative_config.is_standalone():
            self._check_draft_matches_target(draft, target)
        self._sampling_config.enable_variable_logits = True
        if self._sampling_config.enable_penalties:
            logger.warning(
                "%s: frequency/presence/repetition penalties are not supported with speculative decoding; "
                "enable_penalties set to False",
                _OWNER,
            )
            self._sampling_config.enable_penalties = False
        if target.kv_cache.enable_prefix_caching and not self.force:
            logger.warning(
                "%s: prefix caching is not supported with speculative decoding; enable_prefix_caching set to False "
                "(force=True keeps it)",
                _OWNER,
            )
            target.kv_cache.enable_prefix_caching = False
            draft.kv_cache.enable_prefix_caching = False

    @staticmethod
    def _check_draft_matches_target(draft: MAXModelConfig, target: MAXModelConfig) -> None:
        try:
            d, t = draft.huggingface_config, target.huggingface_config
        except (OSError, ValueError):
            return
        for key, what in (("architectures", "architecture"), ("vocab_size", "vocabulary size")):
            if d.get(key) is not None and t.get(key) is not None and d.get(key) != t.get(key):
                raise ConfigError(
                    f"{_OWNER}.draft_model_path must name a model with the target's {what} ({t.get(key)!r} for "
                    f"{target.model_path!r}), got {d.get(key)!r} for {draft.model_path!r}"
                )

    def _resolve_chat_template(self) -> None:
        if self.chat_template is None:
            return
        path = self.chat_template.expanduser()
        self.chat_template = path if path.is_absolute() else Path.cwd() / path
        if not self.chat_template.is_file():
            raise ConfigError(
                f"{_OWNER}.chat_template must be an existing template file, got {str(self.chat_template)!r}"
            )

    def _import_custom_architectures(self) -> None:
        """Import each ``custom_architectures`` module and keep its ARCHITECTURES (`PipelineRegistry.retrieve*`
        registers them).
        """
        found = []
        for spec in self.custom_architectures:
            parts = spec.split(":")
            if len(parts) > 2:
                raise ConfigError(
                    f"{_OWNER}.custom_architectures entry must be 'module' or 'path:module', got {spec!r}"
                )
            folder, name = parts if len(parts) == 2 else (os.path.dirname(spec), os.path.basename(spec))
            if folder and folder not in sys.path:
                sys.path.append(folder)
            try:
                module = importlib.import_module(name)
            except Exception as err:
                raise ConfigError(
                    f"{_OWNER}.custom_architectures entry {spec!r} must be an importable module: {type(err).__name__}: "
                    f"{err}"
                ) from err
            archs = getattr(module, "ARCHITECTURES", None)
            if not isinstance(archs, list) or not archs:
                raise ConfigError(
                    f"{_OWNER}.custom_architectures entry {spec!r} must expose a non-empty ARCHITECTURES list, got "
                    f"{archs!r}"
                )
            found.extend(archs)
        self._custom_architecture_list = found  # the registry registers them when it resolves this config

    @property
    def custom_architecture_list(self) -> list[Any]:
        """The architectures the ``custom_architectures`` modules expose (imported by `resolve`)."""
        return list(self._custom_architecture_list)

    # ─── other methods ────────────────────────────────────────────────────────

    def retrieve_chat_template(self) -> str | None:
        """The text of ``chat_template`` (its ``chat_template`` key when the file is JSON), or None.

        Raises:
            ConfigError: the file cannot be read as UTF-8 text.
        """
        if self.chat_template is None:
            return None
        try:
            text = Path(self.chat_template).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(
                f"{_OWNER}.chat_template must be a readable UTF-8 file, got {str(self.chat_template)!r}: {err}"
            ) from err
        try:
            data = json.loads(text)
        except ValueError:
            return text
        return data["chat_template"] if isinstance(data, dict) and isinstance(data.get("chat_template"), str) else text

    def configure_session(self, session: Any) -> None:
        """Apply the profiling mode (and, where the session has them, the kernel knobs) to an `InferenceSession`."""
        session.gpu_profiling(self._profiling_config.gpu_profiling)
        for setter, value in (
            ("_use_experimental_kernels", self.use_experimental_kernels),
            ("_use_vendor_blas", self.use_vendor_blas),
            ("_pdl_level", self.pdl_level),
        ):
            if hasattr(session, setter):
                getattr(session, setter)(value)

    @classmethod
    def help(cls) -> dict[str, str]:
        """Every flat option -> its description (this config's, then each nested config's, then ``draft_*``).

        Example:
            >>> PipelineConfig.help()["kv_cache_page_size"]
            'Tokens per page of the paged KV cache (128). maxfx takes any positive size.'
        """
        out = dict(super().help())
        for nested in (MAXModelConfig, KVCacheConfig, SamplingConfig, LoRAConfig, ProfilingConfig, SpeculativeConfig):
            out.update(nested.help())
        out.update(
            {
                f"draft_{k}": f"Draft model: {v}"
                for nested in (MAXModelConfig, KVCacheConfig)
                for k, v in nested.help().items()
            }
        )
        out["do_penalties"] = "Alias of enable_penalties (MAX 25.x's name)."
        out.update({k: f"A whole {c.__name__} (instead of its flat options)." for k, c in NESTED_CONFIGS.items()})
        return out

    @classmethod
    def option_paths(cls) -> dict[str, str]:
        """Every flat option -> the attribute that holds it once built (``kv_cache_page_size`` ->
        ``model_config.kv_cache.kv_cache_page_size``).
        """
        return option_paths(cls)

    def log_basic_config(self) -> None:
        """Log the main settings (model, encoding, weights, batch size, length, devices) at INFO on
        ``max.pipelines``.
        """
        m = self._model_config
        arch = _architecture(m)
        logger.info(
            "Model: %s (%s), encoding %s, weights %s",
            m.model_name,
            arch,
            m.quantization_encoding,
            [str(p) for p in m.weight_path],
        )
        logger.info(
            "Pipeline: max_batch_size=%s max_length=%s devices=%s", self.max_batch_size, self.max_length, m.device_specs
        )

    def log_pipeline_info(self) -> None:
        """Log the model, the pipeline settings and each KV cache config at INFO on ``max.pipelines``."""
        m = self._model_config
        logger.info("Model Information")
        for key, value in (
            ("architecture", _architecture(m)),
            ("model_path", m.model_path),
            ("huggingface_revision", m.huggingface_model_revision),
            ("quantization_encoding", _encoding_text(m)),
            ("weight_path", [str(p) for p in m.weight_path]),
            ("devices", m.device_specs),
        ):
            logger.info("    %-22s : %s", key, value)
        logger.info("Pipeline Config")
        for key in (
            "max_length",
            "max_batch_size",
            "enable_chunked_prefill",
            "prefill_chunk_size",
            "enable_in_flight_batching",
            "max_num_steps",
        ):
            logger.info("    %-22s : %s", key, getattr(self, key))
        for title, config in (("KVCache Config", m), ("Draft Model KVCache Config", self._draft_model_config)):
            if config is None:
                continue
            logger.info(title)
            kv = config.kv_cache
            for key in (
                "cache_strategy",
                "kv_cache_page_size",
                "enable_prefix_caching",
                "enable_kvcache_swapping_to_host",
                "device_memory_utilization",
            ):
                logger.info("    %-22s : %s", key, getattr(kv, key))


def _architecture(model: MAXModelConfig) -> str:
    try:
        return ", ".join(model.huggingface_config.get("architectures") or ["?"])
    except (OSError, ValueError):
        return "?"


def _encoding_text(model: MAXModelConfig) -> str:
    text = str(getattr(model.quantization_encoding, "value", model.quantization_encoding))
    return f"{text} (cast from {model._applied_dtype_cast_from.value})" if model._applied_dtype_cast_from else text


def _merge(given: Any, cls: type, flat: dict[str, Any], name: str) -> Any:
    """A nested config from a whole object (``name=``) and/or flat options (which win)."""
    if given is None:
        return cls(**flat)
    if not isinstance(given, cls):
        raise ConfigError(f"{_OWNER}.{name} must be a {cls.__name__}, got {given!r}")
    return dataclasses.replace(given, **flat) if flat else given


def _build_model(
    given: MAXModelConfig | None, flat: dict[str, Any], kv_flat: dict[str, Any], name: str
) -> MAXModelConfig:
    model = _merge(given, MAXModelConfig, flat, name)
    if kv_flat:
        model.kv_cache = dataclasses.replace(model.kv_cache, **kv_flat)
    return model


def _build_draft(routed: RoutedOptions) -> MAXModelConfig | None:
    """The draft model's config when ``draft_model_path`` (or ``draft_model_config``) is given."""
    given = routed.objects.get("draft_model_config")
    has_path = bool(routed.draft_model.get("model_path") or routed.draft_model.get("model"))
    if given is None and not has_path:
        extra = sorted(f"draft_{k}" for k in (*routed.draft_model, *routed.draft_kv_cache))
        if extra:
            raise ConfigError(f"{_OWNER}.draft_model_path must be set to use {', '.join(extra)}, got none")
        return None
    return _build_model(given, routed.draft_model, routed.draft_kv_cache, "draft_model_config")


def _build_lora(given: LoRAConfig | None, flat: dict[str, Any]) -> LoRAConfig | None:
    """The LoRA config when ``enable_lora`` is on (other LoRA options without it are an error)."""
    lora = _merge(given, LoRAConfig, flat, "lora_config") if given is not None or flat else None
    if lora is None or lora.enable_lora:
        return lora
    set_options = sorted(k for k in flat if k != "enable_lora")
    if set_options:
        raise ConfigError(f"{_OWNER}.enable_lora must be True to use {', '.join(set_options)}, got False")
    return None


def _build_speculative(routed: RoutedOptions, draft: MAXModelConfig | None) -> SpeculativeConfig | None:
    given = routed.objects.get("speculative_config")
    if draft is None:
        if given is not None or routed.speculative:
            raise ConfigError(
                f"{_OWNER}.draft_model_path must be set for speculative decoding options "
                f"({', '.join(routed.speculative) or 'speculative_config'}), got none"
            )
        return None
    return _merge(given, SpeculativeConfig, routed.speculative, "speculative_config")
