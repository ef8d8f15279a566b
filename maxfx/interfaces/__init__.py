"""maxfx.interfaces: MAX's ``max.interfaces``, the data types shared by the serving stack.

Requests (:class:`TextGenerationRequest`, :class:`AudioGenerationRequest`),
sampling settings (:class:`SamplingParams` and its merge with a model's
generation config), per-step inputs and outputs of pipelines, the context,
pipeline, tokenizer, scheduler and queue protocols, LoRA admin messages and
the msgpack wire format (numpy arrays, optionally through shared memory).

A leaf package: it imports only the standard library, numpy and msgpack.
"""

from ._audio import (
    AudioGenerationContextType,
    AudioGenerationInputs,
    AudioGenerationMetadata,
    AudioGenerationOutput,
    AudioGenerationRequest,
)
from ._context import BaseContext, BaseContextType
from ._embeddings import (
    EmbeddingsContext,
    EmbeddingsGenerationContextType,
    EmbeddingsGenerationInputs,
    EmbeddingsGenerationOutput,
)
from ._log_probabilities import LogProbabilities
from ._logits import BatchLogitsProcessor, BatchProcessorInputs, LogitsProcessor, ProcessorInputs
from ._lora import LoRAOperation, LoRARequest, LoRAResponse, LoRAStatus, LoRAType
from ._msgpack import MsgpackNumpyDecoder, MsgpackNumpyEncoder, msgpack_eq, msgpack_numpy_decoder, msgpack_numpy_encoder
from ._pipeline import (
    Pipeline,
    PipelineInputs,
    PipelineInputsType,
    PipelineOutput,
    PipelineOutputsDict,
    PipelineOutputType,
    PipelinesFactory,
)
from ._queue import MAXPullQueue, MAXPushQueue, drain_queue, get_blocking
from ._request import Request, RequestID
from ._sampling import SamplingParams, SamplingParamsGenerationConfigDefaults, SamplingParamsInput
from ._scheduler import Scheduler, SchedulerResult
from ._shared_memory import SharedMemoryArray
from ._status import GenerationStatus
from ._task import PipelineTask
from ._text_context import TextGenerationContext, TextGenerationContextType, init_text_generation_state
from ._text_generation import (
    BatchType,
    TextGenerationInputs,
    TextGenerationOutput,
    TextGenerationRequest,
    TextGenerationRequestFunction,
    TextGenerationRequestMessage,
    TextGenerationRequestTool,
    TextGenerationResponseFormat,
)
from ._tokenizer import PipelineTokenizer
from ._vision import ImageMetadata, VLMTextGenerationContext

__all__ = [
    "AudioGenerationContextType",
    "AudioGenerationInputs",
    "AudioGenerationMetadata",
    "AudioGenerationOutput",
    "AudioGenerationRequest",
    "BaseContext",
    "BaseContextType",
    "BatchLogitsProcessor",
    "BatchProcessorInputs",
    "BatchType",
    "EmbeddingsContext",
    "EmbeddingsGenerationContextType",
    "EmbeddingsGenerationInputs",
    "EmbeddingsGenerationOutput",
    "GenerationStatus",
    "ImageMetadata",
    "LoRAOperation",
    "LoRARequest",
    "LoRAResponse",
    "LoRAStatus",
    "LoRAType",
    "LogProbabilities",
    "LogitsProcessor",
    "MAXPullQueue",
    "MAXPushQueue",
    "MsgpackNumpyDecoder",
    "MsgpackNumpyEncoder",
    "Pipeline",
    "PipelineInputs",
    "PipelineInputsType",
    "PipelineOutput",
    "PipelineOutputType",
    "PipelineOutputsDict",
    "PipelineTask",
    "PipelineTokenizer",
    "PipelinesFactory",
    "ProcessorInputs",
    "Request",
    "RequestID",
    "SamplingParams",
    "SamplingParamsGenerationConfigDefaults",
    "SamplingParamsInput",
    "Scheduler",
    "SchedulerResult",
    "SharedMemoryArray",
    "TextGenerationContext",
    "TextGenerationContextType",
    "TextGenerationInputs",
    "TextGenerationOutput",
    "TextGenerationRequest",
    "TextGenerationRequestFunction",
    "TextGenerationRequestMessage",
    "TextGenerationRequestTool",
    "TextGenerationResponseFormat",
    "VLMTextGenerationContext",
    "drain_queue",
    "get_blocking",
    "init_text_generation_state",
    "msgpack_eq",
    "msgpack_numpy_decoder",
    "msgpack_numpy_encoder",
]
