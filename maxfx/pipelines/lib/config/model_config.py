"""`MAXModelConfig`: which model, from where, in which encoding, on which devices (`PipelineConfig.model_config`).

``model_path`` is a local folder (``config.json`` + weights), a ``.gguf`` file,
or a Hugging Face repo id found in the local cache; nothing is downloaded.
`resolve` checks it and fills in the encoding and the weight files.

Example:
    >>> m = MAXModelConfig(model_path="tests/data/models/tiny_llama", quantization_encoding="q8_0")
    >>> m.resolve()
    >>> [p.name for p in m.weight_path], m.local_model_path.name, m.huggingface_config.architectures
    (['tiny_llama-q8_0.gguf'], 'tiny_llama-q8_0.gguf', ['LlamaForCausalLM'])
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxfx.pipelines.lib.config import _deps
from maxfx.pipelines.lib.config._base import (
    ConfigError,
    MAXConfig,
    check_bool,
    check_int,
    check_str,
    coerce_enum,
    option,
)
from maxfx.pipelines.lib.config._enums import RopeType, SupportedEncoding
from maxfx.pipelines.lib.config._model_files import HuggingFaceConfig, gguf_config, read_json
from maxfx.pipelines.lib.config.kv_cache_config import KVCacheConfig
from maxfx.pipelines.lib.hf_utils import HuggingFaceRepo, RepoNotAvailableOfflineError, validate_hf_repo_access

__all__ = ["MAXModelConfig"]

logger = logging.getLogger("max.pipelines")

_OWNER = "MAXModelConfig"
# Encodings a checkpoint may be cast between at load time.
_CASTABLE = (SupportedEncoding.float32, SupportedEncoding.bfloat16)
# transformers' GenerationConfig defaults: a generation_config.json value equal to one says nothing (MAX reads
# to_diff_dict()).
_HF_GENERATION_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0, "do_sample": False}


def _scan_devices() -> list[Any]:
    return _deps.driver().scan_available_devices()


@dataclass
class MAXModelConfig(MAXConfig):
    """The model to serve (or the draft model of speculative decoding), and its KV cache (`kv_cache`).

    Derived after `resolve`: `model_name`, `graph_quantization_encoding`,
    `weights_size`, `huggingface_config` (``config.json``, or a GGUF file's
    metadata), `sampling_params_defaults` (``generation_config.json``), and the
    maxfx additions `local_model_path` and `resolved_weight_paths`.
    """

    model_path: str = option(
        "",
        doc=(
            "Model to serve: a local folder (config.json + weights), a .gguf file, or a Hugging Face repo id in the "
            "local cache."
        ),
    )
    model: str = option("", doc="Alias of model_path (MAX's --model).")
    served_model_name: str | None = option(None, doc="Name clients use for the model (default: model_path).")
    weight_path: list[Path] = option(
        factory=list,
        doc=(
            "Weight files to load (safetensors, GGUF or .bin): local paths, or paths inside the model's repo (default: "
            "found in the repo)."
        ),
    )
    quantization_encoding: SupportedEncoding | None = option(
        None,
        doc=(
            "Weight encoding: float32, bfloat16, q4_k, q4_0, q6_k, q8_0, float8_e4m3fn, float4_e2m1fnx2 or gptq "
            "(default: inferred from the weights)."
        ),
    )
    allow_safetensors_weights_fp32_bf6_bidirectional_cast: bool = option(
        False, doc="Allow casting float32 safetensors weights to bfloat16 and back when loading (False)."
    )
    huggingface_model_revision: str = option(
        "main", doc="Revision (branch, tag or commit) of the model repo in the Hugging Face cache ('main')."
    )
    huggingface_weight_revision: str = option("main", doc="Revision of the repo the weights come from ('main').")
    trust_remote_code: bool = option(False, doc="Allow the repo's own modelling code (False; maxfx never runs it).")
    device_specs: list[Any] = option(
        factory=_scan_devices,
        doc="Devices to run on: DeviceSpecs, or 'cpu', 'gpu', 'gpu:0,1' (default: every GPU, else the CPU).",
    )
    force_download: bool = option(
        False, doc="Download files again even if cached (False; maxfx is offline and uses the cached files)."
    )
    vision_config_overrides: dict[str, Any] = option(factory=dict, doc="Model-specific vision config overrides ({}).")
    rope_type: RopeType | None = option(
        None,
        doc=(
            "Force a RoPE flavour for GGUF weights: none, normal, neox, longrope or yarn (default: the architecture's)."
        ),
    )
    use_subgraphs: bool = option(True, doc="Compile repeated blocks once (True).")
    data_parallel_degree: int = option(1, doc="Replicas of the model for data parallelism (1).")
    kv_cache: KVCacheConfig = option(factory=KVCacheConfig, nested=True, doc="The KV cache config of this model.")

    def __post_init__(self) -> None:
        self._weights_repo_id: str | None = None
        self._applied_dtype_cast_from: SupportedEncoding | None = None
        self._applied_dtype_cast_to: SupportedEncoding | None = None
        self._cache: dict[str, Any] = {}
        if self.model and self.model_path and str(self.model) != str(self.model_path):
            raise ConfigError(
                f"{_OWNER}.model and model_path name the same option; pass one of them, got model={self.model!r} and "
                f"model_path={self.model_path!r}"
            )
        if self.model:
            self.model_path = self.model
        self.model = ""
        self.validate()

    # ─── checks ───────────────────────────────────────────────────────────────

    def validate(self) -> None:
        """Check the options and convert strings, without touching files (a `ConfigError` names the option).

        Raises:
            ConfigError: e.g. an unknown encoding, ``data_parallel_degree`` below 1, a bad device spec.
        """
        self.model_path = check_str(_OWNER, "model_path", self.model_path)
        self.served_model_name = check_str(_OWNER, "served_model_name", self.served_model_name, optional=True)
        weights = self.weight_path
        weights = [weights] if isinstance(weights, (str, Path)) else weights
        if not isinstance(weights, (list, tuple)) or not all(isinstance(p, (str, Path)) for p in weights):
            raise ConfigError(f"{_OWNER}.weight_path must be a list of paths, got {self.weight_path!r}")
        self.weight_path = [Path(p) for p in weights]
        self.quantization_encoding = coerce_enum(
            _OWNER, "quantization_encoding", self.quantization_encoding, SupportedEncoding, optional=True
        )
        self.rope_type = coerce_enum(_OWNER, "rope_type", self.rope_type, RopeType, optional=True)
        for name in (
            "allow_safetensors_weights_fp32_bf6_bidirectional_cast",
            "trust_remote_code",
            "force_download",
            "use_subgraphs",
        ):
            setattr(self, name, check_bool(_OWNER, name, getattr(self, name)))
        for name in ("huggingface_model_revision", "huggingface_weight_revision"):
            setattr(self, name, check_str(_OWNER, name, getattr(self, name)))
        self.data_parallel_degree = check_int(_OWNER, "data_parallel_degree", self.data_parallel_degree, minimum=1)
        if not isinstance(self.vision_config_overrides, dict):
            raise ConfigError(f"{_OWNER}.vision_config_overrides must be a dict, got {self.vision_config_overrides!r}")
        self.device_specs = _parse_device_specs(self.device_specs)
        if isinstance(self.kv_cache, dict):
            self.kv_cache = KVCacheConfig(**self.kv_cache)
        if not isinstance(self.kv_cache, KVCacheConfig):
            raise ConfigError(f"{_OWNER}.kv_cache must be a KVCacheConfig, got {self.kv_cache!r}")
        self.kv_cache.validate()

    def resolve(self) -> None:
        """Check the model can be read offline and fill in ``quantization_encoding``, ``weight_path`` and
        ``served_model_name``.

        Raises:
            ConfigError: no model_path nor weight_path, a missing weight file, an encoding the weights do not have,
            missing devices.
            RepoNotAvailableOfflineError: ``model_path`` is neither local nor in the Hugging Face cache.
        """
        self.validate()
        self._cache.clear()
        self._check_devices()
        self._resolve_model_path()
        self._resolve_encoding()
        self._resolve_weight_path()
        if self.served_model_name is None:
            self.served_model_name = self.model_path

    def _check_devices(self) -> None:
        driver = _deps.driver()
        if not driver.devices_exist(self.device_specs):
            raise ConfigError(
                f"{_OWNER}.device_specs must name devices of this machine ({driver.scan_available_devices()}), got "
                f"{self.device_specs!r}"
            )

    def _resolve_model_path(self) -> None:
        if self.allow_safetensors_weights_fp32_bf6_bidirectional_cast and self.quantization_encoding is None:
            raise ConfigError(
                f"{_OWNER}.quantization_encoding must be set when "
                "allow_safetensors_weights_fp32_bf6_bidirectional_cast is True (the encoding to cast to), got None"
            )
        if not self.model_path:
            if not self.weight_path:
                raise ConfigError(
                    f"{_OWNER}.model_path must be a local folder, a .gguf file or a Hugging Face repo id in the local "
                    "cache, got '' (and weight_path is empty)"
                )
            self.model_path = self._model_path_from_weights()
        local = Path(self.model_path).expanduser()
        if local.is_file():
            if local.suffix.lower() != ".gguf":
                raise ConfigError(
                    f"{_OWNER}.model_path must be a folder, a .gguf file or a repo id, got the file {self.model_path!r}"
                )
            if not self.weight_path:
                self.weight_path = [local]
        elif not local.exists():
            try:
                validate_hf_repo_access(self.model_path, self.huggingface_model_revision)
            except RepoNotAvailableOfflineError as err:
                raise RepoNotAvailableOfflineError(f"{_OWNER}.model_path: {err}") from err

    def _model_path_from_weights(self) -> str:
        """model_path derived from weight_path: the local file's folder (the file itself for a lone .gguf), or
        ``org/name`` of ``org/name/file``.
        """
        first = self.weight_path[0].expanduser()
        if first.exists():
            folder = first.parent
            return (
                str(first)
                if first.suffix.lower() == ".gguf" and not (folder / "config.json").is_file()
                else str(folder)
            )
        parts = first.parts
        if len(parts) < 3:
            raise ConfigError(
                f"{_OWNER}.weight_path entry {str(first)!r} must be an existing file or 'org/repo/file' of a repo in "
                "the Hugging Face cache"
            )
        repo_id = "/".join(parts[:2])
        self._weights_repo_id = repo_id
        self.weight_path = [Path(*p.parts[2:]) if p.parts[:2] == parts[:2] else p for p in self.weight_path]
        return repo_id

    def _resolve_encoding(self) -> None:
        repo = self.huggingface_weight_repo
        wanted = self.quantization_encoding
        if self.weight_path:
            stored = self._file_encoding(self._weight_file(self.weight_path[0]), repo)
        else:
            available = repo.supported_encodings
            if not available:
                raise ConfigError(
                    f"{_OWNER}.model_path {self.model_path!r} must hold weights (.safetensors, .gguf or .bin), found "
                    f"none in {repo.local_path}"
                )
            if wanted is None or wanted in available:
                self.quantization_encoding = wanted or self._default_encoding(repo, available)
                return
            stored = (
                next((e for e in available if e in _CASTABLE), None)
                if self.allow_safetensors_weights_fp32_bf6_bidirectional_cast
                else None
            )
            if stored is None:
                raise ConfigError(
                    f"{_OWNER}.quantization_encoding must be an encoding the weights of {self.model_path!r} come in "
                    f"({', '.join(e.value for e in available)}), got {wanted.value!r}"
                )
        if wanted is None or stored is wanted:
            self.quantization_encoding = stored
        elif self.allow_safetensors_weights_fp32_bf6_bidirectional_cast and stored in _CASTABLE and wanted in _CASTABLE:
            self._applied_dtype_cast_from, self._applied_dtype_cast_to = stored, wanted
        else:
            raise ConfigError(
                f"{_OWNER}.quantization_encoding must match the weights' encoding {stored.value!r} "
                f"({self.weight_path[0]}) or be castable to it, got {wanted.value!r}"
            )

    def _default_encoding(self, repo: HuggingFaceRepo, available: list[SupportedEncoding]) -> SupportedEncoding:
        """With several encodings in a repo: float8/bfloat16 on a GPU (as MAX), else the checkpoint's own
        (safetensors/.bin) one.
        """
        if self.default_device_spec.device_type == "gpu":
            for preferred in (SupportedEncoding.float8_e4m3fn, SupportedEncoding.bfloat16):
                if preferred in available:
                    return preferred
        fmt = _weights_format()
        native = [e for e in available if {fmt.safetensors, fmt.pytorch} & set(repo.files_for_encoding(e))]
        return (native or available)[0]

    def _resolve_weight_path(self) -> None:
        if not self.weight_path:
            fmt = _weights_format()
            files = self.huggingface_weight_repo.files_for_encoding(
                self._applied_dtype_cast_from or self.quantization_encoding
            )
            found = next((files[f] for f in (fmt.safetensors, fmt.gguf, fmt.pytorch) if f in files), [])
            if not found:
                raise ConfigError(
                    f"{_OWNER}.weight_path: no weight files of encoding {self.quantization_encoding.value!r} in "
                    f"{self.huggingface_weight_repo.local_path}"
                )
            self.weight_path = list(found)
        for path in self.weight_path:
            if not self._weight_file(path).is_file():
                raise ConfigError(
                    f"{_OWNER}.weight_path entry {str(path)!r} must be an existing file (as given, or inside "
                    f"{self.huggingface_weight_repo.local_path}); not found"
                )

    def _weight_file(self, path: Path) -> Path:
        path = Path(path).expanduser()
        return path if path.exists() or path.is_absolute() else self.huggingface_weight_repo.local_path / path

    @staticmethod
    def _file_encoding(path: Path, repo: HuggingFaceRepo) -> SupportedEncoding:
        if not path.is_file():
            raise ConfigError(f"{_OWNER}.weight_path entry {str(path)!r} must be an existing weight file; not found")
        name = path.name.lower()
        if name.endswith(".gguf"):
            return repo.encoding_for_file(path)
        if name.endswith(".safetensors"):
            return HuggingFaceRepo(str(path.parent)).encoding_for_file(path.name)
        if name.endswith(".bin"):
            return repo.encoding_for_file(path.name)
        raise ConfigError(f"{_OWNER}.weight_path entry {str(path)!r} must be a .safetensors, .gguf or .bin file")

    # ─── derived values ───────────────────────────────────────────────────────

    @property
    def kv_cache_config(self) -> KVCacheConfig:
        """The `KVCacheConfig` of this model (MAX's name of `kv_cache`)."""
        return self.kv_cache

    @property
    def model_name(self) -> str:
        """The name clients use: ``served_model_name``, else ``model_path``."""
        return self.served_model_name if self.served_model_name is not None else self.model_path

    @property
    def default_device_spec(self) -> Any:
        """The first of ``device_specs``."""
        return self.device_specs[0]

    @property
    def graph_quantization_encoding(self) -> Any:
        """``quantization_encoding`` as a graph `QuantizationEncoding` (None for float encodings and q8_0).

        Raises:
            ConfigError: no encoding is set yet (call `resolve`).
        """
        if self.quantization_encoding is None:
            raise ConfigError(
                f"{_OWNER}.quantization_encoding must be set (resolve() infers it) to give a graph quantization "
                "encoding, got None"
            )
        return self.quantization_encoding.quantization_encoding

    @property
    def huggingface_model_repo(self) -> HuggingFaceRepo:
        """The `HuggingFaceRepo` of the model (the folder of a ``.gguf`` model_path).

        Raises:
            ConfigError: ``model_path`` is empty (`resolve` derives it from ``weight_path``).
            RepoNotAvailableOfflineError: neither local nor in the Hugging Face cache.
        """
        if not self.model_path:
            raise ConfigError(
                f"{_OWNER}.model_path must be set to find the model's repo (resolve() derives it from weight_path), "
                "got ''"
            )
        if "repo" not in self._cache:
            local = Path(self.model_path).expanduser()
            repo_id = str(local.parent) if local.is_file() else self.model_path
            self._cache["repo"] = HuggingFaceRepo(
                repo_id, revision=self.huggingface_model_revision, trust_remote_code=self.trust_remote_code
            )
        return self._cache["repo"]

    @property
    def huggingface_weight_repo_id(self) -> str:
        """The repo the weights come from (``org/name`` of an ``org/name/file`` weight path, else the model's)."""
        return self._weights_repo_id or self.huggingface_model_repo.repo_id

    @property
    def huggingface_weight_repo(self) -> HuggingFaceRepo:
        """The `HuggingFaceRepo` the weights come from."""
        if self._weights_repo_id is None:
            return self.huggingface_model_repo
        if "weight_repo" not in self._cache:
            self._cache["weight_repo"] = HuggingFaceRepo(
                self._weights_repo_id,
                revision=self.huggingface_weight_revision,
                trust_remote_code=self.trust_remote_code,
            )
        return self._cache["weight_repo"]

    @property
    def huggingface_config(self) -> HuggingFaceConfig:
        """The model's ``config.json`` (or, for a GGUF checkpoint without one, its metadata) as a `HuggingFaceConfig`.

        Raises:
            FileNotFoundError: neither is there.
        """
        if "hf_config" not in self._cache:
            root = self.huggingface_model_repo.local_path
            data = read_json(root / "config.json")
            if data is None:
                ggufs = [
                    p
                    for p in (Path(self.model_path).expanduser(), *map(self._weight_file, self.weight_path))
                    if p.suffix.lower() == ".gguf" and p.is_file()
                ]
                if not ggufs:
                    raise FileNotFoundError(
                        f"{_OWNER}.huggingface_config: {root} has no config.json, and no GGUF weight file to read one "
                        "from"
                    )
                data = gguf_config(ggufs[0])
            self._cache["hf_config"] = HuggingFaceConfig.from_dict(data)
        return self._cache["hf_config"]

    @property
    def generation_config(self) -> dict[str, Any]:
        """The model's ``generation_config.json`` as a dict ({} when there is none)."""
        if "generation_config" not in self._cache:
            self._cache["generation_config"] = (
                read_json(self.huggingface_model_repo.local_path / "generation_config.json") or {}
            )
        return self._cache["generation_config"]

    @property
    def sampling_params_defaults(self) -> Any:
        """A `SamplingParamsGenerationConfigDefaults` of what ``generation_config.json`` sets (values equal to
        transformers' defaults left out, as MAX).

        An unreadable model gives empty defaults (logged at debug level).
        """
        try:
            generation = self.generation_config
        except (OSError, ValueError) as err:
            logger.debug(
                "%s: no generation config for %r (%s); using empty sampling defaults", _OWNER, self.model_path, err
            )
            generation = {}
        explicit = {
            k: v for k, v in generation.items() if k not in _HF_GENERATION_DEFAULTS or _HF_GENERATION_DEFAULTS[k] != v
        }
        return _deps.sampling_defaults_class().from_generation_config(explicit)

    def resolved_weight_paths(self) -> list[Path]:
        """Local paths of the weight files (resolving first if ``weight_path`` is empty)."""
        if not self.weight_path:
            self.resolve()
        return [self._weight_file(p) for p in self.weight_path]

    @property
    def local_model_path(self) -> Path:
        """What to give ``maxfx.models.load_pretrained``: the ``.gguf`` file when that is the weights, else the model
        folder.
        """
        paths = self.resolved_weight_paths()
        if len(paths) == 1 and paths[0].suffix.lower() == ".gguf":
            return paths[0]
        return self.huggingface_weight_repo.local_path

    def weights_size(self) -> int:
        """Total bytes of the weight files.

        Raises:
            ConfigError: as `resolve`, when the weights still have to be found.
        """
        return sum(p.stat().st_size for p in self.resolved_weight_paths())

    # ─── checks the registry runs against an architecture ─────────────────────

    def validate_multi_gpu_supported(self, multi_gpu_supported: bool) -> None:
        """Raise if several GPUs are configured for an architecture that runs on one.

        Raises:
            ConfigError: more than one GPU in ``device_specs`` and ``multi_gpu_supported`` is False.
        """
        if not multi_gpu_supported and len(self.device_specs) > 1 and self.default_device_spec.device_type == "gpu":
            raise ConfigError(
                f"{_OWNER}.device_specs must name one GPU: {self.model_path!r}'s architecture does not run on several, "
                f"got {self.device_specs!r}"
            )

    def validate_and_resolve_rope_type(self, arch_rope_type: RopeType) -> None:
        """Take the architecture's RoPE flavour unless one was forced."""
        if self.rope_type is None:
            self.rope_type = coerce_enum(_OWNER, "rope_type", arch_rope_type, RopeType)

    def validate_prefix_caching_supported(self, prefix_caching_supported: bool) -> None:
        """Turn prefix caching off (logging a warning) for an architecture that does not support it."""
        if not prefix_caching_supported and self.kv_cache.enable_prefix_caching:
            logger.warning(
                "%s: the architecture of %r does not support prefix caching; enable_prefix_caching set to False",
                _OWNER,
                self.model_path,
            )
            self.kv_cache.enable_prefix_caching = False


def _weights_format() -> Any:
    return _deps.weights_format()


def _parse_device_specs(value: Any) -> list[Any]:
    """``device_specs`` as a list of DeviceSpecs: DeviceSpecs, or 'cpu', 'gpu' (every GPU), 'gpu:0,1'."""
    driver = _deps.driver()
    items = value if isinstance(value, (list, tuple)) else [value]
    specs: list[Any] = []
    for item in items:
        if isinstance(item, driver.DeviceSpec):
            specs.append(item)
            continue
        text = item.strip().lower() if isinstance(item, str) else None
        if text == "cpu":
            specs.append(driver.DeviceSpec.cpu())
        elif text == "gpu":
            specs.extend(s for s in driver.scan_available_devices() if s.device_type == "gpu")
        elif text is not None and text.startswith("gpu:") and all(p.strip().isdigit() for p in text[4:].split(",")):
            specs.extend(driver.DeviceSpec.accelerator(int(p)) for p in text[4:].split(","))
        else:
            raise ConfigError(f"{_OWNER}.device_specs must be DeviceSpecs or 'cpu', 'gpu', 'gpu:0,1', got {value!r}")
    if not specs:
        raise ConfigError(f"{_OWNER}.device_specs must name at least one device, got {value!r}")
    return specs
