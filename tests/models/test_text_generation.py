"""Text in, text out: tokenizers (tokenizer.json and GGUF metadata), text generation and streaming, token-id inputs,
timings.

References: ``golden_text.json`` (prompt -> ids -> 16 greedy ids -> completion) was
made with Hugging Face transformers; GGUF vocabularies are checked against BPE
merges worked out by hand and against the ``tokenizers`` library built directly
from the same vocabulary.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import gguf
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.experimental.tensor import Tensor
from maxfx.models import GenerationStats, LlamaForCausalLM, Tokenizer, TokenizerError, load_pretrained
from maxfx.models._generate import _TextSteps
from maxfx.models._tokenizer import load_tokenizer
from tests.models._helpers import LLAMA, model

GOLDEN = json.loads((LLAMA / "golden_text.json").read_text())
CASES = GOLDEN["cases"]
N_NEW = GOLDEN["greedy_new_tokens"]


@pytest.fixture(scope="module")
def llama():
    return model(str(LLAMA))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (written out here, not taken from the library under test)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE = _bytes_to_unicode()


# ─── tokenizer.json ───────────────────────────────────────────────────────


def test_tokenizer_json_round_trips(llama):
    tok = llama.tokenizer
    assert isinstance(tok, Tokenizer) and tok.vocab_size == 256
    for text in ("hello, world", "the graph compiles", "  spaces\tand\nnewlines ", "héllo wörld ✓ 日本"):
        ids = tok.encode(text)
        assert all(isinstance(i, int) for i in ids)
        assert ids == list(text.encode("utf-8"))  # byte-level vocabulary with no merges: one id per UTF-8 byte
        assert tok.decode(ids) == text
    assert tok.decode(np.array([104, 105])) == "hi"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["prompt"])
def test_golden_text_reproduced(llama, case):
    assert llama.tokenizer.encode(case["prompt"]) == case["prompt_ids"]
    assert llama.tokenizer.decode(case["new_ids"]) == case["completion"]
    np.testing.assert_array_equal(llama.generate([case["prompt_ids"]], N_NEW)[0], case["new_ids"])
    assert llama.generate(case["prompt"], max_new_tokens=N_NEW) == case["completion"]


def test_batch_of_prompts_gives_list_of_completions(llama):
    out = llama.generate([c["prompt"] for c in CASES], max_new_tokens=N_NEW)
    assert out == [c["completion"] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["prompt"])
def test_stream_pieces_join_to_the_completion(llama, case):
    pieces = list(llama.stream(case["prompt"], max_new_tokens=N_NEW))
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == case["completion"]
    seen: list[str] = []
    assert llama.generate(case["prompt"], N_NEW, stream=seen.append) == case["completion"]
    assert "".join(seen) == case["completion"]


def test_stream_of_a_batch_gives_a_piece_per_row(llama):
    steps = list(llama.stream([c["prompt"] for c in CASES], max_new_tokens=N_NEW))
    assert all(isinstance(s, list) and len(s) == len(CASES) for s in steps)
    for i, c in enumerate(CASES):
        assert "".join(s[i] for s in steps) == c["completion"]


class _FixedSteps:
    """Stands in for the token-id steps: yields given ids one per step (to drive the text decoding alone)."""

    def __init__(self, ids):
        self._it = iter(ids)
        self._lengths = np.zeros(1)
        self.stats = GenerationStats()

    def __next__(self):
        return np.array([next(self._it)])


def test_streaming_never_splits_a_multibyte_character(llama):
    text = "né ✓ 日本 🙂!"
    ids = list(text.encode("utf-8"))  # one token per byte: most characters span several steps
    pieces = list(_TextSteps(_FixedSteps(ids), llama.tokenizer, (), single=True))
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces == ["n", "é", " ", "✓", " ", "日", "本", " ", "🙂", "!"]


def test_invalid_bytes_are_replaced_as_transformers_does(llama):
    ids = [0xE6, 0x97, ord("A"), 0xFF]  # a cut-off 3-byte character, then a byte that is never valid
    pieces = list(_TextSteps(_FixedSteps(ids), llama.tokenizer, (), single=True))
    assert "".join(pieces) == llama.tokenizer.decode(ids) == "\ufffdA\ufffd"


def test_eos_from_the_config_stops_a_row(tmp_path):
    case = CASES[0]
    eos = case["new_ids"][5]
    stop = case["new_ids"].index(eos)
    folder = _copy_llama(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["eos_token_id"] = eos
    (folder / "config.json").write_text(json.dumps(cfg))
    m = load_pretrained(folder)
    expected = m.tokenizer.decode(case["new_ids"][:stop])
    assert m.generate(case["prompt"], max_new_tokens=N_NEW) == expected
    assert m.last_stats.new_tokens == stop + 1  # generation stopped at the EOS step
    assert "".join(m.stream(case["prompt"], max_new_tokens=N_NEW)) == expected
    np.testing.assert_array_equal(
        m.generate([case["prompt_ids"]], N_NEW)[0], case["new_ids"]
    )  # ids: no EOS unless asked
    out = m.generate([c["prompt"] for c in CASES], max_new_tokens=N_NEW)
    assert out[0] == expected and out[1] == CASES[1]["completion"]


# ─── GGUF vocabularies ────────────────────────────────────────────────────

# Byte tokens, then merged tokens, then specials; merges in rank order.
_MERGES = [("t", "h"), ("th", "e"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("3", "4"), ("l", "l")]
_EXTRA = ["th", "the", "Ġw", "or", "Ġwor", "34", "ll"]
_SPECIAL = ["<|bos|>", "<|eos|>"]
_USER = ["<user>"]


def _vocab() -> tuple[list[str], list[int]]:
    tokens = [BYTE[b] for b in range(256)] + _EXTRA + _SPECIAL + _USER
    types = [1] * (256 + len(_EXTRA)) + [3] * len(_SPECIAL) + [4] * len(_USER)
    return tokens, types


def _write_gguf(
    path: Path,
    *,
    kind: str | None = "gpt2",
    pre: str | None = "gpt2",
    add_bos: bool = False,
    source: Path | None = None,
    vocab=None,
) -> Path:
    """A GGUF file with a tokenizer in its metadata: tensors and metadata copied from ``source`` if given, else no
    tensors.

    ``vocab``: (tokens, types, merges, bos, eos); default the vocabulary of `_vocab` with `_MERGES`.
    """
    if vocab is None:
        tokens, types = _vocab()
        vocab = (tokens, types, _MERGES, tokens.index("<|bos|>"), tokens.index("<|eos|>"))
    tokens, types, merges, bos, eos = vocab
    writer = gguf.GGUFWriter(str(path), "llama")
    reader = gguf.GGUFReader(str(source)) if source else None
    if reader is not None:
        for field in reader.fields.values():
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    if kind is not None:
        writer.add_tokenizer_model(kind)
        if pre is not None:
            writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges([f"{a} {b}" for a, b in merges])
        writer.add_bos_token_id(bos)
        writer.add_eos_token_id(eos)
        writer.add_add_bos_token(add_bos)
    for t in reader.tensors if reader else ():
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors if reader else ():
        writer.write_tensor_data(t.data)
    writer.close()
    return path


def _reference(split_digits: bool = False):
    """The same vocabulary built directly with the tokenizers library (the independent reference)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers  # noqa: PLC0415
    from tokenizers import Tokenizer as Backend  # noqa: PLC0415

    tokens, _ = _vocab()
    ref = Backend(models.BPE({t: i for i, t in enumerate(tokens)}, list(_MERGES)))
    if split_digits:
        ref.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"\p{N}{1,3}|[^\p{N}]+"), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        ref.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in _SPECIAL])
    ref.add_tokens([AddedToken(t, normalized=False) for t in _USER])
    return ref


def test_gguf_bpe_tokenizer_from_metadata(tmp_path):
    tok, why = load_tokenizer(_write_gguf(tmp_path / "bpe.gguf"))
    assert isinstance(tok, Tokenizer) and why == ""
    tokens, _ = _vocab()
    # Worked by hand: t+h -> th, th+e -> the; " w" -> Ġw, o+r -> or, Ġw+or -> Ġwor; l+l -> ll.
    assert tok.encode("the world") == [tokens.index(t) for t in ("the", "Ġwor", "l", "d")]
    assert tok.encode("hello") == [tokens.index(t) for t in ("h", "e", "ll", "o")]
    ref = _reference()
    for text in ("the world", "hello, the worldly 12345!", "<|bos|>the<user> wörld ✓<|eos|>", "  tabs\tand\nlines  "):
        assert tok.encode(text) == ref.encode(text).ids, text
        assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("<|bos|>the world<|eos|>")
    assert ids[0] == tokens.index("<|bos|>") and ids[-1] == tokens.index("<|eos|>")  # control tokens match whole
    assert tok.decode(ids, skip_special_tokens=True) == "the world"
    assert tok.eos_token_ids == (tokens.index("<|eos|>"),)


def test_gguf_pre_tokenizer_llama3_splits_digits_in_threes(tmp_path):
    tokens, _ = _vocab()
    gpt2, _ = load_tokenizer(_write_gguf(tmp_path / "gpt2.gguf"))
    llama3, _ = load_tokenizer(_write_gguf(tmp_path / "llama3.gguf", pre="llama-bpe"))
    # GPT-2 keeps "12345" one word, so the 3+4 merge applies; Llama 3 splits "123" | "45" first.
    assert gpt2.encode("12345") == [tokens.index(t) for t in ("1", "2", "34", "5")]
    assert llama3.encode("12345") == [tokens.index(t) for t in ("1", "2", "3", "4", "5")]
    assert llama3.encode("x12345") == _reference(split_digits=True).encode("x12345").ids


def test_gguf_add_bos_token(tmp_path):
    tok, _ = load_tokenizer(_write_gguf(tmp_path / "bos.gguf", add_bos=True))
    tokens, _ = _vocab()
    assert tok.encode("the") == [tokens.index("<|bos|>"), tokens.index("the")]
    assert tok.encode("the", add_special_tokens=False) == [tokens.index("the")]


def test_gguf_model_with_a_tokenizer_generates_text(tmp_path, llama):
    # tiny_llama's own vocabulary (256 byte tokens, no merges), written as GGUF metadata next to its q8_0 weights.
    tokens = [BYTE[b] for b in range(256)]
    path = _write_gguf(
        tmp_path / "tiny.gguf", source=LLAMA / "tiny_llama-q8_0.gguf", vocab=(tokens, [1] * 256, [], 1, 2)
    )
    m = load_pretrained(path)
    assert isinstance(m.tokenizer, Tokenizer) and m.tokenizer.eos_token_ids == (2,)
    for c in CASES:  # the same ids as the tokenizer.json that transformers used
        assert m.tokenizer.encode(c["prompt"]) == c["prompt_ids"]
        assert m.tokenizer.decode(c["new_ids"]) == c["completion"]
    prompt = CASES[1]["prompt"]
    new = list(m.generate([CASES[1]["prompt_ids"]], N_NEW)[0])
    expected = llama.tokenizer.decode(new[: new.index(2)] if 2 in new else new)
    assert m.generate(prompt, max_new_tokens=N_NEW) == expected
    assert "".join(m.stream(prompt, max_new_tokens=N_NEW)) == expected


def test_gguf_other_tokenizer_kinds_are_refused(tmp_path):
    with pytest.raises(TokenizerError, match=r"sp\.gguf.*tokenizer\.ggml\.model='llama' is not supported"):
        load_tokenizer(_write_gguf(tmp_path / "sp.gguf", kind="llama"))
    with pytest.raises(TokenizerError, match=r"tokenizer\.ggml\.pre='mystery' is not supported"):
        load_tokenizer(_write_gguf(tmp_path / "pre.gguf", pre="mystery"))
    with pytest.raises(TokenizerError, match="no tokenizer in the GGUF metadata"):
        Tokenizer.from_gguf({}, "x.gguf")
    with pytest.raises(TokenizerError, match=r"merges\[0\]='abc' is not two tokens"):
        Tokenizer.from_gguf(
            {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": ["abc"]}, "x.gguf"
        )


def test_gguf_tokenizer_metadata_of_the_wrong_kind_is_named(tmp_path):
    tokens, _ = _vocab()
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.add_bos_token": 1,
    }
    with pytest.raises(TokenizerError, match=r"x\.gguf: tokenizer\.ggml\.add_bos_token must be a bool, got int 1"):
        Tokenizer.from_gguf(fields, "x.gguf")
    # A token string that is not UTF-8: written as "<|QQ|>", then its two Q bytes replaced in the file.
    tokens[len(tokens) - 1] = "<|QQ|>"
    path = _write_gguf(tmp_path / "utf8.gguf", vocab=(tokens, [1] * len(tokens), [], 0, 1))
    data = path.read_bytes()
    assert data.count(b"<|QQ|>") == 1
    path.write_bytes(data.replace(b"<|QQ|>", b"<|\xff\xfe|>"))
    with pytest.raises(
        TokenizerError, match=r"utf8\.gguf: tokenizer\.ggml\.tokens holds a string that is not valid UTF-8"
    ):
        load_tokenizer(path)


def test_out_of_vocabulary_ids_raise_the_exported_error(llama):
    from maxfx.models import TokenIdError  # noqa: PLC0415 - the public name is what is under test

    with pytest.raises(TokenIdError, match="token id 300 is out of range"):
        llama(np.array([[1, 300]]))


def test_gguf_without_tokenizer_refuses_text():
    path = LLAMA / "tiny_llama-q8_0.gguf"
    m = load_pretrained(path)
    assert m.tokenizer is None
    with pytest.raises(ValueError, match=r"needs a tokenizer.*tiny_llama-q8_0\.gguf.*no tokenizer metadata"):
        m.generate("hello", max_new_tokens=4)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        next(iter(m.stream("hello", max_new_tokens=4)))
    assert m.generate([[1, 2, 3]], 4).shape == (1, 4)  # ids still work


# ─── bad input ────────────────────────────────────────────────────────────


def _copy_llama(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny_llama"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(LLAMA / name, folder / name)
    return folder


def test_corrupt_tokenizer_json_names_the_file(tmp_path):
    folder = _copy_llama(tmp_path)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ')
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: not a valid tokenizer\.json"):
        load_pretrained(folder)
    (folder / "tokenizer.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TokenizerError, match=r"tiny_llama/tokenizer\.json"):
        load_pretrained(folder)


def test_folder_without_tokenizer_refuses_text(tmp_path):
    folder = _copy_llama(tmp_path)
    (folder / "tokenizer.json").unlink()
    m = load_pretrained(folder)
    assert m.tokenizer is None
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        m.generate("hello")
    random = LlamaForCausalLM.random(m.config)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        random.generate(["a", "b"])


def test_prompt_longer_than_the_context_is_refused(llama):
    limit = llama.config.max_position_embeddings  # 128
    with pytest.raises(ValueError, match=rf"prompt 1 has {limit + 1} tokens, more than the model's context of {limit}"):
        llama.generate([[1, 2], [3] * (limit + 1)], 2)
    with pytest.raises(ValueError, match=rf"more than the model's context of {limit}"):
        llama.generate("x" * (limit + 5), max_new_tokens=2)
    with pytest.raises(
        ValueError, match=rf"the input has {limit + 1} tokens, more than the model's context of {limit}"
    ):
        llama(np.ones((1, limit + 1), np.int64))
    assert llama.generate([[3] * limit], 1).shape == (1, 1)  # exactly the context is fine


def test_empty_text_prompt_is_refused(llama):
    with pytest.raises(ValueError, match=r"prompt 0 \(''\) encodes to no tokens"):
        llama.generate("", max_new_tokens=2)


# ─── token ids in any array form ──────────────────────────────────────────


def test_ids_as_tensor_numpy_jax_or_list(llama):
    ids = np.array([CASES[1]["prompt_ids"]], np.int64)
    forms = {
        "tensor": Tensor(ids),
        "numpy": ids,
        "numpy32": ids.astype(np.int32),
        "jax": jnp.asarray(ids),
        "list": ids.tolist(),
    }
    logits = {k: llama(v).to_numpy() for k, v in forms.items()}
    for k, v in logits.items():
        assert v.shape == (1, ids.shape[1], 256), k
        np.testing.assert_allclose(v, logits["tensor"], atol=1e-6, err_msg=k)
    for k, v in forms.items():
        np.testing.assert_array_equal(llama.generate(v, N_NEW)[0], CASES[1]["new_ids"], err_msg=k)
    with pytest.raises(ValueError, match="integer token ids"):
        llama(np.ones((1, 3), np.float32))
    with pytest.raises(ValueError, match="rectangular"):
        llama([[1, 2], [3]])


# ─── timings ──────────────────────────────────────────────────────────────

_STAT_FIELDS = (
    "load_s",
    "compile_s",
    "prefill_tokens",
    "prefill_s",
    "prefill_tokens_per_s",
    "decode_tokens",
    "decode_s",
    "decode_tokens_per_s",
)


def test_last_stats_separate_load_compile_prefill_decode():
    m = load_pretrained(LLAMA)
    assert m.last_stats is None
    prompts = [c["prompt"] for c in CASES] * 3  # batch 6: a signature no other test compiles
    wall = time.perf_counter()
    m.generate(prompts, max_new_tokens=12)
    wall = time.perf_counter() - wall
    s = m.last_stats
    for f in _STAT_FIELDS:
        assert isinstance(getattr(s, f), (int, float)), f
    assert s.load_s > 0
    assert s.prefill_tokens == sum(len(c["prompt_ids"]) for c in CASES) * 3
    assert s.decode_tokens == 6 * 11  # every token after each row's first comes from a decode step
    assert s.compile_s > 0 and s.prefill_s > 0 and s.decode_s > 0
    # Compilation is counted once, apart: run time + compile time fit in the wall time.
    assert s.compile_s + s.prefill_s + s.decode_s <= wall
    assert s.prefill_tokens_per_s == pytest.approx(s.prefill_tokens / s.prefill_s)
    assert s.decode_tokens_per_s == pytest.approx(s.decode_tokens / s.decode_s)
    first_prefill = s.prefill_s
    m.generate(prompts, max_new_tokens=12)
    again = m.last_stats
    assert again is not s and again.compile_s == 0.0  # same signature: nothing compiled
    # The first call's prefill excluded compiling: it is the same order as a warm one, far below the compile time.
    assert first_prefill < s.compile_s / 4
    out, returned = m.generate([[1, 2, 3]], 4, return_stats=True)
    assert returned is m.last_stats


def test_stream_fills_last_stats_as_it_runs(llama):
    it = llama.stream(CASES[0]["prompt"], max_new_tokens=N_NEW)
    assert llama.last_stats is it.stats
    "".join(it)
    assert it.stats.new_tokens == N_NEW and it.stats.decode_tokens == N_NEW - 1
