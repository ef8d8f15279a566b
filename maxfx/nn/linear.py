"""``max.nn.linear``: `Linear`, the gated `MLP`, tensor-parallel and GPTQ linears, and the deprecated V1 layers."""

from maxfx.nn._basic import MLP, Linear
from maxfx.nn._gptq import GPTQLinear
from maxfx.nn._parallel import ColumnParallelLinear, DistributedGemmConfig
from maxfx.nn._v1 import MLPV1, GPTQLinearV1, LinearV1, QLinearV1

__all__ = [
    "ColumnParallelLinear",
    "DistributedGemmConfig",
    "GPTQLinear",
    "GPTQLinearV1",
    "Linear",
    "LinearV1",
    "MLP",
    "MLPV1",
    "QLinearV1",
]
