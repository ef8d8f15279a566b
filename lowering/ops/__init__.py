"""Op families. Importing this package registers every op.

One file per family; each op is one `OpDef` + one front (see `lowering.registry`).
"""

from lowering.ops import (  # noqa: F401  (imports register the ops)
    advanced_indexing,
    attention,
    buffer,
    collective,
    control_flow,
    core,
    creation,
    custom,
    debug,
    elementwise,
    fused,
    indexing,
    linalg,
    nn,
    norm,
    quantized,
    random,
    reduction,
    resize,
    sampling_kernels,
    shape,
)
