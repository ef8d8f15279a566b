"""The pipeline task enum."""

from __future__ import annotations

from enum import Enum

from ._audio import AudioGenerationOutput
from ._embeddings import EmbeddingsGenerationOutput
from ._text_generation import TextGenerationOutput

__all__ = ["PipelineTask"]


class PipelineTask(str, Enum):
    """Which kind of pipeline serves a model.

    Example::

        >>> PipelineTask("embeddings_generation").output_type.__name__
        'EmbeddingsGenerationOutput'
    """

    TEXT_GENERATION = "text_generation"
    """Generate text (completions, chat)."""
    EMBEDDINGS_GENERATION = "embeddings_generation"
    """Compute embeddings."""
    AUDIO_GENERATION = "audio_generation"
    """Generate audio (TTS)."""
    SPEECH_TOKEN_GENERATION = "speech_token_generation"
    """Generate speech tokens (the first stage of a TTS model)."""

    @property
    def output_type(self) -> type:
        """The per-request output class a pipeline of this task returns."""
        return {
            PipelineTask.TEXT_GENERATION: TextGenerationOutput,
            PipelineTask.EMBEDDINGS_GENERATION: EmbeddingsGenerationOutput,
            PipelineTask.AUDIO_GENERATION: AudioGenerationOutput,
            PipelineTask.SPEECH_TOKEN_GENERATION: TextGenerationOutput,
        }[self]
