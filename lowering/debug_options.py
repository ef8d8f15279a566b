"""MAX's debugging options (``DebugConfig``), with MAX's names, values and ``sensible`` mode.

One process-wide `DebugConfig` (`DEBUG`), which ``InferenceSession.debug`` and
``Graph.debug`` both are. Options come from the ``MODULAR_DEBUG`` environment
variable (comma-separated kebab-case names; ``name=value`` for the ones that
are not flags; ``sensible`` turns on `DebugConfig.sensible_mode`) and from
Python (underscored names), which takes precedence; `DebugConfig.reset` drops
what Python set. Each takes effect where MAX reads it:

- ``source_tracebacks`` at graph build: each node records the user's source
  line that created it, and the NaN check names it;
- ``nan_check`` and ``op_log_level`` when a graph is compiled: the model then
  runs node by node (``lowering.debug.DebugInterpreter``) instead of as one
  XLA program, checks every floating-point result for NaN/Inf and logs
  ``[OP] LAUNCH``/``[OP] COMPLETE`` lines at ``trace`` or ``debug``;
- ``ir_output_dir`` when a graph is compiled: the StableHLO of each program
  XLA compiles is written there;
- ``device_sync_mode`` when a model runs: each execution (and each node, in
  debug runs) waits for the device, so a failure surfaces at its own call;
- ``stack_trace_on_crash`` when a model is compiled: Python's
  ``faulthandler`` prints every thread's stack on a fatal signal;
- ``print_style``: the debug-print style of sessions that did not pick one
  (``set_debug_print_options``).

``assert_level``, ``uninitialized_read_check`` and ``stack_trace_on_error``
configure MAX's Mojo kernels and C++ runtime; maxfx checks and keeps them but
has nothing they change (no Mojo asserts; XLA buffers are never read
uninitialized; errors are Python exceptions with their full traceback).

Example:
    >>> cfg = DebugConfig(env="nan-check,op-log-level=debug")
    >>> cfg.nan_check, cfg.op_log_level, cfg.device_sync_mode
    (True, 'debug', False)
    >>> cfg.nan_check = False
    >>> cfg.reset(); cfg.nan_check
    True
    >>> DebugConfig(env="sensible").assert_level
    'all'
"""

from __future__ import annotations

import enum
import os
import warnings
from typing import Any

__all__ = ["DebugConfig", "DEBUG", "GraphDebugConfig", "PrintStyle"]


class PrintStyle(enum.Enum):
    """How debug prints come out (MAX's ``max.engine.PrintStyle``, with its values)."""

    COMPACT = 0
    """``label = tensor([[...]], dtype=f32, shape=[n])``, long axes elided."""
    FULL = 1
    """``label = tensor<nxf32> [...]``: every element, ``precision`` digits."""
    BINARY = 2
    """The raw bytes to ``{output_directory}/{label}``."""
    NONE = 3
    """Nothing."""
    BINARY_MAX_CHECKPOINT = 4
    """``{output_directory}/{label}.max`` with dtype and shape (``lowering.debug_print.write_max_checkpoint``)."""


_FLAGS = (
    "nan_check",
    "uninitialized_read_check",
    "device_sync_mode",
    "stack_trace_on_error",
    "stack_trace_on_crash",
    "source_tracebacks",
    "sensible_mode",
)
_CHOICES = {
    "op_log_level": ("", "notset", "trace", "debug", "info", "warning", "error", "critical"),
    "assert_level": ("", "none", "warn", "safe", "all"),
}
_DEFAULTS: dict[str, Any] = {
    **dict.fromkeys(_FLAGS, False),
    "op_log_level": "",
    "assert_level": "",
    "print_style": PrintStyle.COMPACT,
    "ir_output_dir": "",
}
# What sensible_mode turns on unless set otherwise (MAX's curated set).
_SENSIBLE: dict[str, Any] = {
    "nan_check": True,
    "assert_level": "all",
    "device_sync_mode": True,
    "stack_trace_on_error": True,
    "stack_trace_on_crash": True,
    "source_tracebacks": True,
}


def _check(name: str, value: Any) -> Any:
    """``value`` as option ``name`` holds it; TypeError/ValueError for what MAX refuses."""
    if name in _FLAGS:
        if not isinstance(value, bool):
            raise TypeError(f"DebugConfig.{name} must be a bool, got {type(value).__name__} {value!r}")
        return value
    if name in _CHOICES:
        if value is None:  # maxfx's earlier default for op_log_level
            return ""
        if not isinstance(value, str) or value.lower() not in _CHOICES[name]:
            raise ValueError(
                f"DebugConfig.{name} must be one of {', '.join(repr(c) for c in _CHOICES[name])}, got {value!r}"
            )
        return value.lower()
    if name == "print_style":
        style = getattr(PrintStyle, value.upper(), None) if isinstance(value, str) else value
        if not isinstance(style, PrintStyle):
            raise TypeError(f"DebugConfig.print_style must be a PrintStyle (or its name), got {value!r}")
        return style
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"DebugConfig.ir_output_dir must be a str or path, got {type(value).__name__}")
    return os.fspath(value)


def _parse_env(text: str) -> dict[str, Any]:
    """``MODULAR_DEBUG``'s options; unknown or malformed items are named in one warning."""
    options: dict[str, Any] = {}
    unknown = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        name = key.strip().replace("-", "_")
        if name == "sensible" and not value:
            name = "sensible_mode"
        try:
            if name in _FLAGS and not value:
                options[name] = True
            elif name in _DEFAULTS and name not in _FLAGS and value:
                options[name] = _check(name, value.strip())
            else:
                unknown.append(item)
        except (TypeError, ValueError):
            unknown.append(item)
    if unknown:
        warnings.warn(
            f"MODULAR_DEBUG: ignoring {', '.join(unknown)} (options: sensible, "
            f"{', '.join(n.replace('_', '-') for n in _DEFAULTS)})",
            stacklevel=3,
        )
    return options


class GraphDebugConfig:
    """MAX's ``Graph.debug`` view: ``source_tracebacks``, read while graphs are built.

    MAX narrows ``Graph.debug`` to this one option (the others are read when a
    session compiles or runs, through ``InferenceSession.debug``); both share the
    process's state. maxfx's ``Graph.debug`` is that state itself, a
    `DebugConfig`, which is a ``GraphDebugConfig`` with every option.

    Example:
        >>> view = GraphDebugConfig()
        >>> view.source_tracebacks = True
        >>> DEBUG.source_tracebacks
        True
        >>> view.source_tracebacks = False
    """

    def _config(self) -> DebugConfig:
        return DEBUG

    @property
    def source_tracebacks(self) -> bool:
        """Whether graph nodes record the user's ``file:line`` (see `DebugConfig`)."""
        return self._config()._value("source_tracebacks")

    @source_tracebacks.setter
    def source_tracebacks(self, value: bool) -> None:
        self._config().source_tracebacks = value  # DebugConfig checks it


class DebugConfig(GraphDebugConfig):
    """Process-wide debugging options (MAX's ``max.engine.DebugConfig``); see the module docstring.

    Set them on the class attribute before the stage that reads them:
    ``Graph.debug.source_tracebacks = True`` before building a graph,
    ``InferenceSession.debug.nan_check = True`` before ``compile``/``load``,
    ``InferenceSession.debug.device_sync_mode = True`` before ``execute``.
    With ``sensible_mode`` on, ``nan_check``, ``assert_level='all'``,
    ``device_sync_mode``, both stack-trace flags and ``source_tracebacks``
    default to on; setting one of them overrides that.

    Args:
        env: the ``MODULAR_DEBUG`` text (default: the environment variable).
    """

    def __init__(self, env: str | None = None):
        object.__setattr__(self, "_env", _parse_env(os.environ.get("MODULAR_DEBUG", "") if env is None else env))
        object.__setattr__(self, "_set", {})

    def _config(self) -> DebugConfig:
        return self

    def _value(self, name: str) -> Any:
        for layer in (self._set, self._env):
            if name in layer:
                return layer[name]
        if name in _SENSIBLE and self._value("sensible_mode"):
            return _SENSIBLE[name]
        return _DEFAULTS[name]

    def __getattr__(self, name: str) -> Any:
        if name in _DEFAULTS:
            return self._value(name)
        raise AttributeError(f"DebugConfig has no option {name!r}; the options are {', '.join(_DEFAULTS)}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _DEFAULTS:
            raise AttributeError(f"DebugConfig has no option {name!r}; the options are {', '.join(_DEFAULTS)}")
        self._set[name] = _check(name, value)

    def reset(self) -> None:
        """Forget every option set from Python; ``MODULAR_DEBUG``'s stay in effect."""
        self._set.clear()

    def compile_options(self) -> tuple[bool, bool]:
        """(nan_check, log ops) as a graph is compiled now: ops are logged at ``op_log_level`` ``trace`` or
        ``debug``.
        """
        return self.nan_check, self.op_log_level in ("trace", "debug")

    def __repr__(self) -> str:
        return "DebugConfig(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in _DEFAULTS) + ")"


DEBUG = DebugConfig()
"""The process's options: ``InferenceSession.debug`` and ``Graph.debug``."""
