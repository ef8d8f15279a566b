"""The Llama-family architectures beyond Llama: how each reads its ``config.json``.

Qwen2, Qwen3, Mistral, Phi-3 and Gemma differ from Llama in a few well-defined
places, each a `LlamaConfig` field that the one Llama definition
(`maxfx.models._llama`: `read_llama`, the eager Modules, `llama_transformer`)
reads. This module is the one place that says which fields each architecture
sets and which ``config.json`` keys it requires:

=========  ==============================================================
qwen2      ``qkv_bias`` (q/k/v projections carry a bias)
qwen3      ``qk_norm`` (RMSNorm over head_dim on q and k before RoPE); ``head_dim`` required
mistral    ``sliding_window`` (each query sees the W latest positions)
phi3       ``fused_projections`` (``qkv_proj`` / ``gate_up_proj``, split at load); ``sliding_window``
gemma      ``norm_weight_offset=1``, ``scale_embeddings``, tanh-GELU MLP, tied head; ``head_dim`` required
=========  ==============================================================

Example:
    >>> cfg = Qwen3Config.from_hf({"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    ...                            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8})
    >>> cfg.architecture, cfg.qk_norm, cfg.head_dim
    ('qwen3', True, 8)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from maxfx.models._config import ConfigError, LlamaConfig, _bool, _get, _int

__all__ = ["GemmaConfig", "MistralConfig", "Phi3Config", "Qwen2Config", "Qwen3Config"]


def _head_dim_required(cfg: Mapping[str, Any], source: str) -> None:
    # Transformers' defaults (128 for Qwen3, 256 for Gemma) are not hidden_size / heads: a file without the key is
    # ambiguous.
    if cfg.get("head_dim") is None:
        raise ConfigError(
            f"{source}: missing config key 'head_dim' (required for model_type={cfg.get('model_type')!r}: it is "
            "independent of hidden_size / num_attention_heads)"
        )


def _no_layer_windows(cfg: Mapping[str, Any], source: str) -> None:
    # Qwen's `use_sliding_window` windows only some layers (`max_window_layers`): not modelled.
    if _bool(_get(cfg, "use_sliding_window", False), "use_sliding_window", source):
        raise ConfigError(
            f"{source}: use_sliding_window=true (per-layer sliding windows) is not supported for "
            f"model_type={cfg.get('model_type')!r}"
        )


@dataclass(frozen=True)
class Qwen2Config(LlamaConfig):
    """Qwen2: Llama with a bias on the q, k and v projections (not o_proj); tied or untied head."""

    architecture = "qwen2"

    @classmethod
    def hf_variant(cls, cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
        _no_layer_windows(cfg, source)
        return {"qkv_bias": True, "o_bias": False, "hidden_act": cfg.get("hidden_act") or "silu"}


@dataclass(frozen=True)
class Qwen3Config(LlamaConfig):
    """Qwen3: Llama with RMSNorm over head_dim on q and k before RoPE; ``head_dim`` is its own key."""

    architecture = "qwen3"

    @classmethod
    def hf_variant(cls, cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
        _head_dim_required(cfg, source)
        _no_layer_windows(cfg, source)
        return {**LlamaConfig.hf_variant(cfg, source), "qk_norm": True}


@dataclass(frozen=True)
class MistralConfig(LlamaConfig):
    """Mistral: Llama with sliding-window attention (``sliding_window`` positions, itself included; null: full)."""

    architecture = "mistral"

    @classmethod
    def hf_variant(cls, cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
        return {"sliding_window": cfg.get("sliding_window"), "hidden_act": cfg.get("hidden_act") or "silu"}


@dataclass(frozen=True)
class Phi3Config(LlamaConfig):
    """Phi-3: Llama whose checkpoint fuses ``qkv_proj`` ([q; k; v] rows) and ``gate_up_proj`` ([gate; up] rows);
    optional sliding window.
    """

    architecture = "phi3"

    @classmethod
    def hf_variant(cls, cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
        hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
        head_dim = None if cfg.get("head_dim") is None else _int(cfg["head_dim"], "head_dim", source)
        if (
            head_dim is not None
            and isinstance(hidden, int)
            and isinstance(heads, int)
            and heads
            and head_dim * heads != hidden
        ):
            raise ConfigError(
                f"{source}: head_dim {head_dim} contradicts hidden_size {hidden} / num_attention_heads {heads} (Phi-3 "
                "splits hidden_size into heads)"
            )
        return {
            "fused_projections": True,
            "sliding_window": cfg.get("sliding_window"),
            "hidden_act": cfg.get("hidden_act") or "silu",
        }


@dataclass(frozen=True)
class GemmaConfig(LlamaConfig):
    """Gemma: RMSNorm scale ``(1 + w)``, embeddings times ``sqrt(hidden_size)``, tanh-GELU gated MLP, tied head, own
    ``head_dim``.
    """

    architecture = "gemma"

    @classmethod
    def hf_variant(cls, cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
        _head_dim_required(cfg, source)
        if cfg.get("tie_word_embeddings") is False:
            raise ConfigError(
                f"{source}: tie_word_embeddings=false contradicts model_type='gemma' (Gemma's head is the embedding "
                "table)"
            )
        bias = _bool(_get(cfg, "attention_bias", False), "attention_bias", source)
        # `hidden_activation` is Gemma's own key (the tanh GELU the model was trained with); older files only have
        # `hidden_act`.
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        return {
            "qkv_bias": bias,
            "o_bias": bias,
            "hidden_act": act,
            "norm_weight_offset": 1.0,
            "norm_multiply_before_cast": True,
            "scale_embeddings": True,
        }

    def __post_init__(self) -> None:
        object.__setattr__(self, "tie_word_embeddings", True)  # Gemma always ties its head (HF's default too)
        super().__post_init__()
