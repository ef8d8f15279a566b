"""`ProfilingConfig`: GPU profiling detail (``--gpu-profiling off|on|detailed``).

Unless set, ``gpu_profiling`` follows ``MODULAR_ENABLE_PROFILING`` (read when the
config is built): ``1``/``on``/``true`` -> on, ``detailed`` -> detailed,
unset/``0``/``off`` -> off. The same variable turns `maxfx.profiler` spans on.

Example:
    >>> ProfilingConfig(gpu_profiling="detailed").gpu_profiling.value
    'detailed'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from maxfx.pipelines.lib.config import _deps
from maxfx.pipelines.lib.config._base import ConfigError, MAXConfig, coerce_enum, option

__all__ = ["ProfilingConfig", "profiling_mode_from_env"]

ENV_VAR = "MODULAR_ENABLE_PROFILING"
_ON = ("1", "on", "true", "yes")
_OFF = ("", "0", "off", "false", "no")


def profiling_mode_from_env() -> Any:
    """The `GPUProfilingMode` that ``MODULAR_ENABLE_PROFILING`` asks for (OFF when unset).

    Raises:
        ConfigError: the variable holds something else (the message names it).
    """
    mode = _deps.gpu_profiling_mode()
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if raw in _ON:
        return mode.ON
    if raw in _OFF:
        return mode.OFF
    if raw == "detailed":
        return mode.DETAILED
    raise ConfigError(f"{ENV_VAR} must be one of 1/on, 0/off or detailed, got {os.environ[ENV_VAR]!r}")


@dataclass
class ProfilingConfig(MAXConfig):
    """GPU profiling of the model (maxfx: recorded as ``jax.profiler`` traces by the engine)."""

    gpu_profiling: Any = option(
        factory=profiling_mode_from_env,
        doc="GPU profiling: 'off', 'on' or 'detailed' (default: from MODULAR_ENABLE_PROFILING, else 'off').",
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Convert ``gpu_profiling`` to a `GPUProfilingMode` (True/False mean on/off).

        Raises:
            ConfigError: not one of off/on/detailed.
        """
        mode = _deps.gpu_profiling_mode()
        value = self.gpu_profiling
        if isinstance(value, bool):
            value = mode.ON if value else mode.OFF
        self.gpu_profiling = coerce_enum("ProfilingConfig", "gpu_profiling", value, mode)
