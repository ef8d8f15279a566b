"""`SupportsLoRA` and `LinearLoRA`: per-request LoRA adapters on a `Linear` (public in `maxfx.nn.lora`).

The overview and its example are `maxfx.nn.lora`'s; `LinearLoRA`'s own example shows the adapter weights.
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph._weight import Weight
from maxfx.nn._basic import Linear
from maxfx.nn.kernels._lora import sgmv_lora_kernel

__all__ = ["SupportsLoRA", "LinearLoRA"]


class SupportsLoRA:
    """Mixin for Modules that apply LoRA adapters: holds the batch's adapter layout.

    Subclasses define ``lora_delta(x)`` (the adapters' contribution);
    `apply_lora` is the layer's own output plus that delta.
    """

    def set_lora_batch_info(self, lora_ids: Any, lora_ranks: Any, lora_grouped_offsets: Any) -> None:
        """Record which adapter each group of rows uses (graph values of this batch)."""
        if lora_ids.rank != 1 or lora_ranks.rank != 1 or lora_grouped_offsets.rank != 1:
            raise ValueError(
                f"{type(self).__name__}.set_lora_batch_info: lora_ids, lora_ranks and lora_grouped_offsets must be 1-D "
                "tensors"
            )
        self.__dict__["lora_ids"] = lora_ids
        self.__dict__["lora_ranks"] = lora_ranks
        self.__dict__["lora_grouped_offsets"] = lora_grouped_offsets

    def _batch_info(self) -> tuple[Any, Any, Any]:
        info = tuple(self.__dict__.get(k) for k in ("lora_ids", "lora_ranks", "lora_grouped_offsets"))
        if any(v is None for v in info):
            raise ValueError(f"{type(self).__name__}: 'set_lora_batch_info' was not called before applying LoRA")
        return info  # type: ignore[return-value]

    def apply_lora(self, x: Any) -> Any:
        """The layer's output on ``x`` plus the LoRA delta of each row's adapter."""
        delta = getattr(self, "lora_delta", None)
        if delta is None:
            raise TypeError(f"{type(self).__name__} mixes in SupportsLoRA but defines no lora_delta(x)")
        self._batch_info()
        return self(x) + delta(x)


class LinearLoRA(Linear, SupportsLoRA):
    """`Linear` plus stacked adapters ``lora_A [max_num_loras, max_lora_rank, in_dim]``,
    ``lora_B [max_num_loras, out_dim, max_lora_rank]`` (and ``lora_bias
    [max_num_loras, out_dim]`` with ``has_lora_bias``). Calling the layer gives
    the base projection; `apply_lora` adds the adapters.

    Example:
        >>> lin = LinearLoRA(8, 4, 3, 2, DType.float32, DeviceRef.CPU(), has_lora_bias=True)
        >>> sorted(lin.state_dict())
        ['lora_A', 'lora_B', 'lora_bias', 'weight']
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        max_num_loras: int,
        max_lora_rank: int,
        dtype: DType,
        device: Any,
        has_bias: bool = False,
        has_lora_bias: bool = False,
        name: str | None = None,
        quantization_encoding: Any = None,
        float8_config: Any = None,
    ):
        super().__init__(
            in_dim,
            out_dim,
            dtype,
            device,
            has_bias=has_bias,
            quantization_encoding=quantization_encoding,
            float8_config=float8_config,
            name=name,
        )
        if max_num_loras <= 0 or max_lora_rank <= 0:
            raise ValueError(
                f"LinearLoRA: max_num_loras and max_lora_rank must be positive, got {max_num_loras} and {max_lora_rank}"
            )
        self.max_num_loras, self.max_lora_rank = int(max_num_loras), int(max_lora_rank)
        prefix = f"{name}." if name else ""
        cpu = DeviceRef.CPU()
        # Adapters stay unquantized: they are small and loaded per request.
        self.lora_A = Weight(
            prefix + "lora_A.weight", dtype, [self.max_num_loras, self.max_lora_rank, self.in_dim], cpu
        )
        self.lora_B = Weight(
            prefix + "lora_B.weight", dtype, [self.max_num_loras, self.out_dim, self.max_lora_rank], cpu
        )
        self.lora_bias = (
            Weight(prefix + "lora.bias", dtype, [self.max_num_loras, self.out_dim], cpu) if has_lora_bias else None
        )

    def lora_delta(self, x: Any) -> Any:
        """``(x @ A[id].T)[:, :rank] @ B[id].T (+ lora_bias[id])`` for each group of rows of ``x [rows, in_dim]``."""
        ids, ranks, offsets = self._batch_info()
        on = lambda w: w.to(self.device) if w.device != self.device else w  # noqa: E731
        bias = on(self.lora_bias) if self.lora_bias is not None else None
        return sgmv_lora_kernel(x, on(self.lora_A), on(self.lora_B), ids, ranks, offsets, self.in_dim, bias)

    def apply_lora(self, x: Any) -> Any:
        """``self(x)`` plus each row's adapter delta (see `lora_delta`)."""
        return SupportsLoRA.apply_lora(self, x)
