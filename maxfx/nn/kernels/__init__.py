"""``max.nn.kernels``: graph-level wrappers of MAX's fused kernels.

Each wrapper checks its arguments and builds graph ops from the registry
(``maxfx.graph.ops``); attention and quantized matmul route to the
``custom_calls`` Pallas kernels through their registry ops. The families live
in private files: attention and KV-cache kernels, float8/MoE/LoRA/sampling
kernels.
"""

from maxfx.nn.kernels import _attention, _float8, _lora, _misc, _moe, _sampling
from maxfx.nn.kernels._attention import *  # noqa: F403  (attention and paged KV-cache kernels)
from maxfx.nn.kernels._float8 import *  # noqa: F403  (float8 quantize / scaled matmul)
from maxfx.nn.kernels._lora import *  # noqa: F403  (SGMV LoRA)
from maxfx.nn.kernels._misc import *  # noqa: F403  (swish_glu, scatter_set_constant, merge_ragged_tensors)
from maxfx.nn.kernels._moe import *  # noqa: F403  (MoE indices, grouped matmul)
from maxfx.nn.kernels._sampling import *  # noqa: F403  (fused sampling, penalties)

__all__: list[str] = []
__all__ += _attention.__all__
__all__ += _float8.__all__ + _lora.__all__ + _misc.__all__ + _moe.__all__ + _sampling.__all__
