"""What every config class shares: documented options, ``help()``, typed errors and value checks.

Each config is a dataclass whose public fields are its options; a field's
``metadata["doc"]`` is its help text. The checks raise `ConfigError`, naming
the option, the value and what is expected.

Example:
    >>> check_int("KVCacheConfig", "kv_cache_page_size", 0, minimum=1)
    Traceback (most recent call last):
    maxfx.pipelines.lib.config._base.ConfigError: KVCacheConfig.kv_cache_page_size must be an int >= 1, got 0
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import MISSING, Field, field, fields
from typing import Any

__all__ = [
    "ConfigError",
    "MAXConfig",
    "UnknownConfigOptionError",
    "check_bool",
    "check_int",
    "check_number",
    "check_str",
    "coerce_enum",
    "default_of",
    "option",
    "options",
]


class ConfigError(ValueError):
    """An option set to a value it cannot take (the message names the option, the value and what it must be)."""


class UnknownConfigOptionError(TypeError, ValueError):
    """A keyword argument no config has (a ``TypeError`` like a bad keyword, and a ``ValueError`` as in MAX)."""


def option(default: Any = MISSING, *, doc: str, factory: Callable[[], Any] | None = None, nested: bool = False) -> Any:
    """A config field with its help text (``factory`` for mutable or computed defaults).

    ``nested`` marks a field holding another config (left out of ``help()``).
    """
    metadata = {"doc": doc, "nested": nested}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def options(cls: Any) -> list[Field]:
    """The public fields (the options) of a config dataclass or instance."""
    return [f for f in fields(cls) if not f.name.startswith("_")]


def default_of(f: Field) -> Any:
    """A field's default value (a fresh one for factory defaults)."""
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


class MAXConfig:
    """Base of the config dataclasses: `help` lists their options.

    Example:
        >>> from maxfx.pipelines.lib.config import LoRAConfig
        >>> LoRAConfig.help()["max_lora_rank"]
        'Largest rank of any LoRA adapter (16).'
    """

    @classmethod
    def help(cls) -> dict[str, str]:
        """Option name -> description, for every option of this config."""
        return {f.name: f.metadata.get("doc", "") for f in options(cls) if not f.metadata.get("nested")}


def _fail(owner: str, name: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{owner}.{name} must be {expected}, got {value!r}")


def check_int(
    owner: str, name: str, value: Any, *, minimum: int | None = None, optional: bool = False, also: tuple[int, ...] = ()
) -> int | None:
    """``value`` as an int (None allowed when ``optional``), at least ``minimum`` unless it is one of ``also``."""
    if value is None and optional:
        return None
    bound = "" if minimum is None else f" >= {minimum}"
    extra = "".join(f" or {a}" for a in also) + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(owner, name, value, f"an int{bound}{extra}")
    if minimum is not None and value < minimum and value not in also:
        raise _fail(owner, name, value, f"an int{bound}{extra}")
    return int(value)


def check_number(
    owner: str,
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    optional: bool = False,
) -> float | None:
    """``value`` as a float in the given range (``above`` is a strict lower bound)."""
    if value is None and optional:
        return None
    parts = [
        f"> {above}" if above is not None else "",
        f">= {minimum}" if minimum is not None else "",
        f"<= {maximum}" if maximum is not None else "",
    ]
    expected = (
        "a number"
        + (" " + " and ".join(p for p in parts if p) if any(parts) else "")
        + (" or None" if optional else "")
    )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(owner, name, value, expected)
    if (
        (above is not None and not value > above)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
        or value != value
    ):
        raise _fail(owner, name, value, expected)
    return float(value)


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def check_bool(owner: str, name: str, value: Any) -> bool:
    """``value`` as a bool (also the strings true/false, 1/0, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise _fail(owner, name, value, "a bool")


def check_str(owner: str, name: str, value: Any, *, optional: bool = False) -> str | None:
    """``value`` as a str (None allowed when ``optional``; a path-like becomes its str)."""
    if value is None and optional:
        return None
    if hasattr(value, "__fspath__"):
        return str(value)
    if not isinstance(value, str):
        raise _fail(owner, name, value, "a str" + (" or None" if optional else ""))
    return value


def coerce_enum(owner: str, name: str, value: Any, enum_cls: type[enum.Enum], *, optional: bool = False) -> Any:
    """``value`` as a member of ``enum_cls``: a member, a member's value, or its name (any case)."""
    if value is None and optional:
        return None
    if isinstance(value, enum_cls):
        return value
    for member in enum_cls:
        if value == member.value or (
            isinstance(value, str) and value.casefold() in (str(member.value).casefold(), member.name.casefold())
        ):
            return member
    choices = ", ".join(repr(m.value) for m in enum_cls)
    raise _fail(owner, name, value, f"one of {choices}" + (" or None" if optional else ""))
