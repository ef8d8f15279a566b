"""``maxfx serve`` driven by the official ``openai`` client (sync and async) on 127.0.0.1.

References nobody here wrote or that are independent of the server: the
fixture's transformers goldens (``golden_text.json``), a numpy forward pass of
the fixture's weights (`tests.pipelines.test_embeddings`), the chat template
rendered by jinja2, ``jsonschema`` for structured output.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import jinja2
import jsonschema
import numpy as np
import openai
import pytest

from tests.pipelines.test_embeddings import _head, reference_hidden, reference_pool
from tests.serve.conftest import CHAT_TEMPLATE, TINY, Server

GOLDEN = json.loads((TINY / "golden_text.json").read_text())
CASE = GOLDEN["cases"][1]  # "hello, world"


def client(server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120, **kw)


def aclient(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def numpy_logprobs(ids: list[int]) -> np.ndarray:
    """log_softmax of the fixture's logits at every position (numpy float64 forward pass)."""
    logits = _head("tiny_llama", reference_hidden("tiny_llama", ids))
    logits = logits - logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def numpy_greedy(ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(numpy_logprobs(ids)[-1])))
        ids.append(out[-1])
    return out


def chat_prompt_ids(messages, tools=None) -> list[int]:
    """The byte tokenizer's ids of the rendered chat template (ids are the UTF-8 bytes)."""
    text = (
        jinja2.Environment()
        .from_string(CHAT_TEMPLATE)
        .render(messages=messages, tools=tools, add_generation_prompt=True)
    )
    return list(text.encode())


def test_models_list_and_get(server):
    c = client(server)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    assert c.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("nope")


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["prompt"])
def test_completion_equals_transformers_golden(server, case):
    c = client(server)
    n = GOLDEN["greedy_new_tokens"]
    r = c.completions.create(model="tiny", prompt=case["prompt"], max_tokens=n, temperature=0)
    assert r.choices[0].text == case["completion"]
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        len(case["prompt_ids"]),
        n,
        len(case["prompt_ids"]) + n,
    )
    ids = c.completions.create(model="tiny", prompt=case["prompt_ids"], max_tokens=n, temperature=0)
    assert ids.choices[0].text == case["completion"]


def test_completion_list_of_prompts_in_order(server):
    c = client(server)
    prompts = [case["prompt"] for case in GOLDEN["cases"]]
    r = c.completions.create(model="tiny", prompt=prompts, max_tokens=GOLDEN["greedy_new_tokens"], temperature=0)
    assert [ch.index for ch in r.choices] == [0, 1]
    assert [ch.text for ch in r.choices] == [case["completion"] for case in GOLDEN["cases"]]
    both = c.completions.create(
        model="tiny", prompt=[case["prompt_ids"] for case in GOLDEN["cases"]], max_tokens=4, temperature=0
    )
    assert [ch.text for ch in both.choices] == [
        c2.text for c2 in c.completions.create(model="tiny", prompt=prompts, max_tokens=4, temperature=0).choices
    ]


def test_chat_equals_numpy_greedy_of_the_template(server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    r = client(server).chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    prompt = chat_prompt_ids(messages)
    expected = numpy_greedy(prompt, 8)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == bytes(expected).decode("utf-8", errors="replace")
    assert r.usage.prompt_tokens == len(prompt)


def test_streamed_deltas_concatenate_to_the_text(server):
    c = client(server)
    full = c.completions.create(model="tiny", prompt=CASE["prompt"], max_tokens=12, temperature=0).choices[0].text
    chunks = list(c.completions.create(model="tiny", prompt=CASE["prompt"], max_tokens=12, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == full
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.usage is None for ch in chunks)

    messages = [{"role": "user", "content": "stream please"}]
    text = (
        c.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
        .choices[0]
        .message.content
    )
    stream = list(
        c.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == text
    usage = [ch for ch in stream if ch.usage is not None]
    assert len(usage) == 1 and usage[0] is stream[-1] and stream[-1].choices == []
    assert usage[0].usage.completion_tokens == 10


def test_stop_strings_and_stop_tokens_finish_with_stop(server):
    c = client(server)
    golden = CASE["completion"]
    stop = golden[golden.index("IJ") : golden.index("IJ") + 2]  # "I" and "J" are two tokens: the stop string spans them
    r = c.completions.create(model="tiny", prompt=CASE["prompt"], max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].text == golden[: golden.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = list(
        c.completions.create(model="tiny", prompt=CASE["prompt"], max_tokens=16, temperature=0, stop=stop, stream=True)
    )
    assert "".join(ch.choices[0].text for ch in streamed) == r.choices[0].text
    assert streamed[-1].choices[0].finish_reason == "stop"
    # A stop token id (the golden's 6th token) ends the request like EOS: "stop", the token's text not shown.
    ids = CASE["new_ids"]
    r2 = c.completions.create(
        model="tiny", prompt=CASE["prompt"], max_tokens=16, temperature=0, extra_body={"stop_token_ids": [ids[5]]}
    )
    assert r2.choices[0].finish_reason == "stop"
    assert r2.usage.completion_tokens == 6
    assert r2.choices[0].text == bytes(ids[:5]).decode("utf-8", errors="replace")


def test_seeded_sampling_is_reproducible(server):
    c = client(server)

    def run(seed):
        return (
            c.completions.create(model="tiny", prompt="the graph", max_tokens=16, temperature=0.8, seed=seed)
            .choices[0]
            .text
        )

    first = run(1234)
    assert run(1234) == first
    assert any(run(s) != first for s in (1, 2, 3))


def test_logprobs_equal_numpy_log_softmax(server):
    c = client(server)
    messages = [{"role": "user", "content": "hello"}]
    r = c.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 6 and all(len(e.top_logprobs) == 3 for e in content)
    prompt = chat_prompt_ids(messages)
    generated = numpy_greedy(prompt, 6)
    ref = numpy_logprobs(prompt + generated)
    for i, (entry, tok) in enumerate(zip(content, generated)):
        row = ref[len(prompt) - 1 + i]
        assert abs(entry.logprob - row[tok]) < 1e-4
        assert entry.top_logprobs[0].logprob == pytest.approx(row.max(), abs=1e-4)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(np.sort(row)[::-1][:3], abs=1e-4)
    comp = c.completions.create(model="tiny", prompt=CASE["prompt"], max_tokens=4, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    ref = numpy_logprobs(CASE["prompt_ids"] + CASE["new_ids"][:4])
    for i, value in enumerate(lp.token_logprobs):
        assert abs(value - ref[len(CASE["prompt_ids"]) - 1 + i][CASE["new_ids"][i]]) < 1e-4
    assert lp.text_offset == [0, 1, 2, 3] or len(lp.text_offset) == 4


SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_output_parses_and_validates(server):
    c = client(server)
    for seed in (0, 1):
        r = c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "a person"}], max_tokens=60, temperature=0.7, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}},
        )  # fmt: skip
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    bad = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}},
    }
    with pytest.raises(openai.BadRequestError, match="schema"):
        c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4, response_format=bad
        )


def test_tool_call_comes_back_as_tool_calls(server):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                    "required": ["city"],
                },
            },
        }
    ]
    c = client(server)
    r = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather?"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=40,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    required = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather?"}],
        tools=tools,
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    (call,) = required.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")


def test_sixteen_concurrent_async_requests_equal_sequential(server):
    c = client(server)
    prompts = [f"prompt number {i} " + "x" * (i * 3) for i in range(16)]
    lengths = [4 + (i % 5) * 3 for i in range(16)]
    sequential = [
        c.completions.create(model="tiny", prompt=p, max_tokens=n, temperature=0).choices[0].text
        for p, n in zip(prompts, lengths)
    ]
    before = server.metric('maxserve_request_count_total{code="200",path="/v1/completions"}')

    async def together():
        ac = aclient(server)
        rs = await asyncio.gather(
            *(
                ac.completions.create(model="tiny", prompt=p, max_tokens=n, temperature=0)
                for p, n in zip(prompts, lengths)
            )
        )
        await ac.close()
        return [r.choices[0].text for r in rs]

    assert asyncio.run(together()) == sequential
    assert server.metric('maxserve_request_count_total{code="200",path="/v1/completions"}') == before + 16
    assert server.metric("maxserve_num_requests_running") == 0


def test_closed_stream_frees_its_request(server):
    c = client(server)
    stream = c.completions.create(
        model="tiny", prompt="a long one", max_tokens=100, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    for i, _ in enumerate(stream):
        if i == 1:
            break
    stream.close()
    deadline = time.monotonic() + 1.0
    while server.metric("maxserve_num_requests_running") != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("maxserve_num_requests_running") == 0
    assert server.metric("maxserve_request_cancelled_total") >= 1
    assert (
        c.completions.create(model="tiny", prompt=CASE["prompt"], max_tokens=16, temperature=0).choices[0].text
        == CASE["completion"]
    )


def test_client_exception_types(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 128"):
        c.completions.create(model="tiny", prompt="hi", max_tokens=500)
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        c.completions.create(model="tiny", prompt="hi", max_tokens=2, n=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        c.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=3)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="other", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="stop"):
        c.completions.create(model="tiny", prompt="hi", max_tokens=2, stop=[""])


def test_wrong_api_key_is_401(tmp_path):
    srv = Server("--api-key", "sekret", "--no-warmup", log=tmp_path / "auth.log")
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekret", max_retries=0).models.list()
        assert ok.data[0].id == "tiny_llama"
        assert httpx.get(srv.url + "/health").status_code == 200  # health needs no key
    finally:
        code = srv.stop()
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the SIGTERM it handled, after a graceful shutdown
    assert "engine stopped" in srv.log.read_text()


def test_embeddings_equal_numpy_pooling(server):
    r = client(server).embeddings.create(model="tiny", input=["ab", "hello"])
    assert [d.index for d in r.data] == [0, 1]
    for d, text in zip(r.data, ["ab", "hello"]):
        ref = reference_pool(reference_hidden("tiny_llama", list(text.encode())), "mean")
        np.testing.assert_allclose(d.embedding, ref, rtol=0, atol=2e-4)
    assert r.usage.prompt_tokens == 7
    floats = httpx.post(server.url + "/v1/embeddings", json={"input": "ab", "encoding_format": "float"}).json()["data"][
        0
    ]["embedding"]
    np.testing.assert_allclose(floats, r.data[0].embedding, rtol=0, atol=1e-6)  # the client decoded base64, its default


def test_tokenize_detokenize(server):
    t = httpx.post(server.url + "/tokenize", json={"prompt": "hi"}).json()
    assert t["tokens"] == [104, 105] and t["count"] == 2 and t["max_model_len"] == 128
    assert httpx.post(server.url + "/detokenize", json={"tokens": [104, 105]}).json() == {"prompt": "hi"}


def test_echo_returns_the_prompt_and_its_log_probabilities(server):
    c = client(server)
    r = c.completions.create(model="tiny", prompt=CASE["prompt"], max_tokens=3, temperature=0, echo=True, logprobs=1)
    choice = r.choices[0]
    assert choice.text == CASE["prompt"] + bytes(CASE["new_ids"][:3]).decode("utf-8", errors="replace")
    n = len(CASE["prompt_ids"])
    lp = choice.logprobs
    assert len(lp.token_logprobs) == n + 3 and lp.token_logprobs[0] is None
    ref = numpy_logprobs(CASE["prompt_ids"] + CASE["new_ids"][:3])
    ids = CASE["prompt_ids"] + CASE["new_ids"][:3]
    for p in range(1, n + 3):
        assert abs(lp.token_logprobs[p] - ref[p - 1][ids[p]]) < 1e-4
    streamed = list(
        c.completions.create(model="tiny", prompt=CASE["prompt"], max_tokens=3, temperature=0, echo=True, stream=True)
    )
    assert "".join(ch.choices[0].text for ch in streamed) == choice.text
