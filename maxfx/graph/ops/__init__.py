"""Graph ops: every op of the registry, with MAX's signatures.

Each function records a node into the graph that owns its inputs (or the
active ``Graph``) and returns `TensorValue`s. The functions are the fronts
registered in ``lowering.registry``, imported here by name so that grep, IDEs
and ``help()`` find them; nothing here defines op math.
``tests/ops/test_public_names.py`` checks that this module exports exactly the
registry's fronts.

Example:
    >>> from maxfx.graph import Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> with Graph("g", input_types=[TensorType(DType.float32, [3])]) as g:
    ...     g.output(ops.relu(g.inputs[0]))
"""

from collections.abc import Callable

from lowering.ops.attention import (
    attention,
    flash_attention,
    kv_cache_gather,
    kv_cache_store,
    paged_attention,
    ragged_attention,
    rope_ragged,
)
from lowering.ops.buffer import buffer_create, buffer_load, buffer_store, buffer_store_slice
from lowering.ops.collective import allgather, allreduce_sum, distributed_broadcast, shard_and_stack, transfer_to
from lowering.ops.control_flow import call, cond, while_loop
from lowering.ops.core import cast, constant
from lowering.ops.creation import constant_external, hann_window, range  # noqa: A004 - MAX's name
from lowering.ops.custom import custom, inplace_custom
from lowering.ops.debug import assert_same_device, export_tensor
from lowering.ops.debug import print_ as print  # noqa: A004 - MAX's name
from lowering.ops.elementwise import (  # noqa: A004 - abs, pow, round: MAX's names
    abs,
    acos,
    add,
    atanh,
    ceil,
    cos,
    div,
    equal,
    erf,
    exp,
    floor,
    floor_div,
    gelu,
    greater,
    greater_equal,
    is_inf,
    is_nan,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    mod,
    mul,
    negate,
    not_equal,
    outer,
    pow,
    relu,
    round,
    rsqrt,
    sigmoid,
    silu,
    sin,
    sqrt,
    sub,
    tanh,
    trunc,
    where,
)
from lowering.ops.float8 import quantize_dynamic_float8, quantize_static_float8, scaled_matmul
from lowering.ops.indexing import (
    gather,
    gather_nd,
    masked_scatter,
    nonzero,
    scatter,
    scatter_add,
    scatter_max,
    scatter_min,
    scatter_mul,
    scatter_nd,
    scatter_nd_add,
    scatter_nd_max,
    scatter_nd_min,
    scatter_nd_mul,
    slice_tensor,
)
from lowering.ops.linalg import matmul
from lowering.ops.lora import sgmv
from lowering.ops.moe import grouped_matmul_ragged, grouped_scaled_matmul_ragged, moe_create_indices
from lowering.ops.nn import avg_pool2d, conv2d, conv2d_transpose, conv3d, fold, max_pool2d, roi_align
from lowering.ops.norm import group_norm, rms_norm
from lowering.ops.quantized import dequantize, q8_0_matmul, qmatmul
from lowering.ops.ragged import merge_ragged_tensors
from lowering.ops.random import random_normal, random_uniform
from lowering.ops.reduction import argmax, argmin, argsort, cumsum, layer_norm, logsoftmax, mean, prod, softmax, top_k
from lowering.ops.reduction import max_ as max  # noqa: A004 - MAX's name
from lowering.ops.reduction import min_ as min  # noqa: A004 - MAX's name
from lowering.ops.reduction import sum_ as sum  # noqa: A004 - MAX's name
from lowering.ops.resize import resize, resize_bicubic, resize_linear, resize_nearest
from lowering.ops.sampling import apply_penalties, topk_sampling, update_frequency_data
from lowering.ops.shape import (
    as_interleaved_complex,
    band_part,
    broadcast_to,
    chunk,
    concat,
    flatten,
    pad,
    permute,
    rebind,
    repeat_interleave,
    reshape,
    shape_to_tensor,
    split,
    squeeze,
    stack,
    tile,
    transpose,
    unsqueeze,
)
from lowering.types import DeviceRef, InterpolationMode, TensorType
from maxfx.graph.ops import allreduce, complex, elementwise, random, reduction  # noqa: A004 - MAX's submodule names

# As in MAX, `ops.irfft` is the function, bound over the name of its module
# `maxfx.graph.ops.irfft` (which `from maxfx.graph.ops.irfft import Normalization` reaches).
from maxfx.graph.ops.irfft import irfft  # noqa: E402, I001

__all__ = [
    # documented re-exports
    "Callable",
    "DeviceRef",
    "InterpolationMode",
    "TensorType",
    # MAX's submodules: ops.complex.mul, ops.elementwise.max, ops.random.uniform, ops.reduction.max...
    "allreduce",
    "complex",
    "elementwise",
    "random",
    "reduction",
    # attention and KV cache
    "attention",
    "flash_attention",
    "kv_cache_gather",
    "kv_cache_store",
    "paged_attention",
    "ragged_attention",
    "rope_ragged",
    # buffers
    "buffer_create",
    "buffer_load",
    "buffer_store",
    "buffer_store_slice",
    # devices and collectives
    "allgather",
    "allreduce_sum",  # also ops.allreduce.sum, MAX's spelling
    "distributed_broadcast",
    "shard_and_stack",
    "transfer_to",
    # control flow
    "call",
    "cond",
    "while_loop",
    # constants and creation
    "cast",
    "constant",
    "constant_external",
    "hann_window",
    "range",
    # custom ops
    "custom",
    "inplace_custom",
    # debugging
    "assert_same_device",
    "export_tensor",
    "print",
    # elementwise
    "abs",
    "acos",
    "add",
    "atanh",
    "ceil",
    "cos",
    "div",
    "equal",
    "erf",
    "exp",
    "floor",
    "floor_div",
    "gelu",
    "greater",
    "greater_equal",
    "is_inf",
    "is_nan",
    "log",
    "log1p",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "mod",
    "mul",
    "negate",
    "not_equal",
    "outer",
    "pow",
    "relu",
    "round",
    "rsqrt",
    "sigmoid",
    "silu",
    "sin",
    "sqrt",
    "sub",
    "tanh",
    "trunc",
    "where",
    # fused kernels (quantization, MoE, LoRA, sampling)
    "apply_penalties",
    "grouped_matmul_ragged",
    "grouped_scaled_matmul_ragged",
    "merge_ragged_tensors",
    "moe_create_indices",
    "quantize_dynamic_float8",
    "quantize_static_float8",
    "scaled_matmul",
    "sgmv",
    "topk_sampling",
    "update_frequency_data",
    # indexing
    "gather",
    "gather_nd",
    "masked_scatter",
    "nonzero",
    "scatter",
    "scatter_add",
    "scatter_max",
    "scatter_min",
    "scatter_mul",
    "scatter_nd",
    "scatter_nd_add",
    "scatter_nd_max",
    "scatter_nd_min",
    "scatter_nd_mul",
    "slice_tensor",
    # linear algebra
    "matmul",
    # neural-network ops
    "avg_pool2d",
    "conv2d",
    "conv2d_transpose",
    "conv3d",
    "fold",
    "irfft",
    "max_pool2d",
    "resize",
    "resize_bicubic",
    "resize_linear",
    "resize_nearest",
    "roi_align",
    # quantized weights
    "dequantize",
    "q8_0_matmul",
    "qmatmul",
    # random
    "random_normal",
    "random_uniform",
    # reductions
    "argmax",
    "argmin",
    "argsort",
    "cumsum",
    "group_norm",
    "layer_norm",
    "logsoftmax",
    "max",
    "mean",
    "min",
    "prod",
    "rms_norm",
    "softmax",
    "sum",
    "top_k",
    # shape
    "as_interleaved_complex",
    "band_part",
    "broadcast_to",
    "chunk",
    "concat",
    "flatten",
    "pad",
    "permute",
    "rebind",
    "repeat_interleave",
    "reshape",
    "shape_to_tensor",
    "split",
    "squeeze",
    "stack",
    "tile",
    "transpose",
    "unsqueeze",
]
