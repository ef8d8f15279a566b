"""MAX's ready-made context validators for vision models (``SupportedArchitecture.context_validators``).

Each takes a new context and raises `InputError` when a vision model cannot run
it; a text-only `TextContext` passes every check except
`validate_requires_vision_context`.

Example:
    >>> import numpy as np
    >>> from maxfx.generation import TextContext
    >>> validate_only_one_image(TextContext(max_length=8, tokens=np.array([1, 2])))  # text contexts pass
    >>> validate_requires_vision_context(TextContext(max_length=8, tokens=np.array([1, 2])))
    Traceback (most recent call last):
    ...
    maxfx.pipelines.core._validators.InputError: This model requires a TextAndVisionContext, got TextContext
"""

from __future__ import annotations

from typing import Any

from maxfx.pipelines.core._contexts import TextAndVisionContext

__all__ = [
    "InputError",
    "validate_aspect_ratio_args",
    "validate_image_grid_thw_args",
    "validate_image_shape_5d",
    "validate_initial_prompt_has_image",
    "validate_only_one_image",
    "validate_requires_vision_context",
    "validate_vision_position_ids",
]


class InputError(ValueError):
    """A request a model cannot serve (raised by context validators when a context is created)."""


def validate_requires_vision_context(context: Any) -> None:
    """The context must be a `TextAndVisionContext`."""
    if not isinstance(context, TextAndVisionContext):
        raise InputError(f"This model requires a TextAndVisionContext, got {type(context).__name__}")


def validate_only_one_image(context: Any) -> None:
    """At most one image per request."""
    if isinstance(context, TextAndVisionContext) and len(context.images) > 1:
        raise InputError(f"This model supports only one image per request, got {len(context.images)}")


def validate_initial_prompt_has_image(context: Any) -> None:
    """A first prompt (nothing generated yet) must carry an image."""
    if isinstance(context, TextAndVisionContext) and context.is_initial_prompt and not context.images:
        raise InputError("This model requires a prompt with an image; use a text-only model for prompts without one")


def validate_aspect_ratio_args(context: Any) -> None:
    """With images, ``extra_model_args`` must hold ``aspect_ratio_ids`` and ``aspect_ratio_mask``."""
    if isinstance(context, TextAndVisionContext) and context.images:
        for key in ("aspect_ratio_ids", "aspect_ratio_mask"):
            if key not in context.extra_model_args:
                raise InputError(f"{key} is required in extra_model_args for this model's image inputs")


def validate_image_shape_5d(context: Any) -> None:
    """Every image's ``pixel_values`` must be 5-dimensional."""
    if isinstance(context, TextAndVisionContext):
        for img in context.images:
            if len(img.pixel_values.shape) != 5:
                raise InputError(
                    f"Invalid image shape: expected 5 dimensions, got {len(img.pixel_values.shape)} "
                    f"({list(img.pixel_values.shape)})"
                )


def validate_image_grid_thw_args(context: Any) -> None:
    """While images await encoding, ``extra_model_args`` must hold ``image_grid_thw``."""
    if (
        isinstance(context, TextAndVisionContext)
        and context.needs_vision_encoding
        and "image_grid_thw" not in context.extra_model_args
    ):
        raise InputError("image_grid_thw is required in extra_model_args while images await vision encoding")


def validate_vision_position_ids(context: Any) -> None:
    """While images await encoding, ``extra_model_args`` must hold ``vision_position_ids``."""
    if (
        isinstance(context, TextAndVisionContext)
        and context.needs_vision_encoding
        and "vision_position_ids" not in context.extra_model_args
    ):
        raise InputError("vision_position_ids is required in extra_model_args while images await vision encoding")
