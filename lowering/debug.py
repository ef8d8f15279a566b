"""MAX's debugging options (``DebugConfig``): NaN checks, op logging, device sync, source locations.

One process-wide `DebugConfig` (`DEBUG`), which ``InferenceSession.debug`` and
``Graph.debug`` both are. Options come from the ``MODULAR_DEBUG`` environment
variable (comma-separated kebab-case names, ``name=value`` for values) and
from Python (underscored names), which takes precedence; `DebugConfig.reset`
drops what Python set. They take effect where MAX's do:

- ``source_tracebacks`` at graph build: each node records the user's source
  line that created it, and the NaN check names it;
- ``nan_check`` and ``op_log_level`` when a graph is compiled: the model then
  runs node by node (`DebugInterpreter`) instead of as one XLA program, checks
  every floating-point result for NaN/Inf (``FloatingPointError`` naming the
  op) and logs ``[OP] LAUNCH``/``[OP] COMPLETE`` lines to stderr at ``trace``
  or ``debug``;
- ``device_sync_mode`` when a model runs: each execution (and each node, in
  debug runs) waits for the device, so a failure surfaces at its own call.

Example:
    >>> cfg = DebugConfig(env="nan-check,op-log-level=debug")
    >>> cfg.nan_check, cfg.op_log_level, cfg.device_sync_mode
    (True, 'debug', False)
    >>> cfg.nan_check = False
    >>> cfg.reset(); cfg.nan_check
    True
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from lowering.interpret import Interpreter
from lowering.ir import Node

__all__ = ["DebugConfig", "DEBUG", "DebugInterpreter", "source_location"]

_LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical")
_FLAGS = ("nan_check", "device_sync_mode", "source_tracebacks")
_DEFAULTS: dict[str, Any] = {"nan_check": False, "device_sync_mode": False, "source_tracebacks": False, "op_log_level": None}


def _check(name: str, value: Any) -> Any:
    if name in _FLAGS:
        if not isinstance(value, bool):
            raise TypeError(f"DebugConfig.{name} must be a bool, got {type(value).__name__} {value!r}")
        return value
    if value is not None and (not isinstance(value, str) or value.lower() not in _LOG_LEVELS):
        raise ValueError(f"DebugConfig.op_log_level must be None or one of {', '.join(_LOG_LEVELS)}, got {value!r}")
    return value.lower() if value is not None else None


def _parse_env(text: str) -> dict[str, Any]:
    """``MODULAR_DEBUG``'s options that maxfx implements; the others are named in one warning."""
    options: dict[str, Any] = {}
    unknown = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        name = key.strip().replace("-", "_")
        if name in _FLAGS and not value:
            options[name] = True
        elif name == "op_log_level" and value:
            options[name] = _check(name, value.strip())
        else:
            unknown.append(item)
    if unknown:
        warnings.warn(
            f"MODULAR_DEBUG: maxfx implements nan-check, device-sync-mode, source-tracebacks and op-log-level=LEVEL; ignoring {', '.join(unknown)}",
            stacklevel=3,
        )
    return options


class DebugConfig:
    """Process-wide debugging options (MAX's ``max.engine.DebugConfig``); see the module docstring.

    Set them on the class attribute before the stage that reads them:
    ``Graph.debug.source_tracebacks = True`` before building a graph,
    ``InferenceSession.debug.nan_check = True`` before ``compile``/``load``,
    ``InferenceSession.debug.device_sync_mode = True`` before ``execute``.

    Args:
        env: the ``MODULAR_DEBUG`` text (default: the environment variable).
    """

    def __init__(self, env: str | None = None):
        object.__setattr__(self, "_env", _parse_env(os.environ.get("MODULAR_DEBUG", "") if env is None else env))
        object.__setattr__(self, "_set", {})

    def __getattr__(self, name: str) -> Any:
        if name in _DEFAULTS:
            return self._set.get(name, self._env.get(name, _DEFAULTS[name]))
        raise AttributeError(f"DebugConfig has no option {name!r}; maxfx implements {', '.join(_DEFAULTS)}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _DEFAULTS:
            raise AttributeError(f"DebugConfig has no option {name!r}; maxfx implements {', '.join(_DEFAULTS)}")
        self._set[name] = _check(name, value)

    def reset(self) -> None:
        """Forget every option set from Python; ``MODULAR_DEBUG``'s stay in effect."""
        self._set.clear()

    def compile_options(self) -> tuple[bool, bool]:
        """(nan_check, log ops) as a graph is compiled now: ops are logged at ``op_log_level`` ``trace`` or ``debug``."""
        return self.nan_check, self.op_log_level in ("trace", "debug")

    def __repr__(self) -> str:
        return "DebugConfig(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in _DEFAULTS) + ")"


DEBUG = DebugConfig()
"""The process's options: ``InferenceSession.debug`` and ``Graph.debug``."""

_INTERNAL = tuple(str(Path(p).resolve()) for p in (Path(__file__).parent, Path(__file__).parent.parent / "maxfx", Path(__file__).parent.parent / "custom_calls"))


@functools.cache
def _is_internal(filename: str) -> bool:
    """A frame of maxfx itself, JAX or contextlib (resolved once per file: graphs record a location per node)."""
    path = str(Path(filename).resolve())
    return path.startswith(_INTERNAL) or f"{os.sep}jax{os.sep}" in path or path.endswith(f"{os.sep}contextlib.py")


def source_location() -> str | None:
    """``file:line`` of the innermost caller outside maxfx (and outside JAX and the standard library's contextlib)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _is_internal(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


_op_ids = itertools.count(1)


class DebugInterpreter(Interpreter):
    """The interpreter of debug runs: logs, NaN-checks and syncs around every node.

    Args:
        weights: as for `Interpreter`.
        nan_check: raise ``FloatingPointError`` when a node's floating-point
            result holds NaN or Inf.
        log_ops: write ``[OP] LAUNCH``/``[OP] COMPLETE`` lines to stderr (see `DebugConfig.compile_options`).
        sync: wait for each node's results before the next node.
    """

    def __init__(self, weights: Mapping[str, Any] | None = None, *, nan_check: bool, log_ops: bool, sync: bool):
        super().__init__(weights)
        self.nan_check, self.log, self.sync = nan_check, log_ops, sync

    def run_node(self, node: Node, env: dict[int, Any]) -> None:
        op_id = next(_op_ids)
        target = str(node.outputs[0].type.device) if node.outputs and hasattr(node.outputs[0].type, "device") else "cpu:0"
        if self.log:
            print(f"[OP] LAUNCH {node.op} [id={op_id}] target={target}", file=sys.stderr, flush=True)
        super().run_node(node, env)
        results = [env[v.id] for v in node.outputs if v.id in env]
        if self.sync:
            jax.block_until_ready(results)
        if self.log:
            print(f"[OP] COMPLETE {node.op} [id={op_id}] target={target}", file=sys.stderr, flush=True)
        if self.nan_check:
            _check_finite(node, results)


def _check_finite(node: Node, results: list[Any]) -> None:
    for i, value in enumerate(results):
        dtype = np.dtype(getattr(value, "dtype", np.float32))
        if dtype.kind not in "fc" or isinstance(value, jax.core.Tracer):
            continue
        arr = np.asarray(value)
        nans, infs = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
        if nans or infs:
            where = f", created at {node.location}" if getattr(node, "location", None) else " (set Graph.debug.source_tracebacks = True before building the graph to see where it was created)"
            raise FloatingPointError(f"nan_check: op {node.op!r} output {i} ({value.shape} {dtype}) holds {nans} NaN and {infs} Inf values{where}")
