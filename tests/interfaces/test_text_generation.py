"""TextGenerationRequest / Output / Inputs, LogProbabilities, embeddings and audio data types."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from maxfx.interfaces import (
    AudioGenerationInputs,
    AudioGenerationMetadata,
    AudioGenerationOutput,
    AudioGenerationRequest,
    BatchType,
    EmbeddingsGenerationInputs,
    EmbeddingsGenerationOutput,
    GenerationStatus,
    ImageMetadata,
    LogProbabilities,
    RequestID,
    SamplingParams,
    TextGenerationInputs,
    TextGenerationOutput,
    TextGenerationRequest,
)


def test_request_defaults_follow_max():
    req = TextGenerationRequest(request_id=RequestID("r"), model_name="m")
    assert (req.prompt, req.messages, req.images, req.tools, req.response_format) == (None,) * 5
    assert (req.timestamp_ns, req.request_path, req.logprobs, req.echo, req.stop) == (0, "/", 0, False, None)
    assert (req.chat_template_options, req.target_endpoint) == (None, None)
    assert isinstance(req.sampling_params, SamplingParams)
    assert str(req) == "r"
    names = [f.name for f in dataclasses.fields(TextGenerationRequest)]
    assert names == [
        "request_id",
        "model_name",
        "prompt",
        "messages",
        "images",
        "tools",
        "response_format",
        "timestamp_ns",
        "request_path",
        "logprobs",
        "echo",
        "stop",
        "chat_template_options",
        "sampling_params",
        "target_endpoint",
    ]


def test_request_fields_and_each_request_gets_its_own_sampling_params():
    tool = {"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}}
    req = TextGenerationRequest(
        request_id="c1",
        model_name="m",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        tools=[tool],
        response_format={"type": "json_schema", "json_schema": {"type": "object"}},
        logprobs=3,
    )
    assert type(req.request_id) is RequestID
    assert req.tools[0]["function"]["name"] == "f"
    other = TextGenerationRequest(request_id="c2", model_name="m")
    assert req.sampling_params is not other.sampling_params


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, ValueError, "prompt or messages, not both"),
        ({"messages": [{"role": "robot", "content": "x"}]}, ValueError, r"messages\[0\]\['role'\] must be one of"),
        ({"messages": ["hello"]}, TypeError, r"messages\[0\] must be a dict"),
        ({"prompt": [1, "2"]}, TypeError, "prompt must be a str or a sequence of int"),
        ({"prompt": "look", "images": [b"\x89PNG"]}, ValueError, "images need messages"),
        ({"prompt": "x", "logprobs": -1}, ValueError, "logprobs must be an int >= 0, got -1"),
        (
            {"prompt": "x", "sampling_params": {"top_k": 1}},
            TypeError,
            "sampling_params must be a SamplingParams, got dict",
        ),
    ],
)
def test_request_validation(kwargs, error, message):
    with pytest.raises(error, match=message):
        TextGenerationRequest(request_id=RequestID(), model_name="m", **kwargs)


def test_request_token_id_prompt():
    assert list(TextGenerationRequest(request_id="t", model_name="m", prompt=[1, 2, 3]).prompt) == [1, 2, 3]


def test_output_is_done_and_coercions():
    out = TextGenerationOutput(request_id="r", tokens=[1], final_status="active")
    assert out.final_status is GenerationStatus.ACTIVE and not out.is_done
    assert type(out.request_id) is RequestID
    assert TextGenerationOutput(RequestID("r"), [], GenerationStatus.CANCELLED).is_done


def test_output_merge():
    lp = LogProbabilities([-0.5], [{1: -0.5}])
    a = TextGenerationOutput("r", [1], GenerationStatus.ACTIVE, [lp])
    b = TextGenerationOutput("r", [2], GenerationStatus.MAXIMUM_LENGTH, [lp])
    m = TextGenerationOutput.merge([a, b])
    assert (m.tokens, m.final_status, len(m.log_probabilities)) == ([1, 2], GenerationStatus.MAXIMUM_LENGTH, 2)
    with pytest.raises(ValueError, match="some outputs have log_probabilities"):
        TextGenerationOutput.merge([a, TextGenerationOutput("r", [3], GenerationStatus.ACTIVE)])
    with pytest.raises(ValueError, match="different requests"):
        TextGenerationOutput.merge([a, TextGenerationOutput("q", [3], GenerationStatus.ACTIVE, [lp])])
    with pytest.raises(ValueError, match="at least one"):
        TextGenerationOutput.merge([])


def test_log_probabilities_lengths_must_match():
    with pytest.raises(ValueError, match="one entry per position, got 2 and 1"):
        LogProbabilities([-0.1, -0.2], [{1: -0.1}])


def _ctx(top, echo):
    return SimpleNamespace(log_probabilities=top, log_probabilities_echo=echo)


def test_inputs_summaries_over_replicas():
    inputs = TextGenerationInputs(
        batches=[{RequestID("a"): _ctx(0, False), RequestID("b"): _ctx(2, False)}, {RequestID("c"): _ctx(0, True)}],
        num_steps=3,
    )
    assert list(inputs.batch) == ["a", "b", "c"]
    assert inputs.batch_top_log_probs == [0, 2, 0]
    assert inputs.batch_echo == [False, False, True]
    assert inputs.enable_log_probs and inputs.enable_echo
    assert (inputs.num_steps, inputs.input_tokens, inputs.batch_type) == (3, -1, BatchType.TG)


def test_inputs_without_logprobs_or_echo():
    inputs = TextGenerationInputs([{RequestID("a"): _ctx(0, False)}], num_steps=1, input_tokens=12, batch_type="CE")
    assert not inputs.enable_log_probs and not inputs.enable_echo
    assert inputs.batch_type is BatchType.CE and inputs.input_tokens == 12
    assert TextGenerationInputs([], num_steps=1).batch == {}


def test_inputs_validation():
    with pytest.raises(TypeError, match="must be a list of per-replica dicts"):
        TextGenerationInputs(batches={RequestID("a"): _ctx(0, False)}, num_steps=1)
    with pytest.raises(ValueError, match="num_steps must be an int >= 1, got 0"):
        TextGenerationInputs([{}], num_steps=0)
    dup = TextGenerationInputs([{RequestID("a"): _ctx(0, False)}, {RequestID("a"): _ctx(0, False)}], num_steps=1)
    with pytest.raises(ValueError, match="appears in more than one replica batch"):
        _ = dup.batch


def test_embeddings_inputs_and_output():
    inputs = EmbeddingsGenerationInputs([{RequestID("a"): 1}, {RequestID("b"): 2}])
    assert inputs.batch == {"a": 1, "b": 2}
    out = EmbeddingsGenerationOutput([0.5, 0.25])
    assert out.is_done and out.embeddings.dtype == np.float64
    assert out == EmbeddingsGenerationOutput(np.array([0.5, 0.25]))
    assert out != EmbeddingsGenerationOutput(np.array([0.5, 0.0]))
    with pytest.raises(TypeError, match="floating-point array, got dtype int64"):
        EmbeddingsGenerationOutput(np.arange(3, dtype=np.int64))


def test_audio_types():
    req = AudioGenerationRequest(request_id="a", model="tts", input="hi")
    assert (
        req.audio_prompt_tokens,
        req.audio_prompt_transcription,
        req.streaming,
        req.prompt,
        req.buffer_speech_tokens,
    ) == ([], "", True, None, None)
    with pytest.raises(ValueError, match="needs input"):
        AudioGenerationRequest(request_id="a", model="tts")
    with pytest.raises(ValueError, match="more than 4096"):
        AudioGenerationRequest(request_id="a", model="tts", input="x" * 4097)
    meta = AudioGenerationMetadata(sample_rate=24000, final_chunk=True)
    assert meta.to_dict() == {"sample_rate": 24000, "final_chunk": True}
    out = AudioGenerationOutput("end_of_sequence", 4, audio_data=[0.1, 0.2], metadata=meta)
    assert out.is_done and out.audio_data.dtype == np.float32
    assert AudioGenerationInputs(batch={RequestID("a"): "ctx"}).batch == {"a": "ctx"}
    with pytest.raises(TypeError, match="batch must be a dict"):
        AudioGenerationInputs(batch=["ctx"])


def test_image_metadata():
    img = ImageMetadata(start_idx=1, end_idx=5, pixel_values=np.zeros((3, 4, 4), np.float32))
    assert img.image_hash == -1
    with pytest.raises(ValueError, match="0 <= start_idx < end_idx, got start_idx=5, end_idx=5"):
        ImageMetadata(start_idx=5, end_idx=5, pixel_values=np.zeros(1))
    with pytest.raises(TypeError):
        ImageMetadata(1, 5, np.zeros(1))  # keyword-only, as in MAX
