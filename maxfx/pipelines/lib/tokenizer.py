"""``max.pipelines.lib.tokenizer``: the tokenizers of MAX's pipeline layer.

- `TextTokenizer`: the default tokenizer of a text-generation pipeline. It loads a
  model's tokenizer (a Hugging Face folder's ``tokenizer.json``, or the byte-level BPE
  vocabulary in a ``.gguf`` file's metadata, through `maxfx.models.Tokenizer`), renders
  chat messages with the model's Jinja2 chat template, and turns a
  `~maxfx.interfaces.TextGenerationRequest` into a `~maxfx.generation.TextContext`
  (`new_context`): prompt tokens, the EOS set, the length budget, log-probability, echo
  and structured-output settings.
- `IdentityPipelineTokenizer`: strings in, strings out (for pipelines that take text).
- `PreTrainedPipelineTokenizer`: the async protocol around any Hugging Face-like
  tokenizer object (``encode`` / ``decode`` / ``apply_chat_template``).
- `TextAndVisionTokenizer`: MAX's tokenizer for vision-language models. maxfx has no
  vision encoders, so constructing one raises `NotImplementedError`.
- `max_tokens_to_generate`: the new-token budget rule; `run_with_default_executor`: run a
  blocking function in the event loop's default executor.

Where `TextTokenizer` finds the chat template, first match wins: the ``chat_template``
argument (a template string, or the path of a file holding one), the folder's
``chat_template.jinja``, its ``chat_template.json``, ``tokenizer_config.json``'s
``chat_template`` (a string, or Hugging Face's list of ``{"name", "template"}``, of which
``"default"`` is used), or a GGUF file's ``tokenizer.chat_template``.

Example:
    >>> import asyncio
    >>> from maxfx.interfaces import RequestID, SamplingParams, TextGenerationRequest
    >>> tok = TextTokenizer("tests/data/models/tiny_llama")
    >>> asyncio.run(tok.encode("hi")).tolist(), asyncio.run(tok.decode([104, 105]))
    ([104, 105], 'hi')
    >>> req = TextGenerationRequest(request_id=RequestID("r"), model_name="tiny", prompt="hello",
    ...                             sampling_params=SamplingParams(max_new_tokens=8))
    >>> ctx = asyncio.run(tok.new_context(req))
    >>> ctx.prompt_tokens.tolist(), ctx.max_length, sorted(ctx.eos_token_ids)
    ([104, 101, 108, 108, 111], 13, [2])
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from maxfx._json_file import read_json_file
from maxfx.generation import TextContext
from maxfx.graph.weights import GGUFWeights
from maxfx.interfaces import PipelineTokenizer
from maxfx.models._tokenizer import load_tokenizer
from maxfx.pipelines.lib.hf_utils import generate_local_model_path

__all__ = [
    "IdentityPipelineTokenizer",
    "PreTrainedPipelineTokenizer",
    "TextAndVisionTokenizer",
    "TextTokenizer",
    "max_tokens_to_generate",
    "run_with_default_executor",
]

logger = logging.getLogger("max.pipelines")

# Hugging Face's "no limit" model_max_length (transformers' VERY_LARGE_INTEGER = int(1e30)).
_NO_LIMIT = int(1e29)
# Prompts longer than this (in characters) are tokenized in the default executor, so a
# server's event loop keeps running while a long prompt is encoded.
_EXECUTOR_CHARS = 16384
# Tokenizer classes MAX applies the Llama whitespace fix to.
_LLAMA_TOKENIZERS = frozenset({"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"})
_WHITESPACE_FIX_TOKEN = 33  # the dummy token MAX prepends (b"\x1e" in Llama's vocabulary)
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


# ─── module functions ─────────────────────────────────────────────────────────


def max_tokens_to_generate(prompt_size: int, max_length: int | None, max_new_tokens: int | None = None) -> int | None:
    """The number of new tokens a request may generate.

    ``max_length - prompt_size`` (never below 0) when ``max_new_tokens`` is None, else the
    smaller of the two; with no ``max_length``, ``max_new_tokens`` as given.

    Example:
        >>> max_tokens_to_generate(10, 128), max_tokens_to_generate(10, 128, 16), max_tokens_to_generate(120, 128, 16)
        (118, 16, 8)
        >>> max_tokens_to_generate(10, None, 16), max_tokens_to_generate(200, 128)
        (16, 0)
    """
    if max_length is None:
        return max_new_tokens
    room = max(max_length - prompt_size, 0)
    if max_new_tokens is None:
        return room
    return min(max_new_tokens, room)


async def run_with_default_executor[R](fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)`` run in the running event loop's default executor (a thread pool).

    Example:
        >>> import asyncio
        >>> asyncio.run(run_with_default_executor(sorted, [3, 1, 2], reverse=True))
        [3, 2, 1]
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


def _bad_ids_message(encoded: Any, vocab_size: int) -> str:
    """What is wrong with token ids that do not decode: which entries are negative or past the vocabulary."""
    arr = np.asarray(encoded).reshape(-1)
    issues = []
    if arr.size and np.issubdtype(arr.dtype, np.integer):
        high = np.nonzero(arr >= vocab_size)[0]
        low = np.nonzero(arr < 0)[0]
        if high.size:
            issues.append(
                f"token ids exceeding the vocabulary size ({vocab_size}) at indices {high.tolist()}: "
                f"{arr[high].tolist()}"
            )
        if low.size:
            issues.append(f"negative token ids at indices {low.tolist()}: {arr[low].tolist()}")
    detail = "; ".join(issues) if issues else f"token ids {arr.tolist()}"
    return (
        f"invalid token ids to decode: {detail} (vocabulary size {vocab_size}, shape {list(np.shape(encoded))}, "
        f"dtype {np.asarray(encoded).dtype})"
    )


# ─── IdentityPipelineTokenizer ────────────────────────────────────────────────


class IdentityPipelineTokenizer(PipelineTokenizer):
    """A pass-through tokenizer: `encode` returns the prompt string, `decode` returns its input string.

    For pipelines whose model takes text directly. ``eos`` is 0 and no content wrapping
    is expected, as in MAX.

    Example:
        >>> import asyncio
        >>> tok = IdentityPipelineTokenizer()
        >>> asyncio.run(tok.encode("hello")), asyncio.run(tok.decode("hello")), asyncio.run(tok.decode([1, 2]))
        ('hello', 'hello', '')
    """

    @property
    def eos(self) -> int:
        """The end-of-sequence id: 0 (there are no token ids)."""
        return 0

    @property
    def expects_content_wrapping(self) -> bool:
        """False: chat content parts are not rewritten for this tokenizer."""
        return False

    async def encode(self, prompt: str, add_special_tokens: bool = False) -> str:
        """The prompt itself (``add_special_tokens`` has no effect)."""
        return prompt

    async def decode(self, encoded: str, **kwargs: Any) -> str:
        """``encoded`` when it is a string, else the empty string."""
        if isinstance(encoded, str):
            return encoded
        return ""


# ─── PreTrainedPipelineTokenizer ──────────────────────────────────────────────


class PreTrainedPipelineTokenizer(PipelineTokenizer):
    """The async tokenizer protocol around a Hugging Face-like tokenizer object.

    Args:
        delegate: any object with ``encode(text, add_special_tokens=...)`` and
            ``decode(ids, **kwargs)`` (a ``transformers`` tokenizer, a
            `maxfx.models.Tokenizer`, ...); `apply_chat_template` also needs its
            ``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``.

    Raises:
        TypeError: ``delegate`` lacks ``encode`` or ``decode``.

    Note: ``add_special_tokens`` of `encode` is passed to the delegate (MAX's own
    implementation drops it and always lets the delegate add its special tokens).

    Example:
        >>> import asyncio
        >>> from maxfx.models import Tokenizer
        >>> tok = PreTrainedPipelineTokenizer(Tokenizer.from_file("tests/data/models/tiny_llama/tokenizer.json"))
        >>> ids = asyncio.run(tok.encode("hi"))
        >>> ids.tolist(), asyncio.run(tok.decode(ids))
        ([104, 105], 'hi')
    """

    def __init__(self, delegate: Any) -> None:
        for method in ("encode", "decode"):
            if not callable(getattr(delegate, method, None)):
                raise TypeError(
                    f"PreTrainedPipelineTokenizer: the delegate ({type(delegate).__name__}) has no {method}() method; "
                    "pass a tokenizer object (transformers or maxfx.models.Tokenizer)"
                )
        self.delegate = delegate

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        """The delegate's chat template rendered for ``messages``, with the generation prompt, as a string.

        Raises:
            ValueError: the delegate has no ``apply_chat_template``.
        """
        apply = getattr(self.delegate, "apply_chat_template", None)
        if not callable(apply):
            raise ValueError(
                f"PreTrainedPipelineTokenizer.apply_chat_template: the delegate ({type(self.delegate).__name__}) has "
                "no apply_chat_template(); use TextTokenizer for chat templates"
            )
        templated = apply(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(templated, str):
            raise TypeError(
                f"PreTrainedPipelineTokenizer.apply_chat_template: the delegate returned {type(templated).__name__}, "
                "expected a str"
            )
        return templated

    @property
    def eos(self) -> int:
        """The delegate's ``eos_token_id`` (else the first of its ``eos_token_ids``; None when it has neither)."""
        eos = getattr(self.delegate, "eos_token_id", None)
        if eos is None:
            ids = tuple(getattr(self.delegate, "eos_token_ids", ()) or ())
            eos = ids[0] if ids else None
        return eos  # type: ignore[return-value]

    @property
    def expects_content_wrapping(self) -> bool:
        """False: chat content parts are not rewritten for this tokenizer."""
        return False

    async def encode(self, prompt: str, add_special_tokens: bool = False) -> np.ndarray:
        """The delegate's token ids of ``prompt`` as an int64 array."""
        return np.asarray(self.delegate.encode(prompt, add_special_tokens=add_special_tokens), dtype=np.int64)

    async def decode(self, encoded: Any, **kwargs: Any) -> str:
        """The delegate's text of the ids ``encoded`` (``kwargs`` go to its ``decode``).

        Raises:
            OverflowError: the delegate overflowed (ids past its vocabulary or negative;
                the message names the offending entries).
        """
        try:
            return self.delegate.decode(encoded, **kwargs)
        except OverflowError as e:
            raise OverflowError(_bad_ids_message(encoded, _vocab_size(self.delegate))) from e


def _vocab_size(delegate: Any) -> int:
    size = getattr(delegate, "vocab_size", None)
    if isinstance(size, int):
        return size
    try:
        return len(delegate)
    except TypeError:
        return -1


# ─── chat templates ───────────────────────────────────────────────────────────


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:  # noqa: A002 - the name Hugging Face templates call it with
    return datetime.datetime.now().strftime(format)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Hugging Face's tojson: no HTML escaping, unicode kept (jinja's own filter escapes <, >, &, ').
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationBlock(Extension):
    """``{% generation %}...{% endgeneration %}`` (Hugging Face's assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


@functools.lru_cache(maxsize=64)
def _compile_template(template: str) -> Any:
    """The template compiled as Hugging Face compiles chat templates (sandboxed, trim/lstrip blocks, loop controls)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def _template_from_argument(value: str | os.PathLike[str]) -> str:
    """A ``chat_template`` argument: a Jinja template string, or the path of a file holding one."""
    if isinstance(value, os.PathLike):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"TextTokenizer: chat_template file {str(path)!r} does not exist")
        return path.read_text(encoding="utf-8")
    if not isinstance(value, str):
        raise TypeError(
            f"TextTokenizer: chat_template must be a template string or a file path, got {type(value).__name__}"
        )
    if "\n" not in value and len(value) < 4096:
        try:
            path = Path(value).expanduser()
            if path.is_file():
                return path.read_text(encoding="utf-8")
        except OSError:
            pass
    if "{" not in value:
        raise ValueError(
            f"TextTokenizer: chat_template={value!r} is neither a Jinja template (no '{{{{' or '{{%') nor an existing "
            "file"
        )
    return value


def _template_from_config(value: Any, where: str) -> str | None:
    """``chat_template`` of tokenizer_config.json / chat_template.json: a string, or a list of named templates
    ("default" is used).
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" in named and isinstance(named["default"], str):
            return named["default"]
        raise ValueError(
            f"TextTokenizer: {where} has several chat templates ({', '.join(map(str, named))}) and none is named "
            "'default'; pass chat_template= to choose one"
        )
    raise ValueError(
        f"TextTokenizer: {where}'s chat_template must be a string or a list of {{'name', 'template'}}, got "
        f"{type(value).__name__}"
    )


def _token_text(value: Any) -> str | None:
    """A special token of tokenizer_config.json: a string, or an AddedToken dict with ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _id_list(value: Any) -> list[int]:
    """An ``eos_token_id`` of a config: an int, a list of ints, or absent."""
    if value is None:
        return []
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return [int(value)]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if isinstance(v, (int, np.integer)) and not isinstance(v, bool)]
    return []


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = read_json_file(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"TextTokenizer: {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"TextTokenizer: {path} must hold a JSON object, got {type(data).__name__}")
    return data


def _gguf_fields(path: Path, keys: Sequence[str]) -> dict[str, Any]:
    """The values of the GGUF metadata ``keys`` present in ``path`` (strings decoded)."""
    fields = GGUFWeights(str(path)).reader.fields
    out: dict[str, Any] = {}
    arch = fields["general.architecture"].contents() if "general.architecture" in fields else None
    for key in keys:
        key = key.replace("{arch}", str(arch))
        if key in fields:
            try:
                out[key] = fields[key].contents()
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"TextTokenizer: {path}: {key} holds a string that is not valid UTF-8 ({e.reason} at byte "
                    f"{e.start})"
                ) from None
    out["general.architecture"] = arch
    return out


def _hf_config_eos(pipeline_config: Any) -> list[int]:
    """``eos_token_id`` of ``pipeline_config.model_config.huggingface_config`` (an object or a dict), when present."""
    model_config = getattr(pipeline_config, "model_config", None)
    hf = getattr(model_config, "huggingface_config", None) if model_config is not None else None
    if hf is None:
        return []
    value = hf.get("eos_token_id") if isinstance(hf, dict) else getattr(hf, "eos_token_id", None)
    return _id_list(value)


# ─── TextTokenizer ────────────────────────────────────────────────────────────


class TextTokenizer(PipelineTokenizer):
    """The default text tokenizer: chat template, async encode/decode, and `new_context` for text generation.

    Args:
        model_path: a local Hugging Face folder (``tokenizer.json``; optional
            ``tokenizer_config.json``, ``config.json``, ``generation_config.json``,
            ``chat_template.jinja``), a ``.gguf`` file (its ``tokenizer.ggml.*``
            vocabulary), or a repo id whose snapshot is in the Hugging Face cache
            (maxfx reads offline only).
        revision: the cache revision of a repo id (a branch with a ref, or a commit);
            unused for local paths.
        max_length: the longest sequence (prompt + generated tokens). None: the model's
            ``max_position_embeddings`` (config.json; ``<arch>.context_length`` for a GGUF
            file), else ``tokenizer_config.json``'s ``model_max_length``.
        trust_remote_code: accepted for MAX compatibility; maxfx never runs a model's code.
        enable_llama_whitespace_fix: decode single tokens of a Llama SentencePiece
            tokenizer (``tokenizer_class`` ``LlamaTokenizer[Fast]`` / ``CodeLlamaTokenizer[Fast]``)
            with a dummy token in front, so a leading space is not stripped.
        pipeline_config: a ``PipelineConfig``; the ``eos_token_id`` of its
            ``model_config.huggingface_config`` joins the EOS set.
        chat_template: a Jinja chat template, or the path of a file holding one,
            overriding the model's.
        context_validators: callables run on every new `TextContext` (they raise to reject it).
        subfolder: the folder inside ``model_path`` holding the tokenizer files.
        **unused_kwargs: other keywords the registry passes; ignored.

    Raises:
        ValueError: no tokenizer at ``model_path`` (the message says why), a malformed
            config file, or a ``chat_template`` that is neither a template nor a file.

    Example:
        >>> import asyncio
        >>> tok = TextTokenizer("tests/data/models/tiny_llama",
        ...     chat_template="{% for m in messages %}{{ m.role }}: {{ m.content }}\\n{% endfor %}")
        >>> tok.apply_chat_template([{"role": "user", "content": "hi"}])
        'user: hi\\n'
        >>> tok.max_length, tok.eos
        (128, 2)
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        revision: str | None = None,
        max_length: int | None = None,
        trust_remote_code: bool = False,
        enable_llama_whitespace_fix: bool = False,
        pipeline_config: Any = None,
        chat_template: str | os.PathLike[str] | None = None,
        context_validators: list[Callable[[Any], None]] | None = None,
        subfolder: str | None = None,
        **unused_kwargs: Any,
    ) -> None:
        self.model_path = str(model_path)
        source = self._resolve_path(model_path, revision, subfolder)
        self._is_gguf = source.is_file()
        try:
            delegate, why = load_tokenizer(source)
        except (ValueError, OSError) as e:
            raise ValueError(f"Failed to load tokenizer from {self.model_path}: {e}") from e
        if delegate is None:
            raise ValueError(f"Failed to load tokenizer from {self.model_path}: {why}")
        self.delegate = delegate
        self._source = source

        tok_config: dict[str, Any] = {}
        model_config: dict[str, Any] = {}
        gen_config: dict[str, Any] = {}
        template: str | None = None
        template_source = ""
        if self._is_gguf:
            meta = _gguf_fields(
                source,
                (
                    "tokenizer.chat_template",
                    "{arch}.context_length",
                    "tokenizer.ggml.eot_token_id",
                    "tokenizer.ggml.eom_token_id",
                    "tokenizer.ggml.bos_token_id",
                ),
            )
            arch = meta["general.architecture"]
            context_length = meta.get(f"{arch}.context_length")
            if context_length is not None:
                model_config["max_position_embeddings"] = int(context_length)
            gguf_eos = (
                list(delegate.eos_token_ids)
                + _id_list(meta.get("tokenizer.ggml.eot_token_id"))
                + _id_list(meta.get("tokenizer.ggml.eom_token_id"))
            )
            bos_id = meta.get("tokenizer.ggml.bos_token_id")
            self._bos_token = delegate.backend.id_to_token(int(bos_id)) if bos_id is not None else None
            self._eos_token = (
                delegate.backend.id_to_token(delegate.eos_token_ids[0]) if delegate.eos_token_ids else None
            )
            self._extra_tokens: dict[str, str] = {}
            if isinstance(meta.get("tokenizer.chat_template"), str):
                template, template_source = meta["tokenizer.chat_template"], f"{source}: tokenizer.chat_template"
        else:
            folder = source
            tok_config = _read_json(folder / "tokenizer_config.json")
            special_map = _read_json(folder / "special_tokens_map.json")
            model_config = _read_json(folder / "config.json")
            gen_config = _read_json(folder / "generation_config.json")
            gguf_eos = []

            def special(name: str) -> str | None:
                text = _token_text(tok_config.get(name))
                return text if text is not None else _token_text(special_map.get(name))

            self._bos_token, self._eos_token = special("bos_token"), special("eos_token")
            self._extra_tokens = {
                n: t
                for n in ("unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
                if (t := special(n)) is not None
            }
            jinja_file, json_file = folder / "chat_template.jinja", folder / "chat_template.json"
            if jinja_file.is_file():
                template, template_source = jinja_file.read_text(encoding="utf-8"), str(jinja_file)
            elif (
                json_file.is_file()
                and (t := _template_from_config(_read_json(json_file).get("chat_template"), str(json_file))) is not None
            ):
                template, template_source = t, str(json_file)
            elif (
                t := _template_from_config(tok_config.get("chat_template"), str(folder / "tokenizer_config.json"))
            ) is not None:
                template, template_source = t, f"{folder / 'tokenizer_config.json'}: chat_template"

        # A chat template given here overrides the model's.
        self._custom_template_provided = chat_template is not None
        if chat_template is not None:
            template, template_source = _template_from_argument(chat_template), "the chat_template argument"
        self.chat_template: str | None = template
        """The Jinja chat template in use (None: the model has none)."""
        self.chat_template_source: str = template_source
        """Where `chat_template` came from (a file and key, or ``"the chat_template argument"``)."""

        # The EOS id: the tokenizer's own (tokenizer_config's eos_token / the GGUF EOS), else the model configs'.
        eos_id: int | None = None
        if self._eos_token is not None:
            eos_id = delegate.backend.token_to_id(self._eos_token)
        config_eos = (
            _id_list(gen_config.get("eos_token_id"))
            + _id_list(model_config.get("eos_token_id"))
            + _hf_config_eos(pipeline_config)
        )
        if eos_id is None:
            candidates = gguf_eos + config_eos
            eos_id = candidates[0] if candidates else None
        self._eos: int | None = eos_id
        self._default_eos_token_ids: set[int] = {i for i in [eos_id, *gguf_eos, *config_eos] if i is not None}

        # max_length: the argument, else the model's context, else tokenizer_config's model_max_length.
        if max_length is None:
            max_length = getattr(pipeline_config, "max_length", None)
        if max_length is None:
            mpe = model_config.get("max_position_embeddings")
            mml = tok_config.get("model_max_length")
            if isinstance(mpe, int) and mpe > 0:
                max_length = mpe
            elif isinstance(mml, (int, float)) and 0 < mml < _NO_LIMIT:
                max_length = int(mml)
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1
        ):
            raise ValueError(f"TextTokenizer: max_length must be a positive int or None, got {max_length!r}")
        self.max_length: int | None = None if max_length is None else int(max_length)

        self._enable_llama_whitespace_fix = (
            bool(enable_llama_whitespace_fix)
            and tok_config.get("tokenizer_class") in _LLAMA_TOKENIZERS
            and delegate.vocab_size > _WHITESPACE_FIX_TOKEN
        )
        self._whitespace_fix_len = (
            len(delegate.decode([_WHITESPACE_FIX_TOKEN])) if self._enable_llama_whitespace_fix else 0
        )
        self._context_validators = list(context_validators) if context_validators else []
        del trust_remote_code, unused_kwargs

    @staticmethod
    def _resolve_path(model_path: str | os.PathLike[str], revision: str | None, subfolder: str | None) -> Path:
        path = Path(model_path).expanduser()
        if not path.exists() and isinstance(model_path, str) and _REPO_ID.match(model_path):
            try:
                path = Path(generate_local_model_path(model_path, revision or "main"))
            except FileNotFoundError as e:
                raise ValueError(f"Failed to load tokenizer from {model_path}: {e}") from e
        if subfolder:
            path = path / subfolder
        if path.is_dir():
            return path
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ValueError(
                    f"Failed to load tokenizer from {model_path}: {str(path)!r} is a file but not .gguf; pass a folder "
                    "with tokenizer.json or a .gguf file"
                )
            return path
        raise ValueError(
            f"Failed to load tokenizer from {model_path}: {str(path)!r} does not exist (pass a local folder with "
            "tokenizer.json, a .gguf file, or a repo id in the Hugging Face cache)"
        )

    # ── properties ──
    @property
    def eos(self) -> int:
        """The end-of-sequence token id (tokenizer_config's ``eos_token`` / the GGUF EOS, else the model configs' first
        ``eos_token_id``; None when none names one).
        """
        return self._eos  # type: ignore[return-value]

    @property
    def expects_content_wrapping(self) -> bool:
        """False: chat messages' text parts are joined into one string before the template sees them."""
        return False

    # ── chat template ──
    @staticmethod
    def _flatten_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
        """Messages as the template sees them: content a string (text parts joined with newlines), other keys kept."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
        flat: list[dict[str, Any]] = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise ValueError(
                    f"messages[{i}] must be a dict with 'role' and 'content', got {type(message).__name__}"
                )
            if not isinstance(message.get("role"), str):
                raise ValueError(
                    f"messages[{i}] has no 'role'"
                    if "role" not in message
                    else f"messages[{i}]['role'] must be a str, got {type(message['role']).__name__}"
                )
            content = message.get("content")
            if isinstance(content, list):
                texts = []
                for j, part in enumerate(content):
                    if not isinstance(part, dict) or "type" not in part:
                        raise ValueError(
                            f"messages[{i}]['content'][{j}]: malformed message content, missing 'type' field"
                        )
                    if part["type"] != "text":
                        raise ValueError(
                            f"messages[{i}]['content'][{j}]: unsupported content type {part['type']!r} (TextTokenizer "
                            "takes text parts only)"
                        )
                    text = part.get("text", part.get("content"))
                    if not isinstance(text, str):
                        raise ValueError(f"messages[{i}]['content'][{j}]: a text part needs a string 'text' field")
                    texts.append(text)
                content = "\n".join(texts)
            elif content is None:
                if not message.get("tool_calls"):
                    raise ValueError(f"messages[{i}] has no 'content'")
            elif not isinstance(content, str):
                raise ValueError(
                    f"messages[{i}]['content'] must be a str or a list of text parts, got {type(content).__name__}"
                )
            flat.append({**message, "content": content})
        return flat

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template_options: dict[str, Any] | None = None,
    ) -> str:
        """``messages`` (and ``tools``) rendered with the model's chat template, as Hugging Face renders it.

        The template sees ``messages`` (content parts joined into a string), ``tools``,
        ``add_generation_prompt`` (True unless ``chat_template_options`` says otherwise),
        ``bos_token`` / ``eos_token`` (and the other special tokens tokenizer_config names),
        the ``raise_exception`` and ``strftime_now`` helpers and Hugging Face's ``tojson``
        filter; every other key of ``chat_template_options`` becomes a template variable
        (e.g. ``enable_thinking``). ``continue_final_message=True`` ends the text right after
        the last message's content (for prefilling the assistant's answer).

        Raises:
            ValueError: the model has no chat template, a malformed message, or the
                template failed (e.g. its ``raise_exception``).
        """
        if self.chat_template is None:
            where = (
                "the GGUF metadata has no tokenizer.chat_template"
                if self._is_gguf
                else "no chat_template.jinja, chat_template.json, or chat_template in tokenizer_config.json"
            )
            raise ValueError(
                f"TextTokenizer.apply_chat_template: the model at {self.model_path} has no chat template ({where}). "
                "Pass one with TextTokenizer(..., chat_template=<template string or file path>) "
                "(PipelineConfig(chat_template=<file>)), "
                "or send a completion prompt instead of chat messages"
            )
        options = dict(chat_template_options or {})
        continue_final = bool(options.pop("continue_final_message", False))
        add_generation_prompt = bool(options.pop("add_generation_prompt", not continue_final))
        if continue_final and add_generation_prompt:
            raise ValueError(
                "TextTokenizer.apply_chat_template: continue_final_message and add_generation_prompt cannot both be set"
            )
        flat = self._flatten_messages(messages)
        variables: dict[str, Any] = dict(self._extra_tokens)
        if self._bos_token is not None:
            variables["bos_token"] = self._bos_token
        if self._eos_token is not None:
            variables["eos_token"] = self._eos_token
        variables.update(options)
        variables.update(messages=flat, tools=tools, add_generation_prompt=add_generation_prompt)
        try:
            rendered = _compile_template(self.chat_template).render(**variables)
        except TemplateError as e:
            hint = (
                " Check the template's syntax and that it handles these messages and tools (it sees messages, tools, "
                "add_generation_prompt)."
                if self._custom_template_provided
                else ""
            )
            raise ValueError(
                f"TextTokenizer.apply_chat_template: the chat template ({self.chat_template_source}) failed: "
                f"{type(e).__name__}: {e}.{hint}"
            ) from e
        if continue_final:
            if not flat or not isinstance(flat[-1]["content"], str):
                raise ValueError(
                    "TextTokenizer.apply_chat_template: continue_final_message needs a final message with content"
                )
            final = flat[-1]["content"]
            end = rendered.rfind(final) if final else -1
            if end < 0 and final.strip():
                final = final.strip()
                end = rendered.rfind(final)
            if end < 0:
                raise ValueError(
                    "TextTokenizer.apply_chat_template: continue_final_message is set but the final message does not "
                    "appear in the rendered chat"
                )
            rendered = rendered[: end + len(final)]
        return rendered

    # ── encode / decode ──
    async def _encode_text(self, prompt: str, add_special_tokens: bool) -> np.ndarray:
        if len(prompt) > _EXECUTOR_CHARS:
            ids = await run_with_default_executor(self.delegate.encode, prompt, add_special_tokens=add_special_tokens)
        else:
            ids = self.delegate.encode(prompt, add_special_tokens=add_special_tokens)
        return np.asarray(ids, dtype=np.int64)

    async def encode(self, prompt: str | Sequence[int], add_special_tokens: bool = True) -> np.ndarray:
        """The token ids of ``prompt`` as an int64 array (token ids given instead of text are returned as an array).

        Raises:
            ValueError: the text encodes to more than ``max_length`` tokens.
            TypeError: ``prompt`` is neither a string nor a sequence of ints.
        """
        if isinstance(prompt, str):
            ids = await self._encode_text(prompt, add_special_tokens)
            if self.max_length is not None and len(ids) > self.max_length:
                raise ValueError(
                    f"Input string is larger than tokenizer's max length ({len(ids)} > {self.max_length})."
                )
            return ids
        arr = np.asarray(list(prompt) if not isinstance(prompt, np.ndarray) else prompt)
        if arr.size == 0:
            return arr.astype(np.int64).reshape(0)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(
                f"TextTokenizer.encode: prompt must be a str or a 1-D sequence of int token ids, got {arr.dtype} of "
                f"shape {list(arr.shape)}"
            )
        return arr.astype(np.int64)

    async def decode(self, encoded: Any, **kwargs: Any) -> str:
        """The text of the token ids ``encoded`` (an array, a list, or one int).

        ``skip_special_tokens`` (default False, as Hugging Face's) drops special tokens;
        other keywords are accepted and ignored.

        Raises:
            ValueError: ids negative or past the vocabulary (the message names them).
        """
        skip = bool(kwargs.get("skip_special_tokens", False))
        arr = np.asarray(encoded)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        try:
            if self._enable_llama_whitespace_fix and arr.size == 1:
                text = self.delegate.decode([_WHITESPACE_FIX_TOKEN, *arr.tolist()], skip_special_tokens=skip)
                return text[self._whitespace_fix_len :]
            return self.delegate.decode(arr, skip_special_tokens=skip)
        except ValueError as e:
            raise ValueError(f"TextTokenizer.decode: {_bad_ids_message(arr, self.delegate.vocab_size)}") from e

    # ── contexts ──
    async def _prompt_tokens(self, request: Any) -> tuple[str, np.ndarray]:
        """(the request field the tokens came from, the prompt's token ids)."""
        prompt, messages = request.prompt, request.messages
        has_prompt = prompt is not None and len(prompt) > 0
        if has_prompt and messages:
            raise ValueError("TextTokenizer.new_context: both prompt and messages were given; pass one")
        if messages is not None and not has_prompt:
            if len(messages) == 0:
                raise ValueError("TextTokenizer.new_context: messages is empty")
            text = self.apply_chat_template(messages, request.tools, request.chat_template_options)
            return "messages", await self._encode_text(text, add_special_tokens=False)
        if prompt is None:
            raise ValueError(
                "TextTokenizer.new_context: the request has no prompt and no messages (give prompt as a str or token "
                "ids, or messages)"
            )
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("TextTokenizer.new_context: prompt is empty")
            return "prompt", await self._encode_text(prompt, add_special_tokens=True)
        ids = await self.encode(prompt)
        if ids.size == 0:
            raise ValueError("TextTokenizer.new_context: prompt is empty (no token ids)")
        vocab = self.delegate.vocab_size
        bad = np.nonzero((ids < 0) | (ids >= vocab))[0]
        if bad.size:
            raise ValueError(
                f"TextTokenizer.new_context: prompt token ids must be in [0, {vocab}); got {ids[bad].tolist()} at "
                f"positions {bad.tolist()}"
            )
        return "prompt", ids

    @staticmethod
    def _json_schema(response_format: Any) -> str | None:
        if not response_format:
            return None
        if not isinstance(response_format, dict):
            raise ValueError(
                "TextTokenizer.new_context: response_format must be a dict with a 'type', got "
                f"{type(response_format).__name__}"
            )
        kind = response_format.get("type")
        if kind == "json_schema":
            schema = response_format.get("json_schema")
            if not isinstance(schema, dict):
                raise ValueError(
                    "TextTokenizer.new_context: response_format of type 'json_schema' needs a 'json_schema' object"
                )
            # OpenAI's shape wraps the schema: {"name": ..., "schema": {...}, "strict": ...}.
            inner = schema.get("schema") if isinstance(schema.get("schema"), dict) else schema
            return json.dumps(inner)
        if kind == "json_object":
            return json.dumps({"type": "object"})
        if kind in (None, "text"):
            return None
        raise ValueError(
            "TextTokenizer.new_context: response_format.type must be 'text', 'json_object' or 'json_schema', got "
            f"{kind!r}"
        )

    async def _eos_variables(self, sampling_params: Any, request_stop: Any) -> tuple[set[int], list[list[int]]]:
        if sampling_params.ignore_eos:
            return set(), []
        eos_token_ids = set(self._default_eos_token_ids)
        eos_token_ids.update(int(t) for t in sampling_params.stop_token_ids or ())
        stops: list[str] = []
        for source in (sampling_params.stop, request_stop):
            for s in [source] if isinstance(source, str) else source or ():
                if s and s not in stops:
                    stops.append(s)
        sequences = [(await self._encode_text(s, add_special_tokens=False)).tolist() for s in stops]
        return eos_token_ids, [s for s in sequences if s]

    async def new_context(self, request: Any) -> Any:
        """A `~maxfx.generation.TextContext` for a `~maxfx.interfaces.TextGenerationRequest`.

        - ``prompt`` text is encoded with special tokens; token ids are used as given;
          ``messages`` are rendered with `apply_chat_template` (``tools``,
          ``chat_template_options``) and encoded without special tokens (the template
          writes BOS itself).
        - EOS ids: the tokenizer's EOS, ``eos_token_id`` of config.json and
          generation_config.json (an int or a list) and of the pipeline config, plus
          ``sampling_params.stop_token_ids``; the stop strings (``sampling_params.stop``
          and ``request.stop``) become ``eos_sequences``. With ``ignore_eos`` both are empty.
        - ``max_length`` of the context: prompt length + `max_tokens_to_generate`, i.e.
          the tokenizer's ``max_length``, or less when ``max_new_tokens`` asks for less.
        - ``log_probabilities`` = ``request.logprobs``, ``log_probabilities_echo`` =
          ``request.echo``; ``json_schema`` from ``response_format`` (``json_schema``: its
          schema as JSON text; ``json_object``: ``{"type": "object"}``).
        - the ``context_validators`` run on the context last.

        Raises:
            ValueError: no prompt and no messages, an empty prompt, token ids outside the
                vocabulary, a malformed message, no chat template for messages, a prompt of
                ``max_length`` tokens or more ("prompt has N tokens, max_length is M"),
                ``max_new_tokens=0``, an unknown ``response_format`` type, or no
                ``max_length`` known at all.
        """
        field, ids = await self._prompt_tokens(request)
        n = int(ids.shape[0])
        if n == 0:
            raise ValueError(f"TextTokenizer.new_context: {field} encodes to 0 tokens")
        if self.max_length is not None and n >= self.max_length:
            raise ValueError(
                f"TextTokenizer.new_context: {field} is too long: prompt has {n} tokens, max_length is "
                f"{self.max_length} (at least one token must be left to generate)"
            )
        sampling_params = request.sampling_params
        budget = max_tokens_to_generate(n, self.max_length, sampling_params.max_new_tokens)
        if budget is None:
            raise ValueError(
                f"TextTokenizer.new_context: no max_length is known for {self.model_path}; pass TextTokenizer(..., "
                "max_length=N) or set sampling_params.max_new_tokens"
            )
        if budget == 0:
            raise ValueError(
                "TextTokenizer.new_context: sampling_params.max_new_tokens is 0; at least one token must be generated"
            )
        json_schema = self._json_schema(request.response_format)
        eos_token_ids, eos_sequences = await self._eos_variables(sampling_params, getattr(request, "stop", None))
        context = TextContext(
            request_id=request.request_id,
            max_length=n + budget,
            tokens=ids,
            eos_token_ids=eos_token_ids,
            eos_sequences=eos_sequences,
            log_probabilities=request.logprobs,
            log_probabilities_echo=request.echo,
            json_schema=json_schema,
            sampling_params=sampling_params,
            model_name=request.model_name,
            ignore_eos=sampling_params.ignore_eos,
            target_endpoint=request.target_endpoint,
        )
        for validator in self._context_validators:
            validator(context)
        return context


# ─── TextAndVisionTokenizer ───────────────────────────────────────────────────

_NO_VISION = (
    "vision-language models are not supported by maxfx: it has no vision encoders (no image processor, no vision "
    "tower, no TextAndVisionContext), so images cannot be turned into model inputs. Serve a text-only model with "
    "TextTokenizer"
)


def _vision_unsupported(member: str) -> NotImplementedError:
    return NotImplementedError(f"TextAndVisionTokenizer.{member}: {_NO_VISION}")


class TextAndVisionTokenizer(PipelineTokenizer):
    """MAX's tokenizer for vision-language models (text + an image processor, building ``TextAndVisionContext``).

    Not available in maxfx: it has no vision encoders, so there is nothing to turn
    images into model inputs. Constructing one raises `NotImplementedError` saying so;
    the members below keep MAX's names and signatures.

    Args:
        model_path: the model's folder or repo id.
        revision: the repo revision.
        max_length: the longest sequence.
        trust_remote_code: run the model's own processor code.
        pipeline_config: the ``PipelineConfig``.
        context_validators: callables run on every new context.
        **unused_kwargs: ignored.

    Raises:
        NotImplementedError: always.

    Example:
        >>> TextAndVisionTokenizer("some/vlm")
        Traceback (most recent call last):
        NotImplementedError: TextAndVisionTokenizer: vision-language models are not supported by maxfx: ...
    """

    def __init__(
        self,
        model_path: str,
        *,
        revision: str | None = None,
        max_length: int | None = None,
        trust_remote_code: bool = False,
        pipeline_config: Any = None,
        context_validators: list[Callable[[Any], None]] | None = None,
        **unused_kwargs: Any,
    ) -> None:
        raise NotImplementedError(f"TextAndVisionTokenizer: {_NO_VISION} (model_path={model_path!r})")

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> str:
        """MAX: the processor's chat template for messages with image parts. maxfx: raises `NotImplementedError`."""
        raise _vision_unsupported("apply_chat_template")

    @property
    def eos(self) -> int:
        """MAX: the EOS id of the text tokenizer. maxfx: raises `NotImplementedError`."""
        raise _vision_unsupported("eos")

    @property
    def expects_content_wrapping(self) -> bool:
        """True, as in MAX: a vision processor takes content parts in their wrapped form."""
        return True

    async def encode(self, prompt: str | Sequence[int], add_special_tokens: bool = True) -> np.ndarray:
        """MAX: the prompt's token ids. maxfx: raises `NotImplementedError`."""
        raise _vision_unsupported("encode")

    async def decode(self, encoded: Any, **kwargs: Any) -> str:
        """MAX: the text of token ids. maxfx: raises `NotImplementedError`."""
        raise _vision_unsupported("decode")

    async def new_context(self, request: Any) -> Any:
        """MAX: a ``TextAndVisionContext`` (tokens + processed images) for a request. maxfx: raises
        `NotImplementedError`.
        """
        raise _vision_unsupported("new_context")
