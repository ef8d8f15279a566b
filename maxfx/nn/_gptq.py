"""`GPTQLinear`: a `Linear` over GPTQ int4 weights packed as MAX does (``ops.qmatmul``).

The weight is ``uint8 [K/2 + 2*K/group_size, N]`` (raw AutoGPTQ ``qweight``
bytes then float16 ``scales`` bytes, see ``custom_calls.qmatmul.gptq_pack``);
with ``desc_act`` a ``perm_idx [K]`` weight reorders the input features first.
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import Weight
from maxfx.graph.quantization import QuantizationConfig, QuantizationEncoding
from maxfx.nn._basic import Linear, _on

__all__ = ["GPTQLinear"]


class GPTQLinear(Linear):
    """``y = x @ W + b`` with ``W`` a packed symmetric GPTQ int4 matrix ``[K = in_dim, N = out_dim]``.

    Example:
        >>> cfg = QuantizationConfig(quant_method="gptq", bits=4, group_size=32, desc_act=True, sym=True)
        >>> lin = GPTQLinear(64, 8, DType.float32, DeviceRef.CPU(), quantization_encoding=QuantizationEncoding.GPTQ,
        ...     quantization_config=cfg)
        >>> {k: list(v.shape) for k, v in lin.raw_state_dict().items()}
        {'weight': [36, 8], 'perm_idx': [64]}
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        device: Any,
        has_bias: bool = False,
        quantization_encoding: QuantizationEncoding | None = None,
        quantization_config: QuantizationConfig | None = None,
        float8_config: Any = None,
    ):
        if float8_config is not None:
            raise ValueError("GPTQLinear: float8_config is not supported (GPTQ weights are int4)")
        if quantization_encoding not in (None, QuantizationEncoding.GPTQ):
            raise ValueError(
                f"GPTQLinear: quantization_encoding must be QuantizationEncoding.GPTQ, got {quantization_encoding}"
            )
        gs = getattr(quantization_config, "group_size", None)
        if quantization_config is None or not isinstance(gs, int) or gs <= 0 or in_dim % gs or in_dim % 8:
            raise ValueError(
                f"GPTQLinear: needs a QuantizationConfig with a group_size dividing in_dim={in_dim} (a multiple of 8), "
                f"got {quantization_config!r}"
            )
        super().__init__(in_dim, out_dim, dtype, device, has_bias=has_bias)
        self.quantization_encoding = QuantizationEncoding.GPTQ
        self.quantization_config = quantization_config
        cpu = DeviceRef.CPU()
        self.weight = Weight(
            "weight",
            DType.uint8,
            [in_dim // 2 + 2 * (in_dim // gs), out_dim],
            cpu,
            quantization_encoding=QuantizationEncoding.GPTQ,
        )
        self.perm_idx = Weight("perm_idx", DType.int32, [in_dim], cpu) if quantization_config.desc_act else None

    def __call__(self, x: Any) -> Any:
        rhs = [_on(self.weight, self.device)]
        if self.perm_idx is not None:
            perm = _on(self.perm_idx, self.device)
            x = ops.gather(x, perm, axis=-1)
            rhs.append(perm)
        out = ops.qmatmul(QuantizationEncoding.GPTQ, self.quantization_config, x, *rhs)
        return out + _on(self.bias, self.device) if self.bias is not None else out
