"""``max.pipelines.core``: request contexts and their validators.

- `TextContext`: the engine's text context (`maxfx.generation.TextContext`, re-exported).
- `TextAndVisionContext`, `TTSContext`: MAX's vision and text-to-speech contexts
  (`TextContext` subclasses with MAX's extra fields; maxfx serves no vision or audio
  model, they are plain data classes).
- ``validate_*``: MAX's ready-made vision context validators, raising `InputError`.

Example:
    >>> import numpy as np
    >>> from maxfx.pipelines.core import TextContext
    >>> TextContext(max_length=8, tokens=np.array([1, 2, 3])).next_tokens.tolist()
    [1, 2, 3]
"""

from maxfx.generation import TextContext
from maxfx.pipelines.core._contexts import SPEECH_TOKEN_audio_chunk_size, TextAndVisionContext, TTSContext
from maxfx.pipelines.core._validators import (
    InputError,
    validate_aspect_ratio_args,
    validate_image_grid_thw_args,
    validate_image_shape_5d,
    validate_initial_prompt_has_image,
    validate_only_one_image,
    validate_requires_vision_context,
    validate_vision_position_ids,
)

__all__ = [
    "SPEECH_TOKEN_audio_chunk_size",
    "InputError",
    "TTSContext",
    "TextAndVisionContext",
    "TextContext",
    "validate_aspect_ratio_args",
    "validate_image_grid_thw_args",
    "validate_image_shape_5d",
    "validate_initial_prompt_has_image",
    "validate_only_one_image",
    "validate_requires_vision_context",
    "validate_vision_position_ids",
]
