"""`SamplingConfig`: switches of the sampling graph (not per-request values, which are `SamplingParams`).

Example:
    >>> s = SamplingConfig(enable_penalties=True)
    >>> s.do_penalties, s.in_dtype, s.enable_min_tokens
    (True, <DType.float32: 81>, False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from maxfx.pipelines.lib.config import _deps
from maxfx.pipelines.lib.config._base import ConfigError, MAXConfig, check_bool, check_int, check_number, option

__all__ = ["SamplingConfig"]

_OWNER = "SamplingConfig"
_PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")
_MIN_TOKENS = ("min_tokens", "min_new_tokens")


@dataclass
class SamplingConfig(MAXConfig):
    """What the sampling step is built to support.

    Penalties and ``min_tokens`` are only applied when switched on here;
    ``enable_variable_logits`` (ragged logits) is turned on by `PipelineConfig`
    for echo and speculative decoding. ``do_penalties`` is MAX 25.x's name of
    ``enable_penalties``. ``top_k`` and ``temperature`` are MAX 25.1's graph-level
    defaults (None: each request's `SamplingParams` decide).
    """

    in_dtype: Any = option(
        factory=lambda: _deps.dtype().float32, doc="DType of the logits given to the sampler (float32)."
    )
    out_dtype: Any = option(factory=lambda: _deps.dtype().float32, doc="DType of the sampler's outputs (float32).")
    enable_structured_output: bool = option(
        False, doc="Constrain decoding to a request's response_format JSON schema (False)."
    )
    enable_variable_logits: bool = option(
        False, doc="Sample from a ragged batch of logits with offsets, as echo and speculative decoding need (False)."
    )
    enable_penalties: bool = option(
        False, doc="Apply frequency, presence and repetition penalties (False); also called do_penalties."
    )
    enable_min_tokens: bool = option(False, doc="Mask stop tokens until a request's min_tokens are generated (False).")
    top_k: int | None = option(
        None,
        doc=(
            "Default top-k for requests that set none (None: the request's SamplingParams decide; MAX 25.1's graph "
            "default)."
        ),
    )
    temperature: float | None = option(
        None,
        doc=(
            "Default temperature for requests that set none (None: the request's SamplingParams decide; MAX 25.1's "
            "graph default)."
        ),
    )

    def __post_init__(self) -> None:
        self.validate()

    @property
    def do_penalties(self) -> bool:
        """MAX 25.x's name of `enable_penalties`."""
        return self.enable_penalties

    @do_penalties.setter
    def do_penalties(self, value: bool) -> None:
        self.enable_penalties = check_bool(_OWNER, "do_penalties", value)

    def validate(self) -> None:
        """Check every option (a `ConfigError` names the option).

        Raises:
            ConfigError: e.g. a non-bool switch or a dtype that is not a `DType`.
        """
        dtype = _deps.dtype()
        for name in ("in_dtype", "out_dtype"):
            value = getattr(self, name)
            if isinstance(value, str) and value in dtype.__members__:
                value = dtype[value]
            if not isinstance(value, dtype):
                raise ConfigError(f"{_OWNER}.{name} must be a DType (or its name, e.g. 'float32'), got {value!r}")
            setattr(self, name, value)
        for name in ("enable_structured_output", "enable_variable_logits", "enable_penalties", "enable_min_tokens"):
            setattr(self, name, check_bool(_OWNER, name, getattr(self, name)))
        self.top_k = check_int(_OWNER, "top_k", self.top_k, minimum=1, optional=True, also=(-1,))
        self.temperature = check_number(_OWNER, "temperature", self.temperature, minimum=0.0, optional=True)

    @classmethod
    def from_generation_config_sampling_defaults(cls, sampling_params_defaults: Any, **kwargs: Any) -> SamplingConfig:
        """A config that also switches on penalties / min_tokens when the model's generation config uses them.

        Args:
            sampling_params_defaults: a `SamplingParamsGenerationConfigDefaults` (or None).
            **kwargs: options; an explicit ``enable_penalties`` / ``enable_min_tokens`` (or ``do_penalties``) wins.

        Example:
            >>> from maxfx.interfaces import SamplingParamsGenerationConfigDefaults as D
            >>> SamplingConfig.from_generation_config_sampling_defaults(D(repetition_penalty=1.1)).enable_penalties
            True
        """
        kwargs = dict(kwargs)
        if "do_penalties" in kwargs:
            kwargs["enable_penalties"] = kwargs.pop("do_penalties")
        explicit = {} if sampling_params_defaults is None else sampling_params_defaults.values_to_update
        if "enable_penalties" not in kwargs and any(explicit.get(k) not in (None, 0, 1.0) for k in _PENALTIES):
            kwargs["enable_penalties"] = True
        if "enable_min_tokens" not in kwargs and any(explicit.get(k) not in (None, 0) for k in _MIN_TOKENS):
            kwargs["enable_min_tokens"] = True
        return cls(**kwargs)
