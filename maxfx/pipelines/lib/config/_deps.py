"""maxfx modules the configs use that load JAX, imported on first use.

``maxfx.driver``, ``maxfx.engine``, ``maxfx.graph`` and ``maxfx.nn.kv_cache`` import JAX (seconds);
the configs only need them once one is built or resolved, so importing
``maxfx.pipelines.lib.config`` stays cheap (as ``maxfx.__init__`` and the CLI
load their submodules).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["driver", "dtype", "gpu_profiling_mode", "kv_cache_strategy", "sampling_defaults_class", "weights_format"]


def driver() -> Any:
    """``maxfx.driver`` (DeviceSpec, scan_available_devices, devices_exist)."""
    return importlib.import_module("maxfx.driver")


def dtype() -> Any:
    """``maxfx.dtype.DType``."""
    return importlib.import_module("maxfx.dtype").DType


def gpu_profiling_mode() -> Any:
    """``maxfx.engine.GPUProfilingMode``."""
    return importlib.import_module("maxfx.engine").GPUProfilingMode


def kv_cache_strategy() -> Any:
    """``maxfx.nn.kv_cache.KVCacheStrategy``."""
    return importlib.import_module("maxfx.nn.kv_cache").KVCacheStrategy


def sampling_defaults_class() -> Any:
    """``maxfx.interfaces.SamplingParamsGenerationConfigDefaults``."""
    return importlib.import_module("maxfx.interfaces").SamplingParamsGenerationConfigDefaults


def weights_format() -> Any:
    """``maxfx.graph.weights.WeightsFormat``."""
    return importlib.import_module("maxfx.graph.weights").WeightsFormat
