"""``max.nn.kernels``: graph-level wrappers of MAX's fused kernels.

Each wrapper checks its arguments and builds graph ops from the registry
(``maxfx.graph.ops``); attention and quantized matmul route to the
``custom_calls`` Pallas kernels through their registry ops. The families live
in private files: attention and KV-cache kernels, float8/MoE/LoRA/sampling
kernels.
"""

from maxfx.nn.kernels import (
    _attention,
    _block_scaled,
    _float8,
    _lora,
    _moe,
    _ragged,
    _sampling,
    _scaled_matmul,
    _scaled_qkv,
    _swish_glu,
)
from maxfx.nn.kernels._attention import *  # noqa: F403  (attention and paged KV-cache kernels)
from maxfx.nn.kernels._block_scaled import *  # noqa: F403  (NVFP4 / MXFP4 / MXFP8 quantize and matmuls)
from maxfx.nn.kernels._block_scaled import _is_sm10x_gpu as _is_sm10x_gpu  # MAX's private helper, used by its tests
from maxfx.nn.kernels._float8 import *  # noqa: F403  (float8 quantize / scaled matmul)
from maxfx.nn.kernels._lora import *  # noqa: F403  (SGMV LoRA)
from maxfx.nn.kernels._moe import *  # noqa: F403  (MoE indices, grouped matmul)
from maxfx.nn.kernels._ragged import *  # noqa: F403  (rope_ragged, merge_ragged_tensors, scatter kernels, apply_packed_bitmask)
from maxfx.nn.kernels._sampling import *  # noqa: F403  (fused sampling, penalties)
from maxfx.nn.kernels._scaled_matmul import *  # noqa: F403  (dynamic float8 scaled matmuls: plain, batched, grouped)
from maxfx.nn.kernels._scaled_qkv import *  # noqa: F403  (quantized projections into the KV cache)
from maxfx.nn.kernels._swish_glu import *  # noqa: F403  (swish_glu)

# MAX also exposes the quantized fused QKV kernels under underscore names.
_fused_qkv_ragged_matmul_scaled_float8 = _scaled_qkv.fused_qkv_ragged_matmul_scaled_float8
_fused_qkv_ragged_matmul_scaled_float4 = _scaled_qkv.fused_qkv_ragged_matmul_scaled_float4
_fused_qkv_ragged_matmul_scaled_mxfp8 = _scaled_qkv.fused_qkv_ragged_matmul_scaled_mxfp8

__all__: list[str] = []
__all__ += _attention.__all__ + _block_scaled.__all__ + _scaled_matmul.__all__ + _scaled_qkv.__all__
__all__ += _float8.__all__ + _lora.__all__ + _swish_glu.__all__ + _moe.__all__ + _ragged.__all__ + _sampling.__all__
