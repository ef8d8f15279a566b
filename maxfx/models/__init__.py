"""Pretrained causal language models as eager Modules: the Llama family (Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma) and
GPT-2.

`load_pretrained` reads a Hugging Face folder (``config.json`` with
safetensors or PyTorch ``.bin`` weights) or a llama.cpp ``.gguf`` file and
returns a Module tree: ``model(input_ids)`` gives logits ``[B, T, vocab]``,
``model.compile(model.input_types()[0])`` compiles it for any batch and
length, and ``model.generate(...)`` decodes with a KV cache.

Example:
    >>> from maxfx.models import load_pretrained
    >>> model = load_pretrained("tests/data/models/tiny_llama")  # doctest: +SKIP
    >>> model.generate([[5, 6, 7]], max_new_tokens=4)  # doctest: +SKIP
    array([[...]])
"""

from maxfx.models._config import ConfigError, GPT2Config, LlamaConfig
from maxfx.models._families import GemmaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config
from maxfx.models._generate import CausalLM, GenerationStats, compile_counts
from maxfx.models._gpt2 import GPT2GraphModel, GPT2LMHeadModel
from maxfx.models._llama import LlamaForCausalLM
from maxfx.models._llama_graph import LlamaGraphModel, load_pretrained_graph
from maxfx.models._loading import ARCHITECTURES, load_pretrained
from maxfx.models._paged import PagedCausalLM
from maxfx.models._source import CheckpointMismatchError
from maxfx.models._token_ids import TokenIdError
from maxfx.models._tokenizer import Tokenizer, TokenizerError

__all__ = [
    "ARCHITECTURES",
    "CausalLM",
    "CheckpointMismatchError",
    "ConfigError",
    "GPT2Config",
    "GPT2GraphModel",
    "GPT2LMHeadModel",
    "GemmaConfig",
    "GenerationStats",
    "LlamaConfig",
    "LlamaForCausalLM",
    "LlamaGraphModel",
    "MistralConfig",
    "PagedCausalLM",
    "Phi3Config",
    "Qwen2Config",
    "Qwen3Config",
    "TokenIdError",
    "Tokenizer",
    "TokenizerError",
    "compile_counts",
    "load_pretrained",
    "load_pretrained_graph",
]
