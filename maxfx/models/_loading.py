"""`load_pretrained` and `open_checkpoint`: a Hugging Face folder (``config.json`` + weights) or a ``.gguf`` file → a
model.

`open_checkpoint` is the one reader of configs and weight files: it returns the
config and a `ParamSource`, from which `load_pretrained` builds eager Modules and
`load_pretrained_graph` a `maxfx.nn` graph, so both accept the same paths and
raise the same errors.

Example:
    >>> model = load_pretrained("tests/data/models/tiny_llama")  # doctest: +SKIP
    >>> model(Tensor([[1, 2, 3]], dtype=DType.int64)).shape  # doctest: +SKIP
    [Dim(1), Dim(3), Dim(256)]
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lowering.dtypes import DType
from maxfx._json_file import read_json_file
from maxfx.experimental._defaults import defaults
from maxfx.graph.weights import GGUFWeights, load_weights
from maxfx.models._config import ConfigError, GPT2Config, LlamaConfig
from maxfx.models._families import GemmaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config
from maxfx.models._generate import CausalLM
from maxfx.models._gpt2 import GPT2LMHeadModel
from maxfx.models._llama import LlamaForCausalLM
from maxfx.models._source import CheckpointSource, GGUFSource, ParamSource
from maxfx.models._tokenizer import attach_tokenizer

__all__ = [
    "ARCHITECTURES",
    "check_architecture",
    "load_pretrained",
    "open_checkpoint",
    "read_hf_config",
    "weights_dtype",
]

# model_type / general.architecture -> (config class, model class)
# The Llama family shares one definition (`LlamaForCausalLM`); each config class says what differs.
ARCHITECTURES: dict[str, tuple[type, type]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, LlamaForCausalLM),
    "qwen3": (Qwen3Config, LlamaForCausalLM),
    "mistral": (MistralConfig, LlamaForCausalLM),
    "phi3": (Phi3Config, LlamaForCausalLM),
    "gemma": (GemmaConfig, LlamaForCausalLM),
    "gpt2": (GPT2Config, GPT2LMHeadModel),
}
# GGUF tensor names are mapped to HF names for these architectures only (see _source.gguf_name).
_GGUF_ARCHITECTURES = ("llama",)

# Weight files of a Hugging Face folder, in order of preference (single file or shards).
_WEIGHT_PATTERNS = (
    "model.safetensors",
    "model-*-of-*.safetensors",
    "*.safetensors",
    "pytorch_model.bin",
    "pytorch_model-*-of-*.bin",
)


def load_pretrained(path: os.PathLike[str] | str, *, dtype: DType | None = None, device: Any = None) -> CausalLM:
    """Load a causal language model from a checkpoint.

    Args:
        path: a folder with ``config.json`` and ``model.safetensors`` (or shards,
            or ``pytorch_model.bin``), or a ``.gguf`` file (config from its metadata).
        dtype: convert float weights to this dtype (default: as stored): a `DType`
            or its name (``"bfloat16"``, ``"float32"``...). Packed GGUF weights stay packed.
        device: where to put the model; default: MAX's default device, the first
            GPU when there is one, else the CPU (``MAXFX_DEFAULT_DEVICE=cpu``
            keeps models on the CPU of a GPU machine).

    Returns:
        a `LlamaForCausalLM` (Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma: the
        config's class says which) or a `GPT2LMHeadModel`.

    Raises:
        TypeError: ``dtype`` is neither a DType, a dtype name nor None.
        FileNotFoundError: ``path`` does not exist, or the folder has no config or weights.
        ConfigError: bad ``config.json`` or GGUF metadata, or an unsupported architecture.
        CheckpointMismatchError: a tensor is missing, extra or mis-shaped for the config.
        ValueError: a corrupt or truncated weight file (the message names it), or
            ``dtype`` names no float dtype.
        TokenizerError: a corrupt ``tokenizer.json``, or a GGUF tokenizer other than byte-level BPE.
    """
    start = time.perf_counter()
    config, src = open_checkpoint(path, dtype, "load_pretrained")
    model = ARCHITECTURES[config.architecture][1].from_source(config, src)
    if device is None:
        device = defaults()[1]  # MAX's default device
        if device.is_host:
            device = None  # the weights were read into host memory: they stay there, uncopied
    model = model if device is None else model.to(device)
    attach_tokenizer(model, path, since=start)  # model.tokenizer (or None) and the load time of model.last_stats
    return model


def open_checkpoint(
    path: os.PathLike[str] | str, dtype: DType | None, caller: str, *, only: Sequence[str] | None = None
) -> tuple[Any, ParamSource]:
    """The config and a `ParamSource` of a checkpoint: what `load_pretrained` and `load_pretrained_graph` both build
    from.

    Args:
        path: a Hugging Face folder (``config.json`` + weights) or a ``.gguf`` file.
        dtype: convert float weights to this dtype (None: as stored).
        caller: the function named in error messages.
        only: the architectures the caller supports (default: every one in `ARCHITECTURES`).

    Raises:
        as `load_pretrained`.

    Example:
        >>> config, src = open_checkpoint("tests/data/models/tiny_llama", None, "example")  # doctest: +SKIP
        >>> config.architecture, src.read("model.norm.weight", (64,)).value.shape  # doctest: +SKIP
        ('llama', (64,))
    """
    dtype = weights_dtype(dtype, caller)
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{caller}: {str(p)!r} does not exist")
    if not p.is_file():
        return _open_folder(p, dtype, caller, only)
    if p.suffix.lower() != ".gguf":
        raise ValueError(
            f"{caller}: {str(p)!r} is a file but not .gguf; pass a folder with config.json and weights, or a .gguf file"
        )
    return _open_gguf(p, dtype, caller, only)


def weights_dtype(dtype: Any, caller: str) -> DType | None:
    """The ``dtype`` argument of the loaders as a `DType`: a DType, a dtype name (``"bfloat16"``, ``"float32"``...) or
    None.

    Raises:
        TypeError: ``dtype`` is neither a DType, a str nor None (the message names ``dtype``).
        ValueError: a name that is not a float DType's (the message lists them).

    Example:
        >>> weights_dtype("bfloat16", "load_pretrained")
        <DType.bfloat16: 80>
    """
    if dtype is None or isinstance(dtype, DType):
        return dtype
    floats = [d.name for d in DType if d.is_float()]
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("dtype.")
        if name in floats:
            return DType[name]
        raise ValueError(
            f"{caller}: dtype={dtype!r} is not a float dtype name; expected a maxfx.dtype.DType or one of {floats}"
        )
    raise TypeError(
        f"{caller}: dtype must be a maxfx.dtype.DType (e.g. DType.bfloat16) or a dtype name such as 'bfloat16' or "
        f"'float32', got {type(dtype).__name__} {dtype!r}"
    )


def read_hf_config(folder: Path, caller: str = "load_pretrained") -> tuple[dict[str, Any], str]:
    """The ``config.json`` of a Hugging Face folder as a dict, and its path (for messages).

    Raises:
        FileNotFoundError: the folder has no ``config.json`` (the message starts with ``caller``).
        ConfigError: the file is not a JSON object, or its ``model_type`` is not in `ARCHITECTURES`.

    Example:
        >>> raw, where = read_hf_config(Path("tests/data/models/tiny_llama"))  # doctest: +SKIP
        >>> raw["model_type"]  # doctest: +SKIP
        'llama'
    """
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{caller}: {str(folder)!r} has no config.json")
    raw = read_json_file(cfg_path, ConfigError)
    if not isinstance(raw, dict):
        raise ConfigError(f"{cfg_path}: expected a JSON object")
    check_architecture(raw.get("model_type"), str(cfg_path), "model_type")
    return raw, str(cfg_path)


def check_architecture(arch: Any, where: str, key: str) -> tuple[type, type]:
    """(config class, model class) of ``arch``; ConfigError naming ``where`` and ``key`` when it is unsupported."""
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"{where}: unsupported architecture {key}={arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    return ARCHITECTURES[arch]


def _require(arch: str, supported: Sequence[str] | None, where: str, key: str, what: str) -> None:
    if supported is not None and arch not in supported:
        raise ConfigError(
            f"{where}: {what} supports the {' and '.join(supported)} architecture only, got {key}={arch!r}"
        )


def _open_folder(folder: Path, dtype: DType | None, caller: str, only: Sequence[str] | None) -> tuple[Any, ParamSource]:
    raw, where = read_hf_config(folder, caller)
    config_cls, _ = check_architecture(raw["model_type"], where, "model_type")
    _require(raw["model_type"], only, where, "model_type", caller)
    config = config_cls.from_hf(raw, where)
    files = _weight_files(folder, caller)
    label = str(files[0]) if len(files) == 1 else f"{len(files)} files in {folder}"
    declared = raw.get("torch_dtype") or raw.get("dtype")
    return config, CheckpointSource(
        load_weights(files),
        label,
        dtype,
        where,
        config_dtype=str(declared).removeprefix("torch.") if declared else None,
    )


def _weight_files(folder: Path, caller: str) -> list[Path]:
    for pattern in _WEIGHT_PATTERNS:
        found = sorted(folder.glob(pattern))
        if found:
            return found
    raise FileNotFoundError(f"{caller}: {str(folder)!r} has no weights (looked for {', '.join(_WEIGHT_PATTERNS)})")


def _open_gguf(path: Path, dtype: DType | None, caller: str, only: Sequence[str] | None) -> tuple[Any, ParamSource]:
    weights = GGUFWeights(path)
    meta = weights.metadata
    arch, key = meta.get("general.architecture"), "general.architecture"
    check_architecture(arch, str(path), key)
    _require(arch, _GGUF_ARCHITECTURES, str(path), key, "GGUF loading")
    _require(arch, only, str(path), key, caller)
    factors = weights["rope_freqs.weight"].values() if "rope_freqs.weight" in weights else None
    config = LlamaConfig.from_gguf(meta, {n for n, _ in weights.items()}, factors, str(path))
    return config, GGUFSource(weights, str(path), dtype, f"the metadata of {path.name}")
