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
    float8,
    indexing,
    linalg,
    lora,
    moe,
    nn,
    norm,
    quantized,
    ragged,
    random,
    reduction,
    resize,
    sampling,
    sampling_kernels,
    shape,
)
