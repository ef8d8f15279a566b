"""Audio / text-to-speech: request, metadata, output and step inputs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from ._pipeline import PipelineInputs
from ._request import Request, RequestID
from ._sampling import SamplingParams
from ._status import GenerationStatus

__all__ = [
    "AudioGenerationContextType",
    "AudioGenerationInputs",
    "AudioGenerationMetadata",
    "AudioGenerationOutput",
    "AudioGenerationRequest",
]

_MAX_INPUT_CHARS = 4096


@dataclass(frozen=True)
class AudioGenerationRequest(Request):
    """A text-to-speech request: text ``input`` (or a ready ``prompt``) plus an optional voice prompt.

    Example::

        >>> r = AudioGenerationRequest(request_id=RequestID("a1"), model="tts", input="Hello there")
        >>> r.streaming, r.audio_prompt_tokens, r.audio_prompt_transcription
        (True, [], '')
    """

    model: str
    """Served model name."""
    input: str | None = None
    """Text to speak (at most 4096 characters)."""
    audio_prompt_tokens: list[int] = field(default_factory=list)
    """Speech tokens of a voice prompt (voice cloning)."""
    audio_prompt_transcription: str = ""
    """Transcription of the voice prompt."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    """Sampling settings."""
    _assistant_message_override: str | None = None
    """Replaces the assistant turn when the prompt is built from messages."""
    prompt: list[int] | str | None = None
    """Token ids or text passed to the model as is (skips prompt building)."""
    streaming: bool = True
    """Stream audio chunks as they are produced."""
    buffer_speech_tokens: npt.NDArray[np.integer[Any]] | None = None
    """Last speech tokens of a previous request, to prime the audio decoder."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.input is None and self.prompt is None:
            raise ValueError("AudioGenerationRequest needs input (text) or prompt")
        if self.input is not None and len(self.input) > _MAX_INPUT_CHARS:
            raise ValueError(
                f"AudioGenerationRequest.input has {len(self.input)} characters, more than {_MAX_INPUT_CHARS}"
            )


@dataclass(kw_only=True)
class AudioGenerationMetadata:
    """Typed metadata of an audio chunk; every field is optional.

    Example::

        >>> AudioGenerationMetadata(sample_rate=24000, chunk_id=0, final_chunk=False).to_dict()
        {'sample_rate': 24000, 'chunk_id': 0, 'final_chunk': False}
    """

    sample_rate: int | None = None
    """Sample rate in Hz."""
    duration: float | None = None
    """Chunk duration in seconds."""
    chunk_id: int | None = None
    """Index of the chunk in the stream."""
    timestamp: str | None = None
    """When the chunk was produced."""
    final_chunk: bool | None = None
    """Whether this is the last chunk."""
    model_name: str | None = None
    """Model that produced it."""
    request_id: RequestID | None = None
    """Owning request."""
    tokens_generated: int | None = None
    """Speech tokens produced."""
    processing_time: float | None = None
    """Seconds spent producing it."""
    echo: str | None = None
    """Echo of the input, for verification."""

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, as a plain dict."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def _empty_audio() -> npt.NDArray[np.float32]:
    return np.zeros(0, dtype=np.float32)


@dataclass
class AudioGenerationOutput:
    """Result of an audio-generation step: float32 samples, status, leftover speech tokens.

    Example::

        >>> out = AudioGenerationOutput(GenerationStatus.ACTIVE, steps_executed=3)
        >>> out.is_done, out.audio_data.dtype, out.audio_data.shape
        (False, dtype('float32'), (0,))
    """

    final_status: GenerationStatus
    """Status after this step."""
    steps_executed: int
    """Steps run so far."""
    audio_data: npt.NDArray[np.float32] = field(default_factory=_empty_audio)
    """Generated samples."""
    buffer_speech_tokens: npt.NDArray[np.integer[Any]] | None = None
    """Trailing speech tokens to carry into a follow-up request."""
    metadata: AudioGenerationMetadata = field(default_factory=AudioGenerationMetadata)
    """Chunk metadata."""

    def __post_init__(self) -> None:
        self.final_status = GenerationStatus(self.final_status)
        self.audio_data = np.asarray(self.audio_data, dtype=np.float32)

    @property
    def is_done(self) -> bool:
        """Whether generation finished."""
        return self.final_status.is_done

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AudioGenerationOutput):
            return NotImplemented
        same_buffer = (self.buffer_speech_tokens is None and other.buffer_speech_tokens is None) or (
            self.buffer_speech_tokens is not None
            and other.buffer_speech_tokens is not None
            and np.array_equal(self.buffer_speech_tokens, other.buffer_speech_tokens)
        )
        return (
            self.final_status == other.final_status
            and self.steps_executed == other.steps_executed
            and np.array_equal(self.audio_data, other.audio_data)
            and same_buffer
            and self.metadata == other.metadata
        )


AudioGenerationContextType = TypeVar("AudioGenerationContextType")
"""Type variable for audio-generation context types."""


@dataclass
class AudioGenerationInputs(PipelineInputs, Generic[AudioGenerationContextType]):  # noqa: UP046 - typing.get_type_hints (msgpack decoding) must resolve the type variables on 3.12
    """One audio-generation step: ``{RequestID: context}``.

    Example::

        >>> AudioGenerationInputs(batch={RequestID("a"): "ctx"}).batch
        {RequestID('a'): 'ctx'}
    """

    batch: dict[RequestID, AudioGenerationContextType]
    """The contexts of this step."""

    def __post_init__(self) -> None:
        if not isinstance(self.batch, dict):
            raise TypeError(
                f"AudioGenerationInputs.batch must be a dict {{RequestID: context}}, got {type(self.batch).__name__}"
            )
