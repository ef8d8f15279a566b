"""Per-request sampling settings and how they are merged with a model's generation config."""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["SamplingParams", "SamplingParamsGenerationConfigDefaults", "SamplingParamsInput"]

_logger = logging.getLogger("max.pipelines")

# A logits processor is called with a ProcessorInputs (see _logits.py) and edits the logits in place.
_LogitsProcessor = Callable[[Any], None]


@dataclass
class SamplingParamsInput:
    """All-optional mirror of :class:`SamplingParams`: ``None`` means "use the default".

    Example::

        >>> SamplingParamsInput(temperature=0.7).top_k is None
        True
    """

    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    temperature: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    ignore_eos: bool | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    detokenize: bool | None = None
    seed: int | None = None
    logits_processors: Sequence[_LogitsProcessor] | None = None


@dataclass(frozen=True)
class SamplingParamsGenerationConfigDefaults:
    """Sampling defaults read from a model's ``generation_config.json`` (middle priority).

    Every field is ``None`` unless the model's generation config sets it.
    ``do_sample=False`` means greedy decoding (temperature 0, top_k 1).

    Example::

        >>> SamplingParamsGenerationConfigDefaults(temperature=0.7, top_k=50).values_to_update
        {'temperature': 0.7, 'top_k': 50}
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    do_sample: bool | None = None

    @property
    def values_to_update(self) -> dict[str, float | int]:
        """The fields that are set (not ``None``), as a fresh dict the caller may mutate."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_generation_config(cls, config: Any) -> SamplingParamsGenerationConfigDefaults:
        """Build from a ``generation_config.json`` mapping (or an object with those attributes).

        Keys the class does not know are ignored; a missing key stays ``None``.

        Example::

            >>> SamplingParamsGenerationConfigDefaults.from_generation_config({"do_sample": True, "top_p": 0.9,
            ...     "eos_token_id": 2})  # doctest: +NORMALIZE_WHITESPACE
            SamplingParamsGenerationConfigDefaults(temperature=None, top_p=0.9, top_k=None, repetition_penalty=None,
            max_new_tokens=None, min_new_tokens=None, do_sample=True)
        """
        get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
        return cls(**{f.name: get(f.name) for f in fields(cls)})


def _check_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"SamplingParams.{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"SamplingParams.{name} must be finite, got {value!r}")
    return value


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"SamplingParams.{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"SamplingParams.{name} must be >= 0, got {value}")
    return value


@dataclass(frozen=True)
class SamplingParams:
    """Request-specific sampling settings.

    Defaults follow MAX: sample from the whole vocabulary (``top_k=-1``,
    ``top_p=1``, ``temperature=1``) with a fresh cryptographically random
    ``seed``. ``temperature=0`` means greedy and forces ``top_k=1``;
    ``top_k=0`` is read as ``-1`` (all tokens).

    Example::

        >>> p = SamplingParams(temperature=0, max_new_tokens=16)
        >>> p.top_k, p.max_new_tokens
        (1, 16)
        >>> SamplingParams(top_p=1.5)
        Traceback (most recent call last):
        ...
        ValueError: SamplingParams.top_p must be in [0, 1], got 1.5
    """

    top_k: int = -1
    """Sample among the K most probable tokens; -1 = all, 1 = greedy."""
    top_p: float = 1
    """Nucleus threshold, applied within the top-k set."""
    min_p: float = 0.0
    """Drop tokens whose probability is below ``min_p`` times the best one; in [0, 1]."""
    temperature: float = 1
    """Softmax temperature; 0 = greedy; any value >= 0 (the server takes OpenAI's [0, 2])."""
    frequency_penalty: float = 0.0
    """Penalty proportional to how often a token already appeared; in [-2, 2]."""
    presence_penalty: float = 0.0
    """Flat penalty for tokens that already appeared; in [-2, 2]."""
    repetition_penalty: float = 1.0
    """Divides the logits of tokens already seen (> 1 penalizes); must be > 0."""
    max_new_tokens: int | None = None
    """Cap on generated tokens; ``None`` = until the model's length limit."""
    min_new_tokens: int = 0
    """EOS is masked until this many tokens were generated."""
    ignore_eos: bool = False
    """Keep generating past EOS until a limit or stop string is hit."""
    stop: list[str] | None = None
    """Stop strings (detokenized)."""
    stop_token_ids: list[int] | None = None
    """Token ids that stop generation."""
    detokenize: bool = True
    """Return text, not only token ids."""
    seed: int = field(default_factory=lambda: secrets.randbits(32))
    """RNG seed; a fresh cryptographically secure value by default."""
    logits_processors: Sequence[_LogitsProcessor] | None = None
    """Callables applied to the logits (``ProcessorInputs``) before sampling."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        # None (e.g. an explicit JSON null) means "default" for the two nucleus knobs.
        if self.top_k is None:
            set_(self, "top_k", -1)
        if self.top_p is None:
            set_(self, "top_p", 1)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"SamplingParams.top_k must be an int, got {type(self.top_k).__name__} {self.top_k!r}")
        if self.top_k == 0:
            set_(self, "top_k", -1)
        if self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (all tokens) or a positive int, got {self.top_k}")
        if not 0.0 <= _check_number("top_p", self.top_p) <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in [0, 1], got {self.top_p}")
        if not 0.0 <= _check_number("min_p", self.min_p) <= 1.0:
            raise ValueError(f"SamplingParams.min_p must be in [0, 1], got {self.min_p}")
        if (
            _check_number("temperature", self.temperature) < 0
        ):  # any value >= 0, as MAX documents; OpenAI's [0, 2] is the server's rule
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not -2.0 <= _check_number(name, value) <= 2.0:
                raise ValueError(f"SamplingParams.{name} must be in [-2, 2], got {value}")
        if _check_number("repetition_penalty", self.repetition_penalty) <= 0:
            raise ValueError(f"SamplingParams.repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_new_tokens is not None:
            _check_count("max_new_tokens", self.max_new_tokens)
        _check_count("min_new_tokens", self.min_new_tokens)
        if self.stop is not None:
            if isinstance(self.stop, str):
                set_(self, "stop", [self.stop])
            elif not isinstance(self.stop, list):
                set_(self, "stop", list(self.stop))
            for s in self.stop:
                if not isinstance(s, str):
                    raise TypeError(f"SamplingParams.stop must hold str, got {type(s).__name__} {s!r}")
                if not s:
                    raise ValueError("SamplingParams.stop must not contain an empty string")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list):
                set_(self, "stop_token_ids", list(self.stop_token_ids))
            for t in self.stop_token_ids:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                    raise ValueError(f"SamplingParams.stop_token_ids must hold non-negative ints, got {t!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"SamplingParams.seed must be an int, got {type(self.seed).__name__} {self.seed!r}")
        if self.temperature == 0:
            set_(self, "top_k", 1)

    @classmethod
    def from_input_and_generation_config(
        cls,
        input_params: SamplingParamsInput,
        sampling_params_defaults: SamplingParamsGenerationConfigDefaults,
    ) -> SamplingParams:
        """Merge the three sources: user input > model generation config > class defaults.

        ``do_sample=False`` in the generation config becomes ``temperature=0,
        top_k=1`` (greedy) unless the user sets those.

        Example::

            >>> gen = SamplingParamsGenerationConfigDefaults(temperature=0.6, top_p=0.9, max_new_tokens=256)
            >>> p = SamplingParams.from_input_and_generation_config(SamplingParamsInput(temperature=0.2), gen)
            >>> p.temperature, p.top_p, p.max_new_tokens, p.top_k
            (0.2, 0.9, 256, -1)
        """
        if not isinstance(input_params, SamplingParamsInput):
            raise TypeError(f"input_params must be a SamplingParamsInput, got {type(input_params).__name__}")
        if not isinstance(sampling_params_defaults, SamplingParamsGenerationConfigDefaults):
            raise TypeError(
                "sampling_params_defaults must be a SamplingParamsGenerationConfigDefaults, got "
                f"{type(sampling_params_defaults).__name__}"
            )
        values: dict[str, Any] = sampling_params_defaults.values_to_update
        do_sample = values.pop("do_sample", None)
        if do_sample is False:
            values["temperature"] = 0
            values["top_k"] = 1
        for f in fields(input_params):
            value = getattr(input_params, f.name)
            if value is not None:
                values[f.name] = value
        return cls(**values)

    @property
    def needs_penalties(self) -> bool:
        """Whether any frequency / presence / repetition penalty is active."""
        return self.frequency_penalty != 0.0 or self.presence_penalty != 0.0 or self.repetition_penalty != 1.0

    def log_sampling_info(self) -> None:
        """Log every setting at INFO level on the ``max.pipelines`` logger, one per line."""
        _logger.info("Sampling Config")
        _logger.info("=" * 60)
        for name in (
            "top_k",
            "top_p",
            "min_p",
            "temperature",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
            "max_new_tokens",
            "min_new_tokens",
            "ignore_eos",
            "detokenize",
        ):
            _logger.info("    %-22s : %s", name, getattr(self, name))
        stops = ", ".join(f'"{s}"' for s in self.stop) if self.stop else None
        _logger.info("    %-22s : %s", "stop_strings", f"[{stops}]" if stops else None)
        ids = ", ".join(str(t) for t in self.stop_token_ids) if self.stop_token_ids else None
        _logger.info("    %-22s : %s", "stop_token_ids", f"[{ids}]" if ids else None)
        _logger.info("")
