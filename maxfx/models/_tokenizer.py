"""`Tokenizer`: text <-> token ids for `maxfx.models`, backed by the Hugging Face ``tokenizers`` library.

Two sources:

* a Hugging Face folder's ``tokenizer.json`` (`Tokenizer.from_file`), read as is
  by the library, so encoding and decoding match ``transformers``' fast tokenizers;
* the metadata of a llama.cpp ``.gguf`` file (`Tokenizer.from_gguf`) holding a
  byte-level BPE vocabulary (``tokenizer.ggml.model = "gpt2"``: tokens, merges,
  token types, BOS/EOS ids), rebuilt as the same library's BPE model with the
  pre-tokenizer its ``tokenizer.ggml.pre`` names.

`load_tokenizer` picks the source from a checkpoint path; `attach_tokenizer`
is the hook `load_pretrained` calls so that ``model.tokenizer`` is set (or None,
with the reason kept for the error a text prompt raises).

Example:
    >>> tok = Tokenizer.from_file("tests/data/models/tiny_llama/tokenizer.json")  # doctest: +SKIP
    >>> tok.encode("hi")  # doctest: +SKIP
    [104, 105]
    >>> tok.decode([104, 105])  # doctest: +SKIP
    'hi'
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from maxfx.graph.weights import GGUFWeights

__all__ = ["Tokenizer", "TokenizerError", "attach_tokenizer", "load_tokenizer", "model_extras"]


class TokenizerError(ValueError):
    """A tokenizer file or GGUF tokenizer metadata that cannot be used (the message names the file and field)."""


# Pre-tokenizer split patterns of the byte-level BPE vocabularies llama.cpp names in
# ``tokenizer.ggml.pre`` (the same regexes as those models' tokenizer.json). None: GPT-2's
# own split, built into the ByteLevel pre-tokenizer.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_PRE: dict[str, str | None] = {
    "default": None,
    "gpt2": None,
    "gpt-2": None,
    "llama3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
}
# gguf token types (llama.cpp's llama_token_type): 3 control, 4 user-defined.
_CONTROL, _USER_DEFINED = 3, 4


class Tokenizer:
    """Encodes text to token ids and decodes ids to text.

    Args:
        backend: a ``tokenizers.Tokenizer``.
        source: where it came from (used in messages and ``repr``).
        eos_token_ids: ids that end a generated sequence (from the GGUF metadata;
            the model's config adds its own).

    Example:
        >>> tok = Tokenizer.from_file("tests/data/models/tiny_llama/tokenizer.json")  # doctest: +SKIP
        >>> tok.decode(tok.encode("hello, world"))  # doctest: +SKIP
        'hello, world'
    """

    def __init__(self, backend: Any, source: str, eos_token_ids: Sequence[int] = ()):
        self._backend = backend
        self.source = source
        self.eos_token_ids = tuple(int(i) for i in eos_token_ids)

    # -- construction ------------------------------------------------------
    @classmethod
    def from_file(cls, path: os.PathLike[str] | str) -> Tokenizer:
        """The tokenizer of a ``tokenizer.json`` file.

        Raises:
            FileNotFoundError: no such file.
            TokenizerError: the file is not a valid ``tokenizer.json`` (the message names it).
        """

        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"Tokenizer.from_file: {str(p)!r} does not exist")
        try:
            text = p.read_text(encoding="utf-8")
            backend = Backend.from_str(text)
        except UnicodeDecodeError as e:
            raise TokenizerError(f"{p}: not a valid tokenizer.json (not UTF-8 text: {e})") from None
        except Exception as e:  # noqa: BLE001 - the Rust library raises a bare Exception for every parse error
            raise TokenizerError(f"{p}: not a valid tokenizer.json ({e})") from None
        return cls(backend, str(p))

    @classmethod
    def from_gguf(cls, fields: dict[str, Any], where: str) -> Tokenizer:
        """The tokenizer described by a GGUF file's ``tokenizer.ggml.*`` metadata.

        Args:
            fields: the metadata (at least the ``tokenizer.ggml.*`` keys) as Python values.
            where: the file, for messages.

        Raises:
            TokenizerError: no tokenizer metadata, a kind other than byte-level BPE
                (``tokenizer.ggml.model`` other than ``"gpt2"``), an unknown
                ``tokenizer.ggml.pre``, or malformed tokens/merges.
        """
        kind = fields.get("tokenizer.ggml.model")
        if kind is None:
            raise TokenizerError(f"{where}: no tokenizer in the GGUF metadata (tokenizer.ggml.model is missing)")
        if kind != "gpt2":
            raise TokenizerError(
                f"{where}: tokenizer.ggml.model={kind!r} is not supported; only byte-level BPE vocabularies "
                "(tokenizer.ggml.model='gpt2') are built from GGUF metadata"
            )
        pre = fields.get("tokenizer.ggml.pre", "default")
        if pre not in _GGUF_PRE:
            raise TokenizerError(
                f"{where}: tokenizer.ggml.pre={pre!r} is not supported; supported: {', '.join(sorted(_GGUF_PRE))}"
            )
        tokens = _strings(fields.get("tokenizer.ggml.tokens"), where, "tokenizer.ggml.tokens")
        merges = [
            _merge(m, i, where)
            for i, m in enumerate(_strings(fields.get("tokenizer.ggml.merges", []), where, "tokenizer.ggml.merges"))
        ]
        types = list(fields.get("tokenizer.ggml.token_type") or [])
        if types and len(types) != len(tokens):
            raise TokenizerError(
                f"{where}: tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens"
            )
        bos = _token_id(fields, "tokenizer.ggml.bos_token_id", len(tokens), where)
        eos = _token_id(fields, "tokenizer.ggml.eos_token_id", len(tokens), where)
        backend = _byte_level_bpe(tokens, merges, types, _GGUF_PRE[pre], where)
        add_bos = fields.get("tokenizer.ggml.add_bos_token", False)
        if not isinstance(add_bos, (bool, np.bool_)):
            raise TokenizerError(
                f"{where}: tokenizer.ggml.add_bos_token must be a bool, got {type(add_bos).__name__} {add_bos!r}"
            )
        if bos is not None and add_bos:
            backend.post_processor = processors.TemplateProcessing(
                single=f"{tokens[bos]} $A",
                pair=f"{tokens[bos]} $A {tokens[bos]} $B:1",
                special_tokens=[(tokens[bos], bos)],
            )
        return cls(backend, where, () if eos is None else (eos,))

    # -- use ---------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text`` (with the tokenizer's BOS/template tokens unless ``add_special_tokens=False``)."""
        if not isinstance(text, str):
            raise TypeError(f"Tokenizer.encode: expected a str, got {type(text).__name__}")
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        """The text of token ids ``ids`` (bytes that are not valid UTF-8 decode to U+FFFD, as in ``transformers``)."""
        flat = np.asarray(ids if not isinstance(ids, (list, tuple)) else list(ids), dtype=np.int64).reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= self.vocab_size):
            raise ValueError(f"Tokenizer.decode: token ids outside [0, {self.vocab_size}) ({self.source})")
        return self._backend.decode(flat.tolist(), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._backend

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, source={self.source!r})"


def _strings(value: Any, where: str, key: str) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TokenizerError(f"{where}: {key} must be a list of strings, got {type(value).__name__}")
    return list(value)


def _merge(m: str, i: int, where: str) -> tuple[str, str]:
    parts = m.split(" ")
    if len(parts) != 2 or not all(parts):
        raise TokenizerError(f"{where}: tokenizer.ggml.merges[{i}]={m!r} is not two tokens separated by one space")
    return parts[0], parts[1]


def _token_id(fields: dict[str, Any], key: str, n: int, where: str) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, np.integer)) or not 0 <= int(value) < n:
        raise TokenizerError(f"{where}: {key}={value!r} is not a token id in [0, {n})")
    return int(value)


def _byte_level_bpe(
    tokens: list[str], merges: list[tuple[str, str]], types: list[int], split: str | None, where: str
) -> Any:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a repeated string keeps its first id, as llama.cpp's lookup does
    try:
        backend = Backend(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    except Exception as e:  # noqa: BLE001 - the library rejects merges of unknown tokens with a bare Exception
        raise TokenizerError(f"{where}: tokenizer.ggml.merges do not fit tokenizer.ggml.tokens ({e})") from None
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    # Control tokens (BOS, EOS, chat markers) are matched whole in text and dropped by
    # decode(skip_special_tokens=True); user-defined ones are matched whole but kept.
    special = [AddedToken(tokens[i], special=True, normalized=False) for i, k in enumerate(types) if k == _CONTROL]
    added = [AddedToken(tokens[i], special=False, normalized=False) for i, k in enumerate(types) if k == _USER_DEFINED]
    if special:
        backend.add_special_tokens(special)
    if added:
        backend.add_tokens(added)
    return backend


# ─── the per-model side data ─────────────────────────────────────────────


@dataclass
class ModelExtras:
    """What `load_pretrained` knows about a model besides its weights.

    Kept outside the Module (a weak table keyed by the model), so it is not part
    of the model's pytree: jit caches and compiled programs stay shared between
    loads of the same architecture.
    """

    tokenizer: Tokenizer | None = None
    why_no_tokenizer: str = "the model was not loaded from a checkpoint with a tokenizer"
    load_s: float = 0.0
    last_stats: Any = None
    idle_runner: Any = (
        None  # the engine runner `generate` used last (its pools are reused by the next call of that shape)
    )


_EXTRAS: weakref.WeakKeyDictionary[Any, ModelExtras] = weakref.WeakKeyDictionary()


def model_extras(model: Any) -> ModelExtras:
    """The `ModelExtras` of ``model`` (created empty on first use)."""
    extras = _EXTRAS.get(model)
    if extras is None:
        extras = _EXTRAS[model] = ModelExtras()
    return extras


def load_tokenizer(path: os.PathLike[str] | str) -> tuple[Tokenizer | None, str]:
    """The tokenizer of a checkpoint (a Hugging Face folder or a ``.gguf`` file), or None and the reason.

    Raises:
        TokenizerError: a ``tokenizer.json`` that is corrupt, or GGUF tokenizer
            metadata of an unsupported kind (metadata that is simply absent gives None).

    Example:
        >>> tok, _ = load_tokenizer("tests/data/models/tiny_llama")  # doctest: +SKIP
    """
    p = Path(path)
    if p.is_dir():
        file = p / "tokenizer.json"
        if not file.is_file():
            return None, f"{str(p)!r} has no tokenizer.json"
        return Tokenizer.from_file(file), ""
    reader = GGUFWeights(str(p)).reader
    fields = {
        k: _contents(f, k, str(p))
        for k, f in reader.fields.items()
        if k.startswith("tokenizer.ggml.") and k != "tokenizer.ggml.scores"
    }
    if "tokenizer.ggml.model" not in fields:
        return None, f"{str(p)!r} has no tokenizer metadata (tokenizer.ggml.model is missing)"
    return Tokenizer.from_gguf(fields, str(p)), ""


def _contents(field: Any, key: str, where: str) -> Any:
    """A GGUF metadata value; TokenizerError naming the file and key when its strings are not UTF-8."""
    try:
        return field.contents()
    except UnicodeDecodeError as e:
        raise TokenizerError(
            f"{where}: {key} holds a string that is not valid UTF-8 ({e.reason} at byte {e.start})"
        ) from None


def attach_tokenizer(model: Any, path: os.PathLike[str] | str, since: float | None = None) -> None:
    """Give ``model`` the tokenizer of its checkpoint ``path`` (the hook `load_pretrained` calls).

    ``since``: the ``time.perf_counter()`` when loading began; the load time
    (tokenizer included) goes to ``model.last_stats.load_s``.
    """
    extras = model_extras(model)
    extras.tokenizer, extras.why_no_tokenizer = load_tokenizer(path)
    if since is not None:
        extras.load_s = time.perf_counter() - since
