"""``max._core.safetensors``: open one safetensors file and read its tensors.

MAX's low-level reader (``safe_open``), here on top of the same strict parser
`maxfx.graph.weights.SafetensorWeights` uses: the header is validated when the
file opens, tensors are read from a copy-on-write memory map on request.

Example:
    >>> from maxfx._core.safetensors import safe_open
    >>> with safe_open("model.safetensors") as f:  # doctest: +SKIP
    ...     names = f.keys()
    ...     embed = f.get_tensor("model.embed_tokens.weight")  # a driver.Tensor
    ...     info = f.metadata()  # the header's __metadata__, {} when absent
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

from maxfx.driver import CPU, Device
from maxfx.driver import Tensor as DriverTensor
from maxfx.graph.weights._safetensors import SafetensorsFile

__all__ = ["SafeTensor", "safe_open"]


class SafeTensor:
    """A parsed safetensors file; tensors come back as ``driver.Tensor`` on the file's device."""

    def __init__(self, file: SafetensorsFile, device: Device):
        self._file = file
        self._device = device

    def keys(self) -> list[str]:
        """The tensor names, in the header's order."""
        return list(self._file.entries)

    def metadata(self) -> dict[str, str]:
        """The header's ``__metadata__`` strings (``{}`` when the file has none)."""
        return dict(self._file.metadata)

    def get_tensor(self, name: str) -> DriverTensor:
        """Tensor ``name`` as a ``driver.Tensor``.

        Raises:
            KeyError: ``name`` is not in the file (the message lists a few names that are).
        """
        if name not in self._file.entries:
            known = ", ".join(repr(k) for k in list(self._file.entries)[:5])
            raise KeyError(
                f"safe_open: {name!r} is not a tensor of {self._file.path} (it has {len(self._file.entries)}: "
                f"{known}{', ...' if len(self._file.entries) > 5 else ''})"
            )
        tensor = DriverTensor.from_numpy(self._file.read(name))
        return tensor if self._device.is_host else tensor.to(self._device)

    def __enter__(self) -> SafeTensor:
        return self

    def __exit__(self, exc_type: Any = None, exc_value: Any = None, traceback: TracebackType | None = None) -> None:
        return None


def safe_open(filepath: str | os.PathLike[str], device: Device | None = None) -> SafeTensor:
    """Open and validate the safetensors file ``filepath``; its tensors load onto ``device`` (default: the CPU).

    Raises:
        ValueError: the file is missing, truncated or not a well-formed safetensors file.
    """
    return SafeTensor(SafetensorsFile(filepath), CPU() if device is None else device)
