"""Checkpoint format detection (`weights_format`) and loading by extension (`load_weights`).

Example:
    >>> from pathlib import Path
    >>> weights_format([Path("model-00001.safetensors"), Path("model-00002.safetensors")])
    <WeightsFormat.safetensors: 'safetensors'>
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable
from pathlib import Path

from maxfx.graph.weights._gguf import GGUFWeights
from maxfx.graph.weights._protocol import Weights
from maxfx.graph.weights._pytorch import PytorchWeights, open_pytorch_checkpoints
from maxfx.graph.weights._safetensors import SafetensorWeights

__all__ = ["WeightsFormat", "load_weights", "weights_format"]


class WeightsFormat(str, enum.Enum):
    """Supported checkpoint file formats."""

    gguf = "gguf"
    """llama.cpp's GGUF (``.gguf``): quantized LLM weights plus metadata."""

    pytorch = "pytorch"
    """``torch.save`` zip checkpoints (``.bin``, ``.pt``, ``.pth``), read with a restricted unpickler."""

    safetensors = "safetensors"
    """Hugging Face safetensors (``.safetensors``): memory-mapped, possibly sharded."""

    def __str__(self) -> str:
        return f"WeightsFormat.{self.name}"


_EXTENSIONS = {
    ".safetensors": WeightsFormat.safetensors,
    ".bin": WeightsFormat.pytorch,
    ".pt": WeightsFormat.pytorch,
    ".pth": WeightsFormat.pytorch,
    ".gguf": WeightsFormat.gguf,
}


def _as_paths(paths: Iterable[os.PathLike[str] | str] | os.PathLike[str] | str) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(p) for p in paths]


def weights_format(weight_paths: Iterable[os.PathLike[str] | str]) -> WeightsFormat:
    """The format of ``weight_paths``, from their extensions (all files must agree).

    Raises:
        ValueError: no paths, an unknown extension, or files of different formats.
    """
    paths = _as_paths(weight_paths)
    if not paths:
        raise ValueError("weights_format: no weight files given")
    found: dict[WeightsFormat, Path] = {}
    for p in paths:
        fmt = _EXTENSIONS.get(p.suffix.lower())
        if fmt is None:
            known = ", ".join(_EXTENSIONS)
            raise ValueError(f"weights_format: {str(p)!r} has an unknown extension {p.suffix!r}; supported: {known}")
        found.setdefault(fmt, p)
    if len(found) > 1:
        listing = ", ".join(f"{fmt.value} ({str(p)!r})" for fmt, p in found.items())
        raise ValueError(f"weights_format: files mix formats: {listing}; pass files of one format")
    return next(iter(found))


def load_weights(paths: Iterable[os.PathLike[str] | str]) -> Weights:
    """Open a checkpoint, choosing the loader by extension.

    ``.safetensors`` -> `SafetensorWeights` (all shards), ``.bin``/``.pt``/``.pth``
    -> `PytorchWeights` (several shards are merged), ``.gguf`` -> `GGUFWeights`
    (one file).

    Raises:
        ValueError: as `weights_format`, or a file is missing or corrupt.
    """
    files = _as_paths(paths)
    fmt = weights_format(files)
    if fmt is WeightsFormat.safetensors:
        return SafetensorWeights(files)
    if fmt is WeightsFormat.pytorch:
        return PytorchWeights(files[0]) if len(files) == 1 else open_pytorch_checkpoints(files)
    if len(files) != 1:
        raise ValueError(
            f"load_weights: GGUF checkpoints are single files, got {len(files)}: {[str(f) for f in files]}"
        )
    return GGUFWeights(files[0])
