"""maxfx.pipelines.lib.tokenizer: MAX's TextTokenizer and friends on the tiny_llama fixtures.

The references are independent of the code under test: `maxfx.models.Tokenizer` for
encode/decode, a plain jinja2 environment for chat templates, and numbers worked out
by hand for the length budget.
"""

import asyncio
import datetime
import inspect
import json
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import gguf
import jinja2
import numpy as np
import pytest

from maxfx.generation import TextContext
from maxfx.interfaces import PipelineTokenizer, RequestID, SamplingParams, TextGenerationRequest
from maxfx.models import Tokenizer
from maxfx.pipelines.lib import tokenizer as tk
from maxfx.pipelines.lib.tokenizer import (
    IdentityPipelineTokenizer,
    PreTrainedPipelineTokenizer,
    TextAndVisionTokenizer,
    TextTokenizer,
    max_tokens_to_generate,
    run_with_default_executor,
)

LLAMA = Path(__file__).resolve().parents[1] / "data" / "models" / "tiny_llama"
FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")

CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TEXTS = ["hello, world", "", "  tabs\tand\nlines  ", "wörld ✓ 日本", "the <|im_start|> marker"]


def run(coro):
    return asyncio.run(coro)


def request(**kw):
    kw.setdefault("request_id", RequestID("r"))
    kw.setdefault("model_name", "tiny")
    return TextGenerationRequest(**kw)


def reference_render(template, **variables):
    """The template rendered with plain jinja2 as Hugging Face configures it (trim/lstrip blocks)."""
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(template).render(**variables)


def folder(tmp_path, *, name="tiny", tokenizer_config=None, config=None, generation_config=None, chat_template=None):
    """A copy of tiny_llama's tokenizer files, with the given JSON updates and an optional chat_template.jinja."""
    out = tmp_path / name
    out.mkdir()
    for f in FILES:
        shutil.copy(LLAMA / f, out / f)
    for fname, update in (("tokenizer_config.json", tokenizer_config), ("config.json", config)):
        if update is not None:
            data = json.loads((out / fname).read_text())
            data.update(update)
            data = {k: v for k, v in data.items() if v is not ...}
            (out / fname).write_text(json.dumps(data))
    if generation_config is not None:
        (out / "generation_config.json").write_text(json.dumps(generation_config))
    if chat_template is not None:
        (out / "chat_template.jinja").write_text(chat_template)
    return out


def write_gguf(path, *, chat_template=None, context_length=128, eos=2, bos=1):
    """A GGUF file (no tensors) holding tiny_llama's byte vocabulary, optionally a chat template."""
    vocab = json.loads((LLAMA / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(context_length)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges([])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


@pytest.fixture
def tiny():
    return TextTokenizer(str(LLAMA))


@pytest.fixture
def chat(tmp_path):
    return TextTokenizer(str(folder(tmp_path, chat_template=CHATML)))


# ─── encode / decode ─────────────────────────────────────────────────────────


def test_encode_decode_match_the_models_tokenizer(tiny):
    ref = Tokenizer.from_file(LLAMA / "tokenizer.json")
    for text in TEXTS:
        ids = run(tiny.encode(text))
        assert isinstance(ids, np.ndarray) and ids.dtype == np.int64
        assert ids.tolist() == ref.encode(text)
        assert ids.tolist() == [b for b in text.encode()]  # a byte-level vocabulary of 256: one id per byte
        assert run(tiny.decode(ids)) == ref.decode(ids) == text
        assert run(tiny.decode(ids.tolist())) == text
    assert run(tiny.encode("hi", add_special_tokens=False)).tolist() == [104, 105]
    assert run(tiny.decode(104)) == "h" and run(tiny.decode(np.int64(105))) == "i"
    # Token ids given instead of text come back as an array, untouched.
    assert run(tiny.encode([5, 6, 7])).tolist() == [5, 6, 7]
    assert run(tiny.encode(np.array([9, 8], np.int32))).dtype == np.int64


def test_encode_and_decode_errors(tiny):
    with pytest.raises(ValueError, match=r"larger than tokenizer's max length \(129 > 128\)"):
        run(tiny.encode("x" * 129))
    with pytest.raises(TypeError, match="1-D sequence of int token ids"):
        run(tiny.encode([1.5, 2.0]))
    with pytest.raises(ValueError, match=r"exceeding the vocabulary size \(256\) at indices \[1\]: \[999\]"):
        run(tiny.decode([1, 999]))
    with pytest.raises(ValueError, match=r"negative token ids at indices \[0\]"):
        run(tiny.decode([-1]))


def test_async_members_are_coroutines(tiny):
    for cls in (TextTokenizer, IdentityPipelineTokenizer, PreTrainedPipelineTokenizer, TextAndVisionTokenizer):
        for name in ("encode", "decode", "new_context"):
            assert inspect.iscoroutinefunction(getattr(cls, name)), (cls, name)
    assert inspect.iscoroutinefunction(run_with_default_executor)
    assert isinstance(tiny, PipelineTokenizer) and tiny.expects_content_wrapping is False


def test_long_prompts_are_encoded_off_the_event_loop(tmp_path, monkeypatch):
    tok = TextTokenizer(str(LLAMA), max_length=100_000)
    seen = []
    original = tok.delegate.encode

    def spy(text, add_special_tokens=True):
        seen.append(threading.current_thread() is threading.main_thread())
        return original(text, add_special_tokens=add_special_tokens)

    monkeypatch.setattr(tok.delegate, "encode", spy)
    long_text = "ab" * 10_000
    assert run(tok.encode(long_text)).tolist() == list(long_text.encode())
    assert run(tok.encode("short")).tolist() == list(b"short")
    assert seen == [False, True]  # the long prompt ran in the executor, the short one inline


# ─── GGUF ────────────────────────────────────────────────────────────────────


def test_gguf_tokenizer_with_chat_template(tmp_path, tiny):
    path = write_gguf(tmp_path / "tiny.gguf", chat_template=CHATML, context_length=96, eos=2, bos=1)
    tok = TextTokenizer(str(path))
    for text in TEXTS:
        assert run(tok.encode(text)).tolist() == run(tiny.encode(text)).tolist()
        assert run(tok.decode(run(tok.encode(text)))) == text
    assert tok.eos == 2 and tok._default_eos_token_ids == {2}
    assert tok.max_length == 96  # llama.context_length
    assert tok.chat_template == CHATML and "tokenizer.chat_template" in tok.chat_template_source
    messages = [{"role": "user", "content": "hi"}]
    # bos_token is the GGUF vocabulary's BOS string (id 1 is "ā" in the byte-level alphabet).
    assert tok.apply_chat_template(messages) == reference_render(
        CHATML, messages=messages, add_generation_prompt=True, bos_token="ā"
    )
    ctx = run(tok.new_context(request(messages=messages)))
    assert ctx.prompt_tokens.tolist() == list(tok.apply_chat_template(messages).encode())


def test_gguf_without_a_chat_template_or_tokenizer(tmp_path):
    tok = TextTokenizer(str(write_gguf(tmp_path / "plain.gguf")))
    with pytest.raises(ValueError, match="has no chat template .the GGUF metadata has no tokenizer.chat_template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    # The fixture's own GGUF file carries weights but no tokenizer metadata.
    with pytest.raises(ValueError, match="Failed to load tokenizer from .*tokenizer.ggml.model is missing"):
        TextTokenizer(str(LLAMA / "tiny_llama-q8_0.gguf"))


def test_model_path_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        TextTokenizer(str(tmp_path / "nowhere"))
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="is a file but not .gguf"):
        TextTokenizer(str(tmp_path / "weights.bin"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        TextTokenizer(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="not available offline"):
        TextTokenizer("no-org/no-model")


def test_repo_id_from_the_hugging_face_cache_and_subfolder(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    folder(snapshot, name="tok", chat_template=CHATML)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    tok = TextTokenizer("org/tiny", subfolder="tok")
    assert tok.chat_template == CHATML and run(tok.encode("hi")).tolist() == [104, 105]
    with pytest.raises(ValueError, match="not available offline"):
        TextTokenizer("org/tiny", revision="other")


# ─── chat templates ──────────────────────────────────────────────────────────


def test_chat_template_rendering_matches_jinja(chat):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    assert chat.apply_chat_template(messages) == reference_render(CHATML, messages=messages, add_generation_prompt=True)
    no_prompt = chat.apply_chat_template(messages, None, {"add_generation_prompt": False})
    assert no_prompt == reference_render(CHATML, messages=messages, add_generation_prompt=False)
    assert not no_prompt.endswith("assistant\n")
    # tokenizer_config has no bos_token: the variable is undefined (renders empty), as in Hugging Face.
    assert chat.apply_chat_template(messages).startswith("<|im_start|>system\nbe brief<|im_end|>\n")


def test_chat_template_variables_tools_and_special_tokens(tmp_path):
    template = (
        "{{ bos_token }}|{{ eos_token }}|{% if tools %}{{ tools | tojson }}|{% endif %}"
        "{% if enable_thinking %}think|{% endif %}"
        "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}"
    )
    tok = TextTokenizer(
        str(
            folder(
                tmp_path,
                tokenizer_config={"bos_token": "ā", "eos_token": {"content": "Ă", "special": True}},
                chat_template=template,
            )
        )
    )
    tools = [{"type": "function", "function": {"name": "f", "description": "<é>", "parameters": {}}}]
    messages = [{"role": "user", "content": "x"}]
    got = tok.apply_chat_template(messages, tools, {"enable_thinking": True})
    assert (
        got
        == 'ā|Ă|[{"type": "function", "function": {"name": "f", "description": "<é>", "parameters": {}}}]|think|user=x;'
    )
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)  # Hugging Face's: no HTML escaping
    assert got == env.from_string(template).render(
        messages=messages, tools=tools, enable_thinking=True, bos_token="ā", eos_token="Ă"
    )
    assert tok.eos == 2  # eos_token "Ă" is id 2 of the byte alphabet


def test_chat_template_helpers(tmp_path):
    base = folder(tmp_path)
    tok = TextTokenizer(
        str(base),
        chat_template=(
            "{% if messages | length > 1 %}{{ raise_exception('only one message, got ' ~ messages | length) "
            "}}{% endif %}{{ strftime_now('%Y') }}"
        ),
    )
    assert tok.apply_chat_template([{"role": "user", "content": "a"}]) == str(datetime.datetime.now().year)
    with pytest.raises(
        ValueError, match="chat template .the chat_template argument. failed: TemplateError: only one message, got 2"
    ):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    # loop controls and Hugging Face's {% generation %} marker.
    tok = TextTokenizer(
        str(base),
        chat_template=(
            "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% generation %}[{{ "
            "m.content }}]{% endgeneration %}{% endfor %}"
        ),
    )
    assert tok.apply_chat_template([{"role": "user", "content": c} for c in "abcd"]) == "[a][b]"
    # The sandbox refuses unsafe attribute access.
    tok = TextTokenizer(str(base), chat_template="{{ messages.__class__.__mro__ }}")
    with pytest.raises(ValueError, match="SecurityError|failed"):
        tok.apply_chat_template([{"role": "user", "content": "a"}])


def test_content_parts_are_joined_and_messages_checked(chat):
    parts = [{"role": "user", "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]}]
    assert chat.apply_chat_template(parts) == reference_render(
        CHATML, messages=[{"role": "user", "content": "line one\nline two"}], add_generation_prompt=True
    )
    with pytest.raises(ValueError, match=r"messages\[0\]\['content'\]\[0\]: unsupported content type 'image_url'"):
        chat.apply_chat_template([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ValueError, match=r"missing 'type' field"):
        chat.apply_chat_template([{"role": "user", "content": [{"text": "x"}]}])
    with pytest.raises(ValueError, match=r"messages\[1\] has no 'role'"):
        chat.apply_chat_template([{"role": "user", "content": "a"}, {"content": "b"}])
    with pytest.raises(ValueError, match=r"messages\[0\] has no 'content'"):
        chat.apply_chat_template([{"role": "user"}])
    with pytest.raises(ValueError, match=r"messages\[0\] must be a dict"):
        chat.apply_chat_template(["hi"])
    # An assistant turn carrying only tool calls may have no content; extra keys reach the template.
    tok = TextTokenizer(
        chat.model_path,
        chat_template=(
            "{% for m in messages %}{{ m.role }}:{{ m.tool_calls[0].function.name if m.tool_calls else "
            "m.content }};{% endfor %}"
        ),
    )
    msgs = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    assert tok.apply_chat_template(msgs) == "user:q;assistant:f;"


def test_continue_final_message(chat):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    got = chat.apply_chat_template(messages, None, {"continue_final_message": True})
    assert got == reference_render(CHATML, messages=messages, add_generation_prompt=False).rsplit("<|im_end|>", 1)[0]
    assert got.endswith("<|im_start|>assistant\nSure, ")
    with pytest.raises(ValueError, match="cannot both be set"):
        chat.apply_chat_template(messages, None, {"continue_final_message": True, "add_generation_prompt": True})


def test_chat_template_sources_in_order(tmp_path):
    a, b, c = "A{{ messages[0].content }}", "B{{ messages[0].content }}", "C{{ messages[0].content }}"
    msg = [{"role": "user", "content": "x"}]
    # tokenizer_config.json's chat_template (a string)
    tok = TextTokenizer(str(folder(tmp_path, name="cfg", tokenizer_config={"chat_template": c})))
    assert tok.apply_chat_template(msg) == "Cx" and tok.chat_template_source.endswith(
        "tokenizer_config.json: chat_template"
    )
    # ... or Hugging Face's list of named templates: "default" is used.
    tok = TextTokenizer(
        str(
            folder(
                tmp_path,
                name="named",
                tokenizer_config={
                    "chat_template": [{"name": "tool_use", "template": a}, {"name": "default", "template": c}]
                },
            )
        )
    )
    assert tok.apply_chat_template(msg) == "Cx"
    with pytest.raises(ValueError, match="none is named 'default'"):
        TextTokenizer(
            str(
                folder(tmp_path, name="nodefault", tokenizer_config={"chat_template": [{"name": "rag", "template": a}]})
            )
        )
    # chat_template.jinja beats tokenizer_config.json
    both = folder(tmp_path, name="both", tokenizer_config={"chat_template": c}, chat_template=b)
    tok = TextTokenizer(str(both))
    assert tok.apply_chat_template(msg) == "Bx" and tok.chat_template_source.endswith("chat_template.jinja")
    # the argument beats both: a template string, or a file path (str or Path)
    assert TextTokenizer(str(both), chat_template=a).apply_chat_template(msg) == "Ax"
    (tmp_path / "t.jinja").write_text(a)
    assert TextTokenizer(str(both), chat_template=str(tmp_path / "t.jinja")).apply_chat_template(msg) == "Ax"
    assert TextTokenizer(str(both), chat_template=tmp_path / "t.jinja").apply_chat_template(msg) == "Ax"
    with pytest.raises(ValueError, match="neither a Jinja template"):
        TextTokenizer(str(both), chat_template=str(tmp_path / "missing.jinja"))


def test_no_chat_template_says_how_to_pass_one(tiny):
    with pytest.raises(
        ValueError, match=r"has no chat template .* Pass one with TextTokenizer\(\.\.\., chat_template="
    ) as e:
        tiny.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "tokenizer_config.json" in str(e.value)
    with pytest.raises(ValueError, match="has no chat template"):
        run(tiny.new_context(request(messages=[{"role": "user", "content": "hi"}])))


# ─── new_context ─────────────────────────────────────────────────────────────


def test_new_context_from_text_tokens_and_messages(chat):
    ctx = run(chat.new_context(request(prompt="hello")))
    assert isinstance(ctx, TextContext)
    assert ctx.prompt_tokens.tolist() == list(b"hello") and ctx.request_id == "r" and ctx.model_name == "tiny"
    assert ctx.max_length == 128 and ctx.max_new_tokens == 123 and ctx.eos_token_ids == {2}
    assert ctx.log_probabilities == 0 and ctx.log_probabilities_echo is False and ctx.json_schema is None

    ctx = run(chat.new_context(request(prompt=[7, 8, 9])))
    assert ctx.prompt_tokens.tolist() == [7, 8, 9]

    messages = [{"role": "user", "content": "hi"}]
    ctx = run(chat.new_context(request(messages=messages, chat_template_options={"add_generation_prompt": False})))
    text = reference_render(CHATML, messages=messages, add_generation_prompt=False)
    assert ctx.prompt_tokens.tolist() == Tokenizer.from_file(LLAMA / "tokenizer.json").encode(
        text, add_special_tokens=False
    )


def test_new_context_caps_max_new_tokens(tiny):
    # 120-token prompt, max_length 128: at most 8 new tokens.
    ctx = run(tiny.new_context(request(prompt="x" * 120, sampling_params=SamplingParams(max_new_tokens=16))))
    assert ctx.max_length == 128 and ctx.max_new_tokens == 8
    assert max_tokens_to_generate(120, 128, 16) == 8
    ctx = run(tiny.new_context(request(prompt="x" * 120, sampling_params=SamplingParams(max_new_tokens=4))))
    assert ctx.max_length == 124 and ctx.max_new_tokens == 4
    ctx = run(tiny.new_context(request(prompt="x" * 127)))  # one token left
    assert ctx.max_length == 128 and ctx.max_new_tokens == 1
    ctx.update(65)
    assert ctx.status.name == "MAXIMUM_LENGTH"


def test_new_context_eos_sets(tmp_path):
    tok = TextTokenizer(str(folder(tmp_path, generation_config={"eos_token_id": [2, 7]})))
    assert tok.eos == 2  # tokenizer_config names no eos_token: the first of generation_config.json's ids
    ctx = run(tok.new_context(request(prompt="a")))
    assert ctx.eos_token_ids == {2, 7}
    ctx = run(tok.new_context(request(prompt="a", sampling_params=SamplingParams(stop_token_ids=[40, 41]))))
    assert ctx.eos_token_ids == {2, 7, 40, 41}
    assert run(tok.new_context(request(prompt="a"))).eos_token_ids == {
        2,
        7,
    }  # the defaults were not changed by the request before
    ctx = run(
        tok.new_context(request(prompt="a", sampling_params=SamplingParams(ignore_eos=True, stop_token_ids=[40])))
    )
    assert ctx.eos_token_ids == set() and ctx.ignore_eos
    # Stop strings become token sequences (both the sampling params' and the request's).
    ctx = run(tok.new_context(request(prompt="a", stop=["!!"], sampling_params=SamplingParams(stop=["END", "!!"]))))
    assert ctx.eos_sequences == [list(b"END"), list(b"!!")]
    # An int eos_token_id in generation_config.json, and the pipeline config's model config.
    tok = TextTokenizer(str(folder(tmp_path, name="int", generation_config={"eos_token_id": 9})))
    assert run(tok.new_context(request(prompt="a"))).eos_token_ids == {2, 9}
    pipeline_config = SimpleNamespace(
        max_length=None, model_config=SimpleNamespace(huggingface_config={"eos_token_id": [11]})
    )
    tok = TextTokenizer(str(LLAMA), pipeline_config=pipeline_config)
    assert run(tok.new_context(request(prompt="a"))).eos_token_ids == {2, 11}


def test_new_context_ends_on_eos_and_stop_sequences(tmp_path):
    tok = TextTokenizer(str(folder(tmp_path, generation_config={"eos_token_id": 7})))
    ctx = run(tok.new_context(request(prompt="a", sampling_params=SamplingParams(stop=["ok"]))))
    ctx.update(111)
    ctx.update(107)  # "ok" generated
    assert ctx.status.name == "END_OF_SEQUENCE"
    ctx = run(tok.new_context(request(prompt="a")))
    ctx.update(7)
    assert ctx.status.name == "END_OF_SEQUENCE"


def test_new_context_logprobs_echo_and_json_schema(tiny):
    ctx = run(tiny.new_context(request(prompt="a", logprobs=3, echo=True)))
    assert ctx.log_probabilities == 3 and ctx.log_probabilities_echo is True
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    ctx = run(tiny.new_context(request(prompt="a", response_format={"type": "json_schema", "json_schema": schema})))
    assert json.loads(ctx.json_schema) == schema
    # OpenAI's shape wraps the schema with a name.
    ctx = run(
        tiny.new_context(
            request(
                prompt="a",
                response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}},
            )
        )
    )
    assert json.loads(ctx.json_schema) == schema
    ctx = run(tiny.new_context(request(prompt="a", response_format={"type": "json_object"})))
    assert json.loads(ctx.json_schema) == {"type": "object"}
    assert run(tiny.new_context(request(prompt="a", response_format={"type": "text"}))).json_schema is None
    with pytest.raises(ValueError, match="response_format.type must be"):
        run(tiny.new_context(request(prompt="a", response_format={"type": "grammar"})))
    with pytest.raises(ValueError, match="needs a 'json_schema' object"):
        run(tiny.new_context(request(prompt="a", response_format={"type": "json_schema"})))


def test_new_context_errors(tiny, chat):
    cases = [
        (request(), "has no prompt and no messages"),
        (request(prompt=""), "prompt is empty"),
        (request(prompt=[]), r"prompt is empty \(no token ids\)"),
        (request(prompt=[1, 256, 3]), r"prompt token ids must be in \[0, 256\); got \[256\] at positions \[1\]"),
        (request(prompt="x" * 128), "prompt has 128 tokens, max_length is 128"),
        (request(prompt=list(range(100)) * 2), "prompt has 200 tokens, max_length is 128"),
        (request(prompt="a", sampling_params=SamplingParams(max_new_tokens=0)), "sampling_params.max_new_tokens is 0"),
        (request(messages=[]), "messages is empty"),
    ]
    for req, message in cases:
        with pytest.raises(ValueError, match=message):
            run(chat.new_context(req))
    with pytest.raises(ValueError, match=r"messages is too long: prompt has \d+ tokens, max_length is 128"):
        run(chat.new_context(request(messages=[{"role": "user", "content": "y" * 120}])))
    with pytest.raises(ValueError, match=r"messages\[0\] has no 'content'"):
        run(chat.new_context(request(messages=[{"role": "user"}])))
    both = SimpleNamespace(prompt="a", messages=[{"role": "user", "content": "b"}])
    with pytest.raises(ValueError, match="both prompt and messages"):
        run(chat.new_context(both))


def test_max_length_sources(tmp_path):
    assert TextTokenizer(str(LLAMA)).max_length == 128  # config.json max_position_embeddings
    assert TextTokenizer(str(LLAMA), max_length=32).max_length == 32
    assert TextTokenizer(str(LLAMA), pipeline_config=SimpleNamespace(max_length=48)).max_length == 48
    only_tok = folder(
        tmp_path, name="tokcfg", config={"max_position_embeddings": ...}, tokenizer_config={"model_max_length": 64}
    )
    assert TextTokenizer(str(only_tok)).max_length == 64
    # Hugging Face's "no limit" sentinel is no limit: new_context then needs max_new_tokens.
    unlimited = folder(
        tmp_path,
        name="unlimited",
        config={"max_position_embeddings": ...},
        tokenizer_config={"model_max_length": int(1e30)},
    )
    tok = TextTokenizer(str(unlimited))
    assert tok.max_length is None
    with pytest.raises(ValueError, match="no max_length is known"):
        run(tok.new_context(request(prompt="a")))
    ctx = run(tok.new_context(request(prompt="abc", sampling_params=SamplingParams(max_new_tokens=5))))
    assert ctx.max_length == 8
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        TextTokenizer(str(LLAMA), max_length=0)


def test_context_validators(tiny):
    seen = []

    def reject_long(ctx):
        seen.append(ctx.request_id)
        if len(ctx.prompt_tokens) > 3:
            raise ValueError("prompt too long for this deployment")

    tok = TextTokenizer(str(LLAMA), context_validators=[reject_long])
    assert run(tok.new_context(request(prompt="abc"))).prompt_tokens.tolist() == list(b"abc")
    with pytest.raises(ValueError, match="too long for this deployment"):
        run(tok.new_context(request(prompt="abcd")))
    assert seen == ["r", "r"]


def test_new_context_concurrently(tiny):
    async def many():
        reqs = [request(request_id=RequestID(f"r{i}"), prompt="p" * (i + 1)) for i in range(16)]
        return await asyncio.gather(*(tiny.new_context(r) for r in reqs))

    ctxs = run(many())
    assert [len(c.prompt_tokens) for c in ctxs] == list(range(1, 17))
    assert [c.request_id for c in ctxs] == [f"r{i}" for i in range(16)]


def test_llama_whitespace_fix(tmp_path):
    llama = folder(tmp_path, tokenizer_config={"tokenizer_class": "LlamaTokenizerFast"})
    fixed = TextTokenizer(str(llama), enable_llama_whitespace_fix=True)
    plain = TextTokenizer(str(LLAMA), enable_llama_whitespace_fix=True)  # not a Llama tokenizer class: off
    assert fixed._enable_llama_whitespace_fix and not plain._enable_llama_whitespace_fix
    for token in (32, 104, 10):
        assert run(fixed.decode(np.array([token]))) == run(plain.decode([token])) == bytes([token]).decode()
    assert run(fixed.decode([104, 105])) == "hi"


# ─── module functions ────────────────────────────────────────────────────────


def test_max_tokens_to_generate():
    assert max_tokens_to_generate(10, 128) == 118
    assert max_tokens_to_generate(10, 128, 16) == 16
    assert max_tokens_to_generate(120, 128, 16) == 8
    assert max_tokens_to_generate(200, 128) == 0
    assert max_tokens_to_generate(200, 128, 5) == 0
    assert max_tokens_to_generate(10, None) is None
    assert max_tokens_to_generate(10, None, 7) == 7


def test_run_with_default_executor():
    async def go():
        return await run_with_default_executor(
            lambda a, b=0: (a + b, threading.current_thread() is threading.main_thread()), 2, b=3
        )

    assert run(go()) == (5, False)


# ─── the other tokenizers ────────────────────────────────────────────────────


def test_identity_pipeline_tokenizer():
    tok = IdentityPipelineTokenizer()
    assert run(tok.encode("abc")) == "abc" and run(tok.encode("abc", add_special_tokens=True)) == "abc"
    assert run(tok.decode("abc")) == "abc" and run(tok.decode(np.array([1, 2]))) == ""
    assert tok.eos == 0 and tok.expects_content_wrapping is False
    assert isinstance(tok, PipelineTokenizer)
    with pytest.raises(NotImplementedError):
        run(tok.new_context(request(prompt="a")))


class FakeHF:
    """A Hugging Face-like tokenizer: bytes as ids, a BOS of 1 when special tokens are added."""

    eos_token_id = 2
    vocab_size = 256

    def encode(self, text, add_special_tokens=True):
        return ([1] if add_special_tokens else []) + list(text.encode())

    def decode(self, ids, skip_special_tokens=False):
        ids = [int(i) for i in ids]
        if any(i < 0 or i >= 256 for i in ids):
            raise OverflowError("out of range integral type conversion attempted")
        return bytes(i for i in ids if not (skip_special_tokens and i in (1, 2))).decode()

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        assert tokenize is False
        return "".join(f"{m['role']}:{m['content']}\n" for m in messages) + (
            "assistant:" if add_generation_prompt else ""
        )


def test_pretrained_pipeline_tokenizer():
    tok = PreTrainedPipelineTokenizer(FakeHF())
    assert run(tok.encode("hi")).tolist() == [104, 105]
    assert run(tok.encode("hi", add_special_tokens=True)).tolist() == [1, 104, 105]
    assert run(tok.decode([1, 104, 105], skip_special_tokens=True)) == "hi"
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "user:x\nassistant:"
    assert tok.eos == 2 and tok.expects_content_wrapping is False and isinstance(tok, PipelineTokenizer)
    with pytest.raises(OverflowError, match=r"exceeding the vocabulary size \(256\) at indices \[1\]: \[300\]"):
        run(tok.decode(np.array([5, 300])))
    # maxfx's own Tokenizer works as a delegate too (no chat template of its own).
    mt = PreTrainedPipelineTokenizer(Tokenizer.from_file(LLAMA / "tokenizer.json"))
    assert run(mt.decode(run(mt.encode("wörld")))) == "wörld" and mt.eos is None
    with pytest.raises(ValueError, match="has no apply_chat_template"):
        mt.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(TypeError, match="has no encode"):
        PreTrainedPipelineTokenizer(object())


def test_text_and_vision_tokenizer_is_refused():
    with pytest.raises(
        NotImplementedError, match="vision-language models are not supported by maxfx: it has no vision encoders"
    ):
        TextAndVisionTokenizer("org/vlm", max_length=128, trust_remote_code=True)
    assert list(inspect.signature(TextAndVisionTokenizer).parameters) == [
        "model_path",
        "revision",
        "max_length",
        "trust_remote_code",
        "pipeline_config",
        "context_validators",
        "unused_kwargs",
    ]
    bare = object.__new__(TextAndVisionTokenizer)  # past the constructor: every member still says why
    assert bare.expects_content_wrapping is True
    with pytest.raises(NotImplementedError, match="TextAndVisionTokenizer.eos: vision-language"):
        bare.eos  # noqa: B018
    with pytest.raises(NotImplementedError, match="TextAndVisionTokenizer.apply_chat_template"):
        bare.apply_chat_template([])
    for name, args in (("encode", ("x",)), ("decode", ([1],)), ("new_context", (None,))):
        with pytest.raises(NotImplementedError, match=f"TextAndVisionTokenizer.{name}: vision-language"):
            run(getattr(bare, name)(*args))


def test_signatures_keep_maxs_names():
    params = inspect.signature(TextTokenizer).parameters
    assert list(params)[:9] == [
        "model_path",
        "revision",
        "max_length",
        "trust_remote_code",
        "enable_llama_whitespace_fix",
        "pipeline_config",
        "chat_template",
        "context_validators",
        "subfolder",
    ]
    assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in list(params)[1:9])
    assert list(inspect.signature(TextTokenizer.apply_chat_template).parameters) == [
        "self",
        "messages",
        "tools",
        "chat_template_options",
    ]
    assert inspect.signature(TextTokenizer.encode).parameters["add_special_tokens"].default is True
    assert inspect.signature(IdentityPipelineTokenizer.encode).parameters["add_special_tokens"].default is False
    assert inspect.signature(PreTrainedPipelineTokenizer.encode).parameters["add_special_tokens"].default is False
    assert list(inspect.signature(max_tokens_to_generate).parameters) == ["prompt_size", "max_length", "max_new_tokens"]
    assert set(tk.__all__) == {
        "IdentityPipelineTokenizer",
        "PreTrainedPipelineTokenizer",
        "TextAndVisionTokenizer",
        "TextTokenizer",
        "max_tokens_to_generate",
        "run_with_default_executor",
    }
