"""`AudioGenerationConfig`: a `PipelineConfig` for text-to-speech, with the audio decoder's settings.

Example:
    >>> config = AudioGenerationConfig.from_flags({"audio_decoder": "dac", "chunk_size": "10,20", "buffer": "4"},
    ...     model_path="tests/data/models/tiny_llama")
    >>> config.audio_decoder, config.chunk_size, config.buffer, config.prepend_prompt_speech_tokens.value
    ('dac', [10, 20], 4, 'once')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from maxfx.pipelines.lib.config._base import ConfigError, check_bool, check_int, check_str, coerce_enum, option
from maxfx.pipelines.lib.config._enums import PrependPromptSpeechTokens, PrometheusMetricsMode
from maxfx.pipelines.lib.config.pipeline_config import PipelineConfig

__all__ = ["AudioGenerationConfig"]

_OWNER = "AudioGenerationConfig"
_AUDIO_OPTIONS = (
    "audio_decoder",
    "audio_decoder_weights",
    "chunk_size",
    "buffer",
    "block_causal",
    "prepend_prompt_speech_tokens",
    "prepend_prompt_speech_tokens_causal",
    "audio_decoder_config",
    "prometheus_metrics_mode",
)


@dataclass(init=False)
class AudioGenerationConfig(PipelineConfig):
    """A `PipelineConfig` plus the audio decoder: its architecture and weights, streaming chunks and buffering.

    Args:
        audio_decoder: the decoder architecture's name (required).
        **kwargs: the other audio options below, and any `PipelineConfig` option.

    Raises:
        ConfigError: an empty ``audio_decoder``, a chunk size below 1, a negative ``buffer``...
    """

    audio_decoder: str = option("", doc="Architecture of the audio decoder (required).")
    audio_decoder_weights: str = option("", doc="Path of the audio decoder's weights ('').")
    chunk_size: list[int] | None = option(
        None, doc="Streaming chunk size(s) in speech tokens: one size, or one per chunk (None: one chunk)."
    )
    buffer: int = option(0, doc="Previous speech tokens passed to the decoder with each chunk (0).")
    block_causal: bool = option(False, doc="Buffered tokens attend to the current block (False).")
    prepend_prompt_speech_tokens: PrependPromptSpeechTokens = option(
        PrependPromptSpeechTokens.ONCE,
        doc="When the prompt's speech tokens go to the decoder: 'never', 'once' or 'rolling' ('once').",
    )
    prepend_prompt_speech_tokens_causal: bool = option(
        False, doc="Prepended prompt tokens attend to the current block (False)."
    )
    audio_decoder_config: dict[str, Any] = option(factory=dict, doc="Keyword arguments of the audio decoder ({}).")
    prometheus_metrics_mode: PrometheusMetricsMode = option(
        PrometheusMetricsMode.INSTRUMENT_ONLY,
        doc="How metrics are exported: 'instrument_only', 'launch_server' or 'launch_multiproc_server'.",
    )

    def __init__(self, audio_decoder: str, **kwargs: Any) -> None:
        super().__init__(audio_decoder=audio_decoder, **kwargs)

    def _validate_options(self) -> None:
        super()._validate_options()
        self.audio_decoder = check_str(_OWNER, "audio_decoder", self.audio_decoder)
        if not self.audio_decoder:
            raise ConfigError(f"{_OWNER}.audio_decoder must name the audio decoder architecture, got ''")
        self.audio_decoder_weights = check_str(_OWNER, "audio_decoder_weights", self.audio_decoder_weights)
        self.chunk_size = _chunk_sizes(self.chunk_size)
        self.buffer = check_int(_OWNER, "buffer", self.buffer, minimum=0)
        self.block_causal = check_bool(_OWNER, "block_causal", self.block_causal)
        self.prepend_prompt_speech_tokens_causal = check_bool(
            _OWNER, "prepend_prompt_speech_tokens_causal", self.prepend_prompt_speech_tokens_causal
        )
        self.prepend_prompt_speech_tokens = coerce_enum(
            _OWNER, "prepend_prompt_speech_tokens", self.prepend_prompt_speech_tokens, PrependPromptSpeechTokens
        )
        self.prometheus_metrics_mode = coerce_enum(
            _OWNER, "prometheus_metrics_mode", self.prometheus_metrics_mode, PrometheusMetricsMode
        )
        if not isinstance(self.audio_decoder_config, dict):
            raise ConfigError(
                f"{_OWNER}.audio_decoder_config must be a dict of decoder keyword arguments, got "
                f"{self.audio_decoder_config!r}"
            )

    @classmethod
    def from_flags(cls, audio_flags: dict[str, Any], **config_flags: Any) -> AudioGenerationConfig:
        """Build from CLI-style flags: ``audio_flags`` holds the audio options (strings allowed), ``config_flags`` the
        rest.

        Raises:
            ConfigError: an ``audio_flags`` key that is not an audio option, or a value `resolve` rejects.
        """
        flags = dict(audio_flags)
        unknown = sorted(set(flags) - set(_AUDIO_OPTIONS))
        if unknown:
            raise ConfigError(
                f"{_OWNER}.from_flags: audio_flags must only hold audio options ({', '.join(_AUDIO_OPTIONS)}), got "
                f"{unknown}"
            )
        if isinstance(flags.get("buffer"), str) and flags["buffer"].strip().isdigit():
            flags["buffer"] = int(flags["buffer"])
        if "audio_decoder" not in flags:
            raise ConfigError(
                f"{_OWNER}.audio_decoder must name the audio decoder architecture, got none in audio_flags"
            )
        return cls(**flags, **config_flags)


def _chunk_sizes(value: Any) -> list[int] | None:
    """``chunk_size`` as a list of ints >= 1: from an int, a list, or a string such as ``"10,20"``."""
    if value is None:
        return None
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not all(p.isdigit() for p in parts):
            raise ConfigError(f"{_OWNER}.chunk_size must be ints >= 1 (e.g. '10,20'), got {value!r}")
        value = [int(p) for p in parts]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"{_OWNER}.chunk_size must be an int or a non-empty list of ints >= 1, got {value!r}")
    return [check_int(_OWNER, "chunk_size", v, minimum=1) for v in value]
