"""`load_pretrained`: a Hugging Face folder (``config.json`` + weights) or a ``.gguf`` file → a model.

Example:
    >>> model = load_pretrained("tests/data/models/tiny_llama")  # doctest: +SKIP
    >>> model(Tensor.constant([[1, 2, 3]], dtype=DType.int64)).shape  # doctest: +SKIP
    [Dim(1), Dim(3), Dim(256)]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lowering.dtypes import DType
from maxfx.graph.weights import GGUFWeights, load_weights
from maxfx.models._config import ConfigError, GPT2Config, LlamaConfig
from maxfx.models._generate import CausalLM
from maxfx.models._gpt2 import GPT2LMHeadModel
from maxfx.models._llama import LlamaForCausalLM
from maxfx.models._source import CheckpointSource, GGUFSource

__all__ = ["ARCHITECTURES", "check_architecture", "hf_checkpoint_source", "load_pretrained", "read_hf_config"]

# model_type / general.architecture -> (config class, model class)
ARCHITECTURES: dict[str, tuple[type, type]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "gpt2": (GPT2Config, GPT2LMHeadModel),
}

# Weight files of a Hugging Face folder, in order of preference (single file or shards).
_WEIGHT_PATTERNS = ("model.safetensors", "model-*-of-*.safetensors", "*.safetensors", "pytorch_model.bin", "pytorch_model-*-of-*.bin")


def load_pretrained(path: os.PathLike[str] | str, *, dtype: DType | None = None, device: Any = None) -> CausalLM:
    """Load a causal language model from a checkpoint.

    Args:
        path: a folder with ``config.json`` and ``model.safetensors`` (or shards,
            or ``pytorch_model.bin``), or a ``.gguf`` file (config from its metadata).
        dtype: convert float weights to this dtype (default: as stored). Packed
            GGUF weights stay packed.
        device: where to put the model (default CPU).

    Returns:
        a `LlamaForCausalLM` or `GPT2LMHeadModel`.

    Raises:
        FileNotFoundError: ``path`` does not exist, or the folder has no config or weights.
        ConfigError: bad ``config.json`` or GGUF metadata, or an unsupported architecture.
        CheckpointMismatchError: a tensor is missing, extra or mis-shaped for the config.
        ValueError: a corrupt or truncated weight file (the message names it).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"load_pretrained: {str(p)!r} does not exist")
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"load_pretrained: {str(p)!r} is a file but not .gguf; pass a folder with config.json and weights, or a .gguf file")
        model = _from_gguf(p, dtype)
    else:
        model = _from_folder(p, dtype)
    return model if device is None else model.to(device)


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
    try:
        raw = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{cfg_path}: expected a JSON object")
    check_architecture(raw.get("model_type"), str(cfg_path), "model_type")
    return raw, str(cfg_path)


def hf_checkpoint_source(folder: Path, dtype: DType | None, config_label: str) -> CheckpointSource:
    """A `CheckpointSource` over the folder's weight files (single file or shards; see `_WEIGHT_PATTERNS`)."""
    files = _weight_files(folder)
    label = str(files[0]) if len(files) == 1 else f"{len(files)} files in {folder}"
    return CheckpointSource(load_weights(files), label, dtype, config_label)


def _from_folder(folder: Path, dtype: DType | None) -> CausalLM:
    raw, where = read_hf_config(folder)
    config_cls, model_cls = ARCHITECTURES[raw["model_type"]]
    return model_cls.from_source(config_cls.from_hf(raw, where), hf_checkpoint_source(folder, dtype, where))


def _weight_files(folder: Path) -> list[Path]:
    for pattern in _WEIGHT_PATTERNS:
        found = sorted(folder.glob(pattern))
        if found:
            return found
    raise FileNotFoundError(f"load_pretrained: {str(folder)!r} has no weights (looked for {', '.join(_WEIGHT_PATTERNS)})")


def check_architecture(arch: Any, where: str, key: str) -> tuple[type, type]:
    """(config class, model class) of ``arch``; ConfigError naming ``where`` and ``key`` when it is unsupported."""
    if arch not in ARCHITECTURES:
        raise ConfigError(f"{where}: unsupported architecture {key}={arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}")
    return ARCHITECTURES[arch]


def _from_gguf(path: Path, dtype: DType | None) -> CausalLM:
    weights = GGUFWeights(path)
    meta = weights.metadata
    arch = meta.get("general.architecture")
    config_cls, model_cls = check_architecture(arch, str(path), "general.architecture")
    if model_cls is not LlamaForCausalLM:
        raise ConfigError(f"{path}: GGUF loading supports the llama architecture only, got general.architecture={arch!r}")
    names = {n for n, _ in weights.items()}
    factors = weights["rope_freqs.weight"].data().to_numpy() if "rope_freqs.weight" in names else None
    config = LlamaConfig.from_gguf(meta, names, factors, str(path))
    return model_cls.from_source(config, GGUFSource(weights, str(path), dtype, f"the metadata of {path.name}"))
