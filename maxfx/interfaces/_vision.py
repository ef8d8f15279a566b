"""Vision-language: image spans inside a prompt and the VLM context protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ._context import context_state, register_state_types
from ._text_context import TextGenerationContext

__all__ = ["ImageMetadata", "VLMTextGenerationContext"]


@dataclass(kw_only=True)
class ImageMetadata:
    """One image of a prompt: its token span ``[start_idx, end_idx)``, pixels and a prefix-cache hash.

    Example::

        >>> import numpy as np
        >>> img = ImageMetadata(start_idx=3, end_idx=7, pixel_values=np.zeros((3, 2, 2), np.float32))
        >>> img.end_idx - img.start_idx, img.image_hash
        (4, -1)
    """

    start_idx: int
    """Index of the first image token."""
    end_idx: int
    """One past the last image token."""
    pixel_values: npt.NDArray[np.floating[Any]]
    """Preprocessed pixels."""
    image_hash: int = -1
    """Hash of the image for prefix-cache keys (-1 = none)."""

    def __post_init__(self) -> None:
        if not 0 <= self.start_idx < self.end_idx:
            raise ValueError(
                f"ImageMetadata needs 0 <= start_idx < end_idx, got start_idx={self.start_idx}, end_idx={self.end_idx}"
            )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ImageMetadata):
            return NotImplemented
        return (self.start_idx, self.end_idx, self.image_hash) == (
            other.start_idx,
            other.end_idx,
            other.image_hash,
        ) and np.array_equal(self.pixel_values, other.pixel_values)


@runtime_checkable
class VLMTextGenerationContext(TextGenerationContext, Protocol):
    """A text-generation context whose prompt holds images; encoding never splits an image.

    Defaults read ``_images`` (a list of :class:`ImageMetadata`, sorted by position)
    on top of the :class:`TextGenerationContext` state.

    Example::

        >>> import numpy as np
        >>> from maxfx.interfaces import init_text_generation_state
        >>> class Ctx(VLMTextGenerationContext):
        ...     def __init__(self):
        ...         init_text_generation_state(self, request_id="v", tokens=np.arange(10))
        ...         self._images = [ImageMetadata(start_idx=2, end_idx=6, pixel_values=np.zeros(1, np.float32))]
        >>> c = Ctx(); c.compute_image_aligned_idx(4), c.needs_vision_encoding, c.image_idx
        (2, True, 0)
    """

    @property
    def images(self) -> list[ImageMetadata]:
        """All images of the prompt, in order."""
        return context_state(self, "images")

    @property
    def image_idx(self) -> int:
        """Index of the first image not yet encoded (whose span ends after ``start_idx``)."""
        start = self.start_idx
        return sum(1 for img in self.images if img.end_idx <= start)

    @property
    def next_images(self) -> list[ImageMetadata]:
        """The images not yet encoded."""
        return self.images[self.image_idx :]

    @property
    def needs_vision_encoding(self) -> bool:
        """Whether an image still has to go through the vision encoder."""
        return len(self.next_images) > 0

    def compute_image_aligned_idx(self, idx: int) -> int:
        """``idx`` moved back to the start of the image it falls inside, else unchanged."""
        for img in self.images:
            if img.start_idx < idx < img.end_idx:
                return img.start_idx
        return idx


register_state_types(VLMTextGenerationContext, {"_images": list[ImageMetadata]})
