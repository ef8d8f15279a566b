"""``max.graph.ops.random``: random tensors inside a graph, from a per-graph seed.

`set_seed` seeds the graph being built (a Python int, or a ``SeedType`` graph
input); `uniform` and `gaussian` (alias `normal`) draw samples shaped like a
`TensorType` and advance the seed, so successive draws differ. Defined in
`lowering.ops.random`; re-exported here by name.
"""

from lowering.ops.random import SeedType, gaussian, normal, set_seed, uniform

__all__ = ["SeedType", "gaussian", "normal", "set_seed", "uniform"]
