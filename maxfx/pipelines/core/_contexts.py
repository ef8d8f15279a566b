"""`TextAndVisionContext` and `TTSContext`: MAX's vision and text-to-speech request contexts.

Both extend the engine's `maxfx.generation.TextContext` with MAX's extra fields.
maxfx serves no vision or audio model, so nothing in maxfx creates them; they are
the data classes MAX's vision/TTS pipelines use, with MAX's bookkeeping.

Example:
    >>> import numpy as np
    >>> from maxfx.interfaces import ImageMetadata
    >>> tokens = np.array([5, 9, 9, 9, 6])  # 9: the image placeholder token
    >>> ctx = TextAndVisionContext(max_length=16, tokens=tokens, vision_token_ids=[9],
    ...                            images=[ImageMetadata(start_idx=1, end_idx=4, pixel_values=np.zeros((3, 2, 2),
    ...     np.float32))])
    >>> ctx.needs_vision_encoding, ctx.image_idx, ctx.compute_image_aligned_idx(2)
    (True, 0, 1)
    >>> tts = TTSContext(max_length=16, tokens=np.array([1, 2]))
    >>> tts.update_speech_tokens(np.array([7, 8, 9])); tts.speech_tokens.tolist(), tts.block_counter
    ([7, 8, 9], 1)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from maxfx.generation import TextContext
from maxfx.interfaces import GenerationStatus, ImageMetadata, LogProbabilities

__all__ = ["SPEECH_TOKEN_audio_chunk_size", "TTSContext", "TextAndVisionContext"]

SPEECH_TOKEN_audio_chunk_size = 128  # noqa: N816 - MAX's name
"""Granularity (in tokens) of a `TTSContext`'s speech-token buffer."""


class TextAndVisionContext(TextContext):
    """A `TextContext` whose prompt holds images (MAX's vision-language context).

    Each image is an `~maxfx.interfaces.ImageMetadata` covering a span of
    placeholder tokens ``[start_idx, end_idx)`` of the prompt; ``vision_token_ids``
    are the placeholder ids. Images must be sorted, must not overlap, must end
    inside the prompt and start and end on a placeholder token. As in MAX, the
    cursors may never cut an image in two, and the active end must equal the end of
    the tokens (no chunked prefill for vision models).

    Args:
        vision_token_ids: the image placeholder token id(s).
        images: the prompt's images, in order.
        extra_model_args: model-specific arrays for the vision encoder (e.g. ``image_grid_thw``).
        **kwargs: `TextContext`'s arguments (``max_length``, ``tokens``, ``request_id``, ...).

    Raises:
        ValueError: unsorted, overlapping or out-of-range images, or an image whose
            first or last token is not a vision token.
    """

    def __init__(
        self,
        *,
        vision_token_ids: Iterable[int],
        images: Iterable[ImageMetadata] | None = None,
        extra_model_args: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.vision_token_ids: list[int] = [int(t) for t in vision_token_ids]
        """The image placeholder token id(s) (a list: Pixtral also has an image-break token)."""
        self.images: list[ImageMetadata] = list(images or [])
        """The prompt's images (`ImageMetadata`), in order."""
        self.extra_model_args: dict[str, Any] = dict(extra_model_args or {})
        """Model-specific arrays for the vision model."""
        for prev, nxt in zip(self.images[:-1], self.images[1:]):
            if nxt.start_idx < prev.start_idx:
                raise ValueError(
                    f"TextAndVisionContext: images must be sorted by position, got an image at {nxt.start_idx} after "
                    f"one at {prev.start_idx}"
                )
            if nxt.start_idx < prev.end_idx:
                raise ValueError(
                    f"TextAndVisionContext: images must not overlap, got [{prev.start_idx}, {prev.end_idx}) and "
                    f"[{nxt.start_idx}, {nxt.end_idx})"
                )
        for img in self.images:
            if img.end_idx > self.end_idx:
                raise ValueError(
                    f"TextAndVisionContext: an image ends at {img.end_idx}, past the {self.end_idx} tokens"
                )
            if (
                int(self.tokens[img.start_idx]) not in self.vision_token_ids
                or int(self.tokens[img.end_idx - 1]) not in self.vision_token_ids
            ):
                raise ValueError(
                    f"TextAndVisionContext: image [{img.start_idx}, {img.end_idx}) must be filled with vision tokens "
                    f"{self.vision_token_ids}"
                )
        self._validate_state()

    @property
    def image_idx(self) -> int:
        """Index of the first image not encoded yet (the first one ending after ``start_idx``)."""
        return next((i for i, img in enumerate(self.images) if self.start_idx < img.end_idx), len(self.images))

    @property
    def next_images(self) -> list[ImageMetadata]:
        """The images not encoded yet."""
        return self.images[self.image_idx :]

    @property
    def needs_vision_encoding(self) -> bool:
        """Whether an image still has to go through the vision encoder."""
        return self.image_idx < len(self.images)

    def compute_image_aligned_idx(self, idx: int) -> int:
        """``idx`` moved back to the start of the image it falls in (unchanged outside images)."""
        for img in self.images:
            if img.start_idx <= idx < img.end_idx:
                return img.start_idx
        return idx

    def _bisected_image(self, idx: int) -> ImageMetadata | None:
        return next((img for img in self.images if img.start_idx < idx < img.end_idx), None)

    def _validate_state(self) -> None:
        if (img := self._bisected_image(self.active_idx)) is not None:
            raise ValueError(
                f"TextAndVisionContext: active_idx {self.active_idx} would cut the image [{img.start_idx}, "
                f"{img.end_idx}) in two"
            )
        if self.active_idx != self.end_idx:
            raise ValueError(
                f"TextAndVisionContext: active_idx ({self.active_idx}) must equal end_idx ({self.end_idx}): vision "
                "models do not prefill in chunks"
            )

    def set_token_indices(
        self, start_idx: int | None = None, active_idx: int | None = None, end_idx: int | None = None
    ) -> None:
        """As `TextContext.set_token_indices`, refusing cursors that cut an image or chunk the prefill (the old ones
        stay).
        """
        saved = (self.start_idx, self.active_idx, self.end_idx)
        super().set_token_indices(start_idx, active_idx, end_idx)
        try:
            self._validate_state()
        except ValueError:
            super().set_token_indices(*saved)
            raise

    def bump_token_indices(self, start_idx: int = 0, active_idx: int = 0, end_idx: int = 0) -> None:
        """As `TextContext.bump_token_indices`, with the checks of `set_token_indices`."""
        self.set_token_indices(self.start_idx + start_idx, self.active_idx + active_idx, self.end_idx + end_idx)

    def update(self, new_token: int, log_probabilities: LogProbabilities | None = None) -> None:
        """As `TextContext.update` (the cursors stay valid: a new token always follows every image)."""
        self._validate_state()
        super().update(new_token, log_probabilities)
        self._validate_state()

    def __repr__(self) -> str:
        return (
            f"TextAndVisionContext(request_id={self.request_id!s}, start_idx={self.start_idx}, "
            f"active_idx={self.active_idx}, end_idx={self.end_idx}, images={len(self.images)})"
        )


class TTSContext(TextContext):
    """A `TextContext` for text-to-speech: the speech tokens generated so far and what was decoded to audio.

    Args:
        audio_prompt_tokens: speech tokens of a voice prompt (voice cloning).
        buffer_speech_tokens: speech tokens carried over to prime the audio decoder.
        audio_buffer: audio decoded so far (for silence detection).
        prev_samples_beyond_offset: audio samples past the last emitted offset (overlap bookkeeping).
        streaming: the client receives audio chunk by chunk.
        decoded_index: how many speech tokens were sent to the audio decoder.
        audio_generation_status: the audio side's `GenerationStatus` (`is_done` reads it).
        **kwargs: `TextContext`'s arguments.
    """

    def __init__(
        self,
        *,
        audio_prompt_tokens: Any = None,
        buffer_speech_tokens: Any = None,
        audio_buffer: Any = None,
        prev_samples_beyond_offset: int = 0,
        streaming: bool = False,
        decoded_index: int = 0,
        audio_generation_status: GenerationStatus = GenerationStatus.ACTIVE,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.audio_prompt_tokens: np.ndarray = np.asarray(
            [] if audio_prompt_tokens is None else audio_prompt_tokens, dtype=np.int32
        )
        """Speech tokens of the voice prompt."""
        self.buffer_speech_tokens: np.ndarray | None = (
            None if buffer_speech_tokens is None else np.asarray(buffer_speech_tokens)
        )
        """Speech tokens carried over to the audio decoder."""
        self.audio_buffer: np.ndarray | None = None if audio_buffer is None else np.asarray(audio_buffer)
        """Audio decoded so far."""
        self.prev_samples_beyond_offset: int = int(prev_samples_beyond_offset)
        """Audio samples past the last emitted offset."""
        self.streaming: bool = bool(streaming)
        """Whether audio is streamed to the client."""
        self.decoded_index: int = int(decoded_index)
        """Speech tokens already sent to the audio decoder."""
        self.audio_generation_status: GenerationStatus = GenerationStatus(audio_generation_status)
        """Status of the audio generation."""
        self._speech_tokens = np.zeros(SPEECH_TOKEN_audio_chunk_size, np.int32)
        self._speech_token_end_idx = 0
        self._block_counter = 0

    @property
    def is_done(self) -> bool:
        """Whether the audio generation finished (``audio_generation_status``), as MAX."""
        return self.audio_generation_status.is_done

    @property
    def speech_tokens(self) -> np.ndarray:
        """Every speech token generated so far."""
        return self._speech_tokens[: self._speech_token_end_idx]

    @property
    def block_counter(self) -> int:
        """How many blocks of speech tokens were added (`update_speech_tokens` calls)."""
        return self._block_counter

    def update_speech_tokens(self, new_tokens: Any) -> None:
        """Append a block of speech tokens (the buffer grows by `SPEECH_TOKEN_audio_chunk_size` steps)."""
        new = np.asarray(new_tokens).reshape(-1)
        need = self._speech_token_end_idx + len(new)
        if need >= len(self._speech_tokens):
            size = (
                len(self._speech_tokens)
                + math.ceil(len(new) / SPEECH_TOKEN_audio_chunk_size) * SPEECH_TOKEN_audio_chunk_size
            )
            self._speech_tokens = np.resize(self._speech_tokens, max(size, need + 1))
        self._speech_tokens[self._speech_token_end_idx : need] = new
        self._speech_token_end_idx = need
        self._block_counter += 1

    def next_speech_tokens(
        self, audio_chunk_size: int | None = None, buffer: int | None = None
    ) -> tuple[np.ndarray, int]:
        """The next speech tokens not yet decoded, and how many earlier tokens lead them.

        Args:
            audio_chunk_size: at most this many new tokens (default: all of them).
            buffer: also return up to this many already decoded tokens in front (context for the decoder).

        Returns:
            ``(tokens, n_buffered)``: ``tokens`` starts ``n_buffered`` tokens before
            ``decoded_index``. ``decoded_index`` is not moved: set it once the chunk is decoded.
        """
        start = self.decoded_index
        lead = 0
        if buffer is not None:
            lead = min(int(buffer), start)
            start -= lead
        end = self._speech_token_end_idx
        if audio_chunk_size is not None:
            end = min(end, self.decoded_index + int(audio_chunk_size))
        return self._speech_tokens[start:end], lead
