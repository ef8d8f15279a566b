"""Model configurations: `LlamaConfig` and `GPT2Config`, read from ``config.json`` or GGUF metadata.

Configs are frozen (hashable) dataclasses: a model stores its config as static
pytree metadata, so two models with equal configs share compiled programs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from maxfx.nn._rope import Llama3RopeScalingParams, default_inv_freq, scaled_inv_freq

__all__ = ["MLP_ACTIVATIONS", "ConfigError", "GPT2Config", "LlamaConfig"]


class ConfigError(ValueError):
    """A model configuration is missing a key, has a bad value, or names an unsupported architecture."""


def _need(cfg: Mapping[str, Any], key: str, source: str, *alts: str) -> Any:
    for k in (key, *alts):
        if cfg.get(k) is not None:
            return cfg[k]
    names = " or ".join(repr(k) for k in (key, *alts))
    raise ConfigError(f"{source}: missing config key {names}")


def _positive_int(value: Any, key: str, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) <= 0:
        raise ConfigError(f"{source}: {key} must be a positive integer, got {value!r}")
    return int(value)


def _int(value: Any, key: str, source: str) -> int:
    """A config integer: a JSON int (or an integral float such as ``2048.0``), never a bool or a string.

    Example:
        >>> _int("2048", "max_position_embeddings", "config.json")
        Traceback (most recent call last):
        ...
        maxfx.models._config.ConfigError: config.json: max_position_embeddings must be an integer, got '2048' (str)
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (float, np.floating)) and np.isfinite(value) and float(value).is_integer():
        return int(value)
    raise ConfigError(f"{source}: {key} must be an integer, got {value!r} ({type(value).__name__})")


def _float(value: Any, key: str, source: str) -> float:
    """A config number as a float: a finite JSON int or float, never a bool or a string."""
    if (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, (bool, np.bool_))
        and np.isfinite(value)
    ):
        return float(value)
    raise ConfigError(f"{source}: {key} must be a finite number, got {value!r} ({type(value).__name__})")


def _bool(value: Any, key: str, source: str) -> bool:
    """A config flag: JSON ``true``/``false`` only (``bool("false")`` would be True)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ConfigError(f"{source}: {key} must be true or false, got {value!r} ({type(value).__name__})")


def _get(cfg: Mapping[str, Any], key: str, default: Any) -> Any:
    """``cfg[key]``, or ``default`` when it is missing or null."""
    value = cfg.get(key)
    return default if value is None else value


def _freeze(d: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    return None if not d else tuple(sorted((str(k), v) for k, v in d.items()))


@dataclass(frozen=True)
class LlamaConfig:
    """Hyperparameters of a Llama-family decoder (grouped-query attention, RoPE, SwiGLU).

    ``rope_scaling`` holds Llama 3's ``{"rope_type": "llama3", "factor", "low_freq_factor",
    "high_freq_factor", "original_max_position_embeddings"}`` as sorted items;
    ``rope_freq_factors`` holds the per-frequency divisors GGUF files store
    instead (``rope_freqs.weight``).

    Example:
        >>> cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
        ...                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        >>> cfg.head_dim, cfg.inv_freq().shape
        (16, (8,))
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rope_freq_factors: tuple[float, ...] | None = None
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Llama-family variants (set by the architectures' configs in `maxfx.models._families`):
    qkv_bias: bool = False  # q/k/v projections have a bias (Qwen2; `attention_bias`)
    o_bias: bool = False  # o_proj has a bias (Llama's and Qwen3's `attention_bias`)
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    sliding_window: int | None = (
        None  # each query sees the `sliding_window` latest positions, itself included (Mistral, Phi-3)
    )
    hidden_act: str = "silu"  # the gated MLP's activation (HF name)
    norm_weight_offset: float = 0.0  # RMSNorm scales by (offset + w) (Gemma: 1)
    norm_multiply_before_cast: bool = False  # RMSNorm multiplies in float32, then casts (Gemma)
    scale_embeddings: bool = False  # embeddings times sqrt(hidden_size), in the weights' dtype (Gemma)
    fused_projections: bool = False  # checkpoint stores qkv_proj and gate_up_proj fused (Phi-3)

    architecture = "llama"

    def __post_init__(self) -> None:
        src = type(self).__name__
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
        ):
            _positive_int(getattr(self, key), key, src)
        if not self.head_dim:
            if self.hidden_size % self.num_attention_heads:
                raise ConfigError(
                    f"{src}: hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                    f"{self.num_attention_heads}"
                )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.head_dim % 2:
            raise ConfigError(f"{src}: head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{src}: num_attention_heads {self.num_attention_heads} must be a multiple of num_key_value_heads "
                f"{self.num_key_value_heads}"
            )
        if self.rope_scaling is not None:
            kind = dict(self.rope_scaling).get("rope_type", dict(self.rope_scaling).get("type"))
            if kind not in ("llama3", "default", None):
                raise ConfigError(
                    f"{src}: rope_scaling type {kind!r} is not supported (supported: 'llama3', 'default')"
                )
            if kind == "llama3":  # read later by llama3_scaling: check the numbers now
                scaling = dict(self.rope_scaling)
                for key in ("factor", "low_freq_factor", "high_freq_factor"):
                    _float(_need(scaling, key, f"{src}: rope_scaling"), f"rope_scaling.{key}", src)
                _int(
                    _need(scaling, "original_max_position_embeddings", f"{src}: rope_scaling"),
                    "rope_scaling.original_max_position_embeddings",
                    src,
                )
        if self.sliding_window is not None and (
            isinstance(self.sliding_window, bool)
            or not isinstance(self.sliding_window, (int, np.integer))
            or self.sliding_window <= 0
        ):
            raise ConfigError(f"{src}: sliding_window must be a positive integer or null, got {self.sliding_window!r}")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in MLP_ACTIVATIONS:
            raise ConfigError(
                f"{src}: hidden_act {self.hidden_act!r} is not supported (supported: "
                f"{', '.join(sorted(MLP_ACTIVATIONS))})"
            )
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != self.head_dim // 2:
            raise ConfigError(
                f"{src}: rope_freq_factors has {len(self.rope_freq_factors)} entries, head_dim {self.head_dim} needs "
                f"{self.head_dim // 2}"
            )

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], source: str = "config.json") -> LlamaConfig:
        """From a Hugging Face ``config.json`` dict (``rope_theta``/``rope_scaling`` or ``rope_parameters``).

        Subclasses (`maxfx.models._families`) add their architecture's fields in `hf_variant`.

        Raises:
            ConfigError: a missing or bad key, naming ``source`` and the key.
        """
        rope = cfg.get("rope_parameters") or {}
        if not isinstance(rope, Mapping):
            raise ConfigError(f"{source}: rope_parameters must be an object, got {rope!r}")
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling")
        if scaling is None and rope.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling is not None and not isinstance(scaling, Mapping):
            raise ConfigError(f"{source}: rope_scaling must be an object or null, got {scaling!r}")
        partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
        if partial is not None and _float(partial, "partial_rotary_factor", source) != 1.0:
            raise ConfigError(
                f"{source}: partial_rotary_factor {partial!r} is not supported (RoPE over the whole head_dim only)"
            )
        heads = _need(cfg, "num_attention_heads", source)
        try:
            return cls(
                vocab_size=_need(cfg, "vocab_size", source),
                hidden_size=_need(cfg, "hidden_size", source),
                intermediate_size=_need(cfg, "intermediate_size", source),
                num_hidden_layers=_need(cfg, "num_hidden_layers", source),
                num_attention_heads=heads,
                num_key_value_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=_int(_get(cfg, "head_dim", 0), "head_dim", source),
                rms_norm_eps=_float(_get(cfg, "rms_norm_eps", 1e-6), "rms_norm_eps", source),
                rope_theta=_float(theta, "rope_theta", source),
                rope_scaling=_freeze(scaling),
                tie_word_embeddings=_bool(_get(cfg, "tie_word_embeddings", False), "tie_word_embeddings", source),
                max_position_embeddings=_int(
                    _get(cfg, "max_position_embeddings", 2048), "max_position_embeddings", source
                ),
                bos_token_id=_first(cfg.get("bos_token_id"), "bos_token_id", source),
                eos_token_id=_first(cfg.get("eos_token_id"), "eos_token_id", source),
                **cls.hf_variant(cfg, source),
            )
        except ConfigError as e:
            raise ConfigError(str(e).replace(f"{cls.__name__}:", f"{source}:", 1)) from None

    @classmethod
    def hf_variant(cls, cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
        """The variant fields an architecture reads from ``config.json`` (Llama: ``attention_bias``, ``hidden_act``)."""
        if _bool(_get(cfg, "mlp_bias", False), "mlp_bias", source):
            raise ConfigError(f"{source}: mlp_bias=true is not supported")
        bias = _bool(_get(cfg, "attention_bias", False), "attention_bias", source)
        return {"qkv_bias": bias, "o_bias": bias, "hidden_act": cfg.get("hidden_act") or "silu"}

    @classmethod
    def from_gguf(
        cls, meta: Mapping[str, Any], tensor_names: set[str], rope_factors: np.ndarray | None, source: str
    ) -> LlamaConfig:
        """From GGUF metadata (``llama.*`` keys) and the file's tensor names."""
        p = "llama."
        heads = _need(meta, p + "attention.head_count", source)
        hidden = _need(meta, p + "embedding_length", source)
        vocab = meta.get(p + "vocab_size")
        if vocab is None:
            tokens = meta.get("tokenizer.ggml.tokens")
            vocab = len(tokens) if tokens is not None else None
        head_dim_key = (
            p + "attention.key_length" if meta.get(p + "attention.key_length") else p + "rope.dimension_count"
        )
        return cls(
            vocab_size=_need({"v": vocab}, "v", source) if vocab is None else _int(vocab, p + "vocab_size", source),
            hidden_size=_int(hidden, p + "embedding_length", source),
            intermediate_size=_int(_need(meta, p + "feed_forward_length", source), p + "feed_forward_length", source),
            num_hidden_layers=_int(_need(meta, p + "block_count", source), p + "block_count", source),
            num_attention_heads=_int(heads, p + "attention.head_count", source),
            num_key_value_heads=_int(
                meta.get(p + "attention.head_count_kv") or heads, p + "attention.head_count_kv", source
            ),
            head_dim=_int(meta.get(head_dim_key) or 0, head_dim_key, source),
            rms_norm_eps=_float(
                _get(meta, p + "attention.layer_norm_rms_epsilon", 1e-5), p + "attention.layer_norm_rms_epsilon", source
            ),
            rope_theta=_float(_get(meta, p + "rope.freq_base", 10000.0), p + "rope.freq_base", source),
            rope_freq_factors=None
            if rope_factors is None
            else tuple(float(f) for f in np.asarray(rope_factors).reshape(-1)),
            tie_word_embeddings="output.weight" not in tensor_names,
            max_position_embeddings=_int(_get(meta, p + "context_length", 2048), p + "context_length", source),
            bos_token_id=_first(meta.get("tokenizer.ggml.bos_token_id"), "tokenizer.ggml.bos_token_id", source),
            eos_token_id=_first(meta.get("tokenizer.ggml.eos_token_id"), "tokenizer.ggml.eos_token_id", source),
        )

    def inv_freq(self) -> np.ndarray:
        """RoPE inverse frequencies ``[head_dim // 2]`` (float64), with Llama-3 scaling or GGUF's factors applied."""
        inv = default_inv_freq(self.rope_theta, self.head_dim)
        if self.rope_freq_factors is not None:
            return inv / np.asarray(self.rope_freq_factors, np.float64)
        params = self.llama3_scaling()
        return inv if params is None else scaled_inv_freq(inv, params)

    def llama3_scaling(self) -> Llama3RopeScalingParams | None:
        """``rope_scaling`` of type ``llama3`` as the `maxfx.nn` parameter record (None without one)."""
        s = dict(self.rope_scaling or ())
        if s.get("rope_type", s.get("type")) != "llama3":
            return None
        return Llama3RopeScalingParams(
            float(s["factor"]),
            float(s["low_freq_factor"]),
            float(s["high_freq_factor"]),
            int(s["original_max_position_embeddings"]),
        )

    def replace(self, **changes: Any) -> LlamaConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class GPT2Config:
    """Hyperparameters of GPT-2 (learned positions, LayerNorm, GELU (tanh), tied embeddings).

    Example:
        >>> GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4).head_dim
        16
    """

    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    n_positions: int = 1024
    n_inner: int | None = None
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    architecture = "gpt2"

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"):
            _positive_int(getattr(self, key), key, "GPT2Config")
        if self.n_embd % self.n_head:
            raise ConfigError(f"GPT2Config: n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.activation_function not in _GPT2_ACTIVATIONS:
            raise ConfigError(
                f"GPT2Config: activation_function {self.activation_function!r} is not supported (supported: "
                f"{sorted(_GPT2_ACTIVATIONS)})"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def inner_dim(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @property
    def max_position_embeddings(self) -> int:
        return self.n_positions

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], source: str = "config.json") -> GPT2Config:
        """From a Hugging Face GPT-2 ``config.json`` dict."""
        positions_key = "n_positions" if "n_positions" in cfg else "max_position_embeddings"
        positions = _get(cfg, positions_key, 1024)
        try:
            return cls(
                vocab_size=_need(cfg, "vocab_size", source),
                n_embd=_need(cfg, "n_embd", source, "hidden_size"),
                n_layer=_need(cfg, "n_layer", source, "num_hidden_layers"),
                n_head=_need(cfg, "n_head", source, "num_attention_heads"),
                n_positions=_int(positions, positions_key, source),
                n_inner=None if cfg.get("n_inner") is None else _int(cfg["n_inner"], "n_inner", source),
                layer_norm_epsilon=_float(_get(cfg, "layer_norm_epsilon", 1e-5), "layer_norm_epsilon", source),
                activation_function=cfg.get("activation_function", "gelu_new"),
                bos_token_id=_first(cfg.get("bos_token_id"), "bos_token_id", source),
                eos_token_id=_first(cfg.get("eos_token_id"), "eos_token_id", source),
            )
        except ConfigError as e:
            raise ConfigError(str(e).replace("GPT2Config", source, 1)) from None


# HF's activation names -> maxfx gelu's `approximate` mode.
_GPT2_ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


# HF's gated-MLP activation names -> maxfx.nn's activation names (`maxfx.nn.activation`).
MLP_ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu": "gelu",
}


def gpt2_gelu_mode(cfg: GPT2Config) -> str:
    return _GPT2_ACTIVATIONS[cfg.activation_function]


def _first(value: Any, key: str, source: str) -> int | None:
    """A token id, or the first of a list of them (``eos_token_id: [1, 2]``); None when absent."""
    if isinstance(value, (list, tuple)):
        return _int(value[0], key, source) if value else None
    return None if value is None else _int(value, key, source)
