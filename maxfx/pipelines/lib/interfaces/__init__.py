"""``max.pipelines.lib.interfaces``: the interfaces model authors implement (`PipelineModel`, `KVCacheMixin`).

- `PipelineModel`: input preparation, execution and memory estimates of a model;
  `ModelInputs` / `ModelOutputs` are what it takes and returns.
- `KVCacheMixin`: KV-cache parameters and the paged KV manager of a model.
- `AlwaysSignalBuffersMixin`: for graphs that always take allreduce signal buffers.
- `get_paged_manager`: a pipeline's paged KV manager, if any.
- `GenerateMixin`: ``generate`` / ``generate_async`` (requests in, finished outputs out)
  and the engine-backed ``execute`` / ``release`` of maxfx's pipelines.

Example:
    >>> from maxfx.pipelines.lib.interfaces import ModelOutputs, get_paged_manager
    >>> ModelOutputs(logits=[0.5]).next_token_logits is None, get_paged_manager(object()) is None
    (True, True)
"""

from maxfx.pipelines.lib.interfaces._generate import BatchInfo, GenerateMixin
from maxfx.pipelines.lib.interfaces.kv_cache import KVCacheMixin, get_paged_manager
from maxfx.pipelines.lib.interfaces.pipeline_model import (
    AlwaysSignalBuffersMixin,
    ModelInputs,
    ModelOutputs,
    PipelineModel,
)

__all__ = [
    "AlwaysSignalBuffersMixin",
    "BatchInfo",
    "GenerateMixin",
    "KVCacheMixin",
    "ModelInputs",
    "ModelOutputs",
    "PipelineModel",
    "get_paged_manager",
]
