"""A model's own files, read offline: ``config.json``, ``generation_config.json``, GGUF metadata.

`HuggingFaceConfig` stands in for transformers' ``AutoConfig``: the keys of
``config.json`` as attributes (nested ``*_config`` objects too), never downloaded.

Example:
    >>> cfg = HuggingFaceConfig.from_dict({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 128})
    >>> cfg.architectures, cfg.get("vocab_size", 0), model_max_length(cfg)
    (['LlamaForCausalLM'], 0, 128)
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from maxfx._json_file import read_json_file
from maxfx.pipelines.lib.hf_utils import read_gguf_metadata

__all__ = ["HuggingFaceConfig", "gguf_config", "model_max_length", "read_json"]

# GGUF general.architecture -> the Hugging Face architectures entry of the same model.
_GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}
# GGUF "<arch>.<key>" -> config.json key.
_GGUF_KEYS = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
}
# Keys under which configs state the longest sequence the model takes.
_MAX_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len")


class HuggingFaceConfig(SimpleNamespace):
    """A model's ``config.json`` with attribute access, like ``transformers.AutoConfig``.

    Example:
        >>> cfg = HuggingFaceConfig.from_dict({"model_type": "llama", "text_config": {"hidden_size": 8}})
        >>> cfg.text_config.hidden_size, "model_type" in cfg, cfg.to_dict()["text_config"]
        (8, True, {'hidden_size': 8})
    """

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HuggingFaceConfig:
        """Build from a dict; nested ``*_config`` dicts become `HuggingFaceConfig` too."""
        return cls(
            **{k: cls.from_dict(v) if isinstance(v, dict) and k.endswith("_config") else v for k, v in data.items()}
        )

    def to_dict(self) -> dict[str, Any]:
        """The config as a plain dict (nested configs too)."""
        return {k: v.to_dict() if isinstance(v, HuggingFaceConfig) else v for k, v in vars(self).items()}

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        return getattr(self, key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and hasattr(self, key)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it does not exist.

    Raises:
        ValueError: the file is not a JSON object (the message names it).
    """
    if not path.is_file():
        return None
    try:
        data = read_json_file(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def gguf_config(path: Path) -> dict[str, Any]:
    """A ``config.json``-like dict from a GGUF file's metadata (architecture, sizes, context length)."""
    meta = read_gguf_metadata(path)
    arch = str(meta.get("general.architecture", ""))
    config: dict[str, Any] = {
        "model_type": arch,
        "architectures": [_GGUF_ARCHITECTURES.get(arch, f"{arch.capitalize()}ForCausalLM")],
    }
    for key, name in _GGUF_KEYS.items():
        if f"{arch}.{key}" in meta:
            config[name] = meta[f"{arch}.{key}"]
    if "general.name" in meta:
        config["_name_or_path"] = meta["general.name"]
    return config


def model_max_length(config: HuggingFaceConfig | None) -> int | None:
    """The longest sequence a config says its model takes (``max_position_embeddings``, ``n_positions``...), or None."""
    if config is None:
        return None
    text = config.get("text_config")
    for source in (config, text) if isinstance(text, HuggingFaceConfig) else (config,):
        for key in _MAX_LENGTH_KEYS:
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None
