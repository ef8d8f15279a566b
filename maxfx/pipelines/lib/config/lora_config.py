"""`LoRAConfig`: serving-side LoRA adapters (`PipelineConfig.lora_config`, None unless ``enable_lora``).

Example:
    >>> LoRAConfig(enable_lora=True, max_lora_rank=8).max_num_loras
    100
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from maxfx.pipelines.lib.config._base import ConfigError, MAXConfig, check_bool, check_int, option

__all__ = ["LoRAConfig"]

_OWNER = "LoRAConfig"


@dataclass
class LoRAConfig(MAXConfig):
    """LoRA adapters: static adapter paths, the largest rank, how many are active per batch.

    A ``lora_paths`` entry is a folder or file, or ``name=path`` to name the adapter.
    """

    enable_lora: bool = option(False, doc="Serve LoRA adapters (False).")
    lora_paths: list[str] = option(factory=list, doc="Adapters loaded at start: paths, or name=path entries ([]).")
    max_lora_rank: int = option(16, doc="Largest rank of any LoRA adapter (16).")
    max_num_loras: int = option(
        100, doc="Most adapters active in one batch; others are evicted least recently used first (100)."
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every option (a `ConfigError` names the option).

        Raises:
            ConfigError: e.g. ``max_lora_rank`` below 1 or a ``lora_paths`` entry that is not a str.
        """
        self.enable_lora = check_bool(_OWNER, "enable_lora", self.enable_lora)
        if isinstance(self.lora_paths, (str, Path)):
            self.lora_paths = [self.lora_paths]
        if not isinstance(self.lora_paths, (list, tuple)) or not all(
            isinstance(p, (str, Path)) for p in self.lora_paths
        ):
            raise ConfigError(
                f"{_OWNER}.lora_paths must be a list of paths (or name=path strings), got {self.lora_paths!r}"
            )
        self.lora_paths = [str(p) for p in self.lora_paths]
        self.max_lora_rank = check_int(_OWNER, "max_lora_rank", self.max_lora_rank, minimum=1)
        self.max_num_loras = check_int(_OWNER, "max_num_loras", self.max_num_loras, minimum=1)

    def adapter_paths(self) -> dict[str, Path]:
        """Adapter name -> path of every ``lora_paths`` entry (the name of an unnamed one is its path).

        Example:
            >>> LoRAConfig(lora_paths=["chat=/adapters/chat"]).adapter_paths()
            {'chat': PosixPath('/adapters/chat')}
        """
        out = {}
        for entry in self.lora_paths:
            name, sep, path = entry.partition("=")
            out[name if sep else entry] = Path(path if sep else entry).expanduser()
        return out

    def resolve(self) -> None:
        """Check the options and that every adapter path exists.

        Raises:
            ConfigError: an option is invalid, or an adapter path does not exist.
        """
        self.validate()
        for name, path in self.adapter_paths().items():
            if not path.exists():
                raise ConfigError(
                    f"{_OWNER}.lora_paths entry {name!r} must be an existing LoRA adapter path, got {str(path)!r}, "
                    "which does not exist"
                )
