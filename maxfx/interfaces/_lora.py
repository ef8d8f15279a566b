"""LoRA adapter administration messages (load / unload / list) between the server and the model worker."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["LoRAOperation", "LoRARequest", "LoRAResponse", "LoRAStatus", "LoRAType"]


class LoRAOperation(str, Enum):
    """What a :class:`LoRARequest` asks for."""

    LOAD = "load"
    UNLOAD = "unload"
    LIST = "list"


class LoRAStatus(str, Enum):
    """Outcome of a :class:`LoRARequest`."""

    SUCCESS = "success"
    LOAD_NAME_EXISTS = "load_name_exists"
    UNLOAD_NAME_NONEXISTENT = "unload_name_nonexistent"
    LOAD_ERROR = "load_error"
    UNLOAD_ERROR = "unload_error"
    LOAD_INVALID_PATH = "load_invalid_path"
    LOAD_INVALID_ADAPTER = "load_invalid_adapter"


class LoRAType(str, Enum):
    """LoRA weight kinds, named as they appear in adapter checkpoints (``...lora_A.weight``)."""

    A = "lora_A"
    """Down-projection (in_features -> rank)."""
    B = "lora_B"
    """Up-projection (rank -> out_features)."""
    BIAS = "lora.bias"
    """Bias added with B."""


@dataclass
class LoRARequest:
    """Ask the worker to load, unload or list adapters.

    ``LOAD`` needs ``lora_name`` and ``lora_path``; ``UNLOAD`` needs ``lora_name``.

    Example::

        >>> LoRARequest(LoRAOperation.LOAD, "sql", "/adapters/sql").operation
        <LoRAOperation.LOAD: 'load'>
        >>> LoRARequest("unload")
        Traceback (most recent call last):
        ...
        ValueError: LoRARequest(unload) needs lora_name
    """

    operation: LoRAOperation
    lora_name: str | None = None
    lora_path: str | None = None

    def __post_init__(self) -> None:
        self.operation = LoRAOperation(self.operation)
        if self.operation in (LoRAOperation.LOAD, LoRAOperation.UNLOAD) and not self.lora_name:
            raise ValueError(f"LoRARequest({self.operation.value}) needs lora_name")
        if self.operation is LoRAOperation.LOAD and not self.lora_path:
            raise ValueError("LoRARequest(load) needs lora_path")


@dataclass
class LoRAResponse:
    """The worker's answer: a :class:`LoRAStatus` and a message (the adapter names for ``LIST``).

    Example::

        >>> LoRAResponse("success", ["sql", "chat"]).status is LoRAStatus.SUCCESS
        True
    """

    status: LoRAStatus
    message: str | list[str]

    def __post_init__(self) -> None:
        self.status = LoRAStatus(self.status)
