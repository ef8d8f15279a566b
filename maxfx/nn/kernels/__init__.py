"""``max.nn.kernels``: graph-level wrappers of MAX's fused kernels.

Each wrapper checks its arguments and builds graph ops from the registry
(``maxfx.graph.ops``); attention and quantized matmul route to the
``custom_calls`` Pallas kernels through their registry ops. The families live
in private files: attention and KV-cache kernels, float8/MoE/LoRA/sampling
kernels.
"""

__all__: list[str] = []
