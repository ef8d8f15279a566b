"""A byte-counting progress bar for reading large checkpoints.

Small reads stay silent: the bar appears only when the bytes to read reach
`PROGRESS_MIN_BYTES` (256 MiB, or the ``MAXFX_PROGRESS_MIN_BYTES`` environment
variable) and stderr is a terminal (tqdm's ``disable=None``).
"""

from __future__ import annotations

import os

from tqdm.auto import tqdm

__all__ = ["PROGRESS_MIN_BYTES", "progress_bar"]

PROGRESS_MIN_BYTES = 256 * 2**20


def _threshold() -> int:
    value = os.environ.get("MAXFX_PROGRESS_MIN_BYTES")
    if value is None:
        return PROGRESS_MIN_BYTES
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"MAXFX_PROGRESS_MIN_BYTES must be an integer number of bytes, got {value!r}") from None


def progress_bar(total_bytes: int, desc: str) -> tqdm:
    """A tqdm bar over ``total_bytes`` (disabled below the threshold or off a tty)."""
    return tqdm(
        total=total_bytes,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        leave=False,
        disable=None if total_bytes >= _threshold() else True,
    )
