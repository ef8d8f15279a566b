"""A SmolLM2-135M-shaped random GGUF with a real byte-level BPE tokenizer, and exact-length text prompts.

`tests.bench.llm_cpu.make_gguf` writes a dummy vocabulary (ids are fed directly);
a serving benchmark sends text, so both servers must tokenize it, the same way.
Here a GPT-2-style byte-level BPE is trained with ``tokenizers`` on text in this
checkout (docs/pages/**.md and maxfx/**.py: no download, and the same on every
machine with the same commit), padded with never-produced ``<|pad_N|>`` tokens to
the model's 49152 ids, and written as ``tokenizer.ggml.model = "gpt2"`` with
``tokenizer.ggml.pre = "gpt-2"``: the one pre-tokenizer name llama.cpp and maxfx
both map to GPT-2's split (llama.cpp rejects ``"gpt2"``, and its ``"default"`` is a
different split than maxfx's). BOS/EOS are ``<|endoftext|>`` (id 0, as in
SmolLM2); no BOS is added to prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.bench._timing import RESULTS

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # SmolLM2's first three ids
CONTROL, NORMAL = 3, 1  # gguf token types


def corpus() -> list[str]:
    """The training text: this checkout's docs pages and maxfx sources, one string per file, in path order."""
    files = sorted((ROOT / "docs" / "pages").rglob("*.md")) + sorted((ROOT / "maxfx").rglob("*.py"))
    return [f.read_text(encoding="utf-8", errors="replace") for f in files]


def train_vocab(size: int) -> dict:
    """A byte-level BPE of ``size`` ids: ``tokens``, ``merges`` ("a b" strings), gguf ``types``, ``bos``, ``eos``,
    ``pre``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    # The corpus is too small for 49k merges: the rest are placeholders no merge produces.
    tokens += [f"<|pad_{i}|>" for i in range(len(tokens), size)]
    types = [CONTROL if t in SPECIALS else NORMAL for t in tokens]
    return {
        "tokens": tokens,
        "merges": merges,
        "types": types,
        "bos": 0,
        "eos": 0,
        "pre": "gpt-2",
        "learned": len(vocab),
    }


def model_file(qname: str = "Q8_0") -> Path:
    """tests/bench/results/gguf/smollm2-135m-shape-bpe-<q>.gguf, made (random weights + trained BPE) if missing."""
    from tests.bench.llm_cpu import SMOLLM2_135M, make_gguf  # noqa: PLC0415

    path = RESULTS / "gguf" / f"smollm2-135m-shape-bpe-{qname.lower()}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        make_gguf(path, qname, vocab=train_vocab(SMOLLM2_135M["vocab"]))
    return path


class PromptSource:
    """Distinct ``(text, ids)`` prompts of exactly ``length`` tokens: windows of the corpus at random places.

    Each window is cut at ``length`` tokens and decoded; it is kept only if the text
    encodes back to the same ids (a cut inside a multi-byte character or a merge
    would not), has no surrounding whitespace, and its first 16 tokens start no
    other prompt this source gave (so no prefix-cache reuse).
    """

    def __init__(self, tokenizer, length: int, seed: int = 0):
        self.tokenizer, self.length = tokenizer, length
        self.rng = np.random.default_rng(seed)
        self.docs = [d for d in corpus() if len(d) > 8 * length]
        self.starts: set[tuple[int, ...]] = set()

    def take(self, count: int) -> list[tuple[str, list[int]]]:
        tok, n, out = self.tokenizer, self.length, []
        while len(out) < count:
            doc = self.docs[self.rng.integers(len(self.docs))]
            at = int(self.rng.integers(0, len(doc) - 8 * n))
            at = doc.find(" ", at) + 1  # start on a word, so the first token is a whole one
            ids = tok.encode(doc[at : at + 8 * n], add_special_tokens=False)[:n]
            text = tok.decode(ids)
            if (
                len(ids) != n
                or tok.encode(text, add_special_tokens=False) != ids
                or text != text.strip()
                or tuple(ids[:16]) in self.starts
            ):
                continue
            self.starts.add(tuple(ids[:16]))
            out.append((text, ids))
        return out


def prompts(tokenizer, count: int, length: int, seed: int) -> list[tuple[str, list[int]]]:
    """``count`` prompts of a fresh `PromptSource`."""
    return PromptSource(tokenizer, length, seed).take(count)
