"""The `SupportedArchitecture` records of maxfx's model families (`maxfx.models`).

Seven families, each registered for text generation and for (decoder) embeddings
under its Hugging Face ``architectures`` name:

| name | model class | encodings | RoPE |
|---|---|---|---|
| ``LlamaForCausalLM`` | `LlamaForCausalLM` | float32, bfloat16; GGUF q4_0, q4_k, q6_k, q8_0 | normal |
| ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` | `LlamaForCausalLM` | float32, bfloat16 | neox |
| ``MistralForCausalLM`` | `LlamaForCausalLM` | float32, bfloat16 | normal |
| ``Phi3ForCausalLM``, ``GemmaForCausalLM`` | `LlamaForCausalLM` | float32, bfloat16 | neox |
| ``GPT2LMHeadModel`` | `GPT2LMHeadModel` | float32, bfloat16 | none (learned positions) |

Text generation uses the paged KV cache; embeddings run one forward and keep no
cache (no KV strategies), pooling the final hidden states (`EmbeddingsPipeline`:
mean, or the last token for Qwen3-Embedding-style models). The pipelines load the
checkpoint themselves (`maxfx.models.load_pretrained`), which reads safetensors,
``.bin`` and GGUF files, so no weight adapters are needed.

Example:
    >>> [a.name for a in ARCHITECTURES if a.task.value == "text_generation"][:3]
    ['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM']
"""

from __future__ import annotations

from maxfx.graph.weights import WeightsFormat
from maxfx.interfaces import PipelineTask
from maxfx.models import GPT2LMHeadModel, LlamaForCausalLM
from maxfx.nn.kv_cache import KVCacheStrategy
from maxfx.pipelines.lib.config import RopeType, SupportedEncoding
from maxfx.pipelines.lib.registry import SupportedArchitecture
from maxfx.pipelines.lib.tokenizer import TextTokenizer

__all__ = ["ARCHITECTURES", "EMBEDDINGS_ARCHITECTURES", "TEXT_GENERATION_ARCHITECTURES"]

_FLOAT = (SupportedEncoding.float32, SupportedEncoding.bfloat16)
# GGUF block encodings maxfx's loader keeps packed (Llama-architecture GGUF files only).
_GGUF = (SupportedEncoding.q4_0, SupportedEncoding.q4_k, SupportedEncoding.q6_k, SupportedEncoding.q8_0)

# name, model class, example repos, default encoding, encodings, RoPE type
_FAMILIES: list[tuple[str, type, list[str], SupportedEncoding, tuple[SupportedEncoding, ...], RopeType]] = [
    (
        "LlamaForCausalLM",
        LlamaForCausalLM,
        ["meta-llama/Llama-3.2-1B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"],
        SupportedEncoding.bfloat16,
        _FLOAT + _GGUF,
        RopeType.normal,
    ),
    (
        "Qwen2ForCausalLM",
        LlamaForCausalLM,
        ["Qwen/Qwen2.5-0.5B-Instruct"],
        SupportedEncoding.bfloat16,
        _FLOAT,
        RopeType.neox,
    ),
    (
        "Qwen3ForCausalLM",
        LlamaForCausalLM,
        ["Qwen/Qwen3-0.6B", "Qwen/Qwen3-Embedding-0.6B"],
        SupportedEncoding.bfloat16,
        _FLOAT,
        RopeType.neox,
    ),
    (
        "MistralForCausalLM",
        LlamaForCausalLM,
        ["mistralai/Mistral-7B-Instruct-v0.3"],
        SupportedEncoding.bfloat16,
        _FLOAT,
        RopeType.normal,
    ),
    (
        "Phi3ForCausalLM",
        LlamaForCausalLM,
        ["microsoft/Phi-3-mini-4k-instruct"],
        SupportedEncoding.bfloat16,
        _FLOAT,
        RopeType.neox,
    ),
    ("GemmaForCausalLM", LlamaForCausalLM, ["google/gemma-2b-it"], SupportedEncoding.bfloat16, _FLOAT, RopeType.neox),
    ("GPT2LMHeadModel", GPT2LMHeadModel, ["openai-community/gpt2"], SupportedEncoding.float32, _FLOAT, RopeType.none),
]


def _text_generation(
    name: str,
    model: type,
    repos: list[str],
    default: SupportedEncoding,
    encodings: tuple[SupportedEncoding, ...],
    rope: RopeType,
) -> SupportedArchitecture:
    return SupportedArchitecture(
        name=name,
        example_repo_ids=list(repos),
        default_encoding=default,
        supported_encodings={e: [KVCacheStrategy.PAGED] for e in encodings},
        pipeline_model=model,
        task=PipelineTask.TEXT_GENERATION,
        tokenizer=TextTokenizer,
        default_weights_format=WeightsFormat.gguf if default in _GGUF else WeightsFormat.safetensors,
        rope_type=rope,
    )


def _embeddings(
    name: str,
    model: type,
    repos: list[str],
    default: SupportedEncoding,
    encodings: tuple[SupportedEncoding, ...],
    rope: RopeType,
) -> SupportedArchitecture:
    return SupportedArchitecture(
        name=name,
        example_repo_ids=list(repos),
        default_encoding=default,
        supported_encodings={e: [] for e in encodings},  # one forward per request: no KV cache
        pipeline_model=model,
        task=PipelineTask.EMBEDDINGS_GENERATION,
        tokenizer=TextTokenizer,
        default_weights_format=WeightsFormat.safetensors,
        rope_type=rope,
    )


TEXT_GENERATION_ARCHITECTURES: list[SupportedArchitecture] = [_text_generation(*family) for family in _FAMILIES]
"""The seven families for ``PipelineTask.TEXT_GENERATION``."""
EMBEDDINGS_ARCHITECTURES: list[SupportedArchitecture] = [_embeddings(*family) for family in _FAMILIES]
"""The same families for ``PipelineTask.EMBEDDINGS_GENERATION`` (decoder embeddings)."""
ARCHITECTURES: list[SupportedArchitecture] = TEXT_GENERATION_ARCHITECTURES + EMBEDDINGS_ARCHITECTURES
"""Every built-in record (the form ``custom_architectures`` modules use too)."""
