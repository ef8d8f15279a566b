"""msgpack wire format: typed round trips of the interface types with numpy arrays, shared memory, pickling."""

import pickle

import numpy as np
import pytest

from maxfx.interfaces import (
    AudioGenerationOutput,
    EmbeddingsGenerationOutput,
    GenerationStatus,
    ImageMetadata,
    LogProbabilities,
    LoRAOperation,
    LoRARequest,
    RequestID,
    SamplingParams,
    SchedulerResult,
    SharedMemoryArray,
    TextGenerationContext,
    TextGenerationOutput,
    TextGenerationRequest,
    init_text_generation_state,
    msgpack_eq,
    msgpack_numpy_decoder,
    msgpack_numpy_encoder,
)
from maxfx.interfaces._shared_memory import ndarray_to_shared_memory, open_shm_array


def roundtrip(obj, tp, **enc_kw):
    return msgpack_numpy_decoder(tp)(msgpack_numpy_encoder(**enc_kw)(obj))


def test_text_generation_request_roundtrip():
    req = TextGenerationRequest(
        request_id=RequestID("r1"),
        model_name="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
        logprobs=2,
        stop=["\n\n"],
        sampling_params=SamplingParams(top_k=5, temperature=0.5, stop_token_ids=[7], seed=11),
    )
    back = roundtrip(req, TextGenerationRequest)
    assert back == req
    assert type(back.request_id) is RequestID and type(back.sampling_params) is SamplingParams
    assert back.sampling_params.seed == 11 and back.sampling_params.stop_token_ids == [7]


def test_text_generation_output_with_log_probabilities_roundtrip():
    out = TextGenerationOutput(
        RequestID("r"),
        [4, 5],
        GenerationStatus.END_OF_SEQUENCE,
        [LogProbabilities([-0.25, -1.0], [{4: -0.25, 9: -3.5}, {5: -1.0}])],
    )
    back = roundtrip(out, TextGenerationOutput)
    assert back == out
    assert back.final_status is GenerationStatus.END_OF_SEQUENCE
    assert list(back.log_probabilities[0].top_log_probabilities[0]) == [4, 9]  # int keys survive


def test_scheduler_results_dict_roundtrip():
    tp = dict[RequestID, SchedulerResult[TextGenerationOutput]]
    msg = {
        RequestID("a"): SchedulerResult.create(TextGenerationOutput("a", [1], GenerationStatus.ACTIVE)),
        RequestID("b"): SchedulerResult.cancelled(),
    }
    back = roundtrip(msg, tp)
    assert back == msg and type(back["a"].result) is TextGenerationOutput
    assert not back["a"].is_done and back["b"].is_done and back["b"].result is None
    assert all(type(k) is RequestID for k in back)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_, np.complex64])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 4)])
def test_numpy_arrays_keep_dtype_and_shape(dtype, shape, rng):
    array = np.asarray(rng.standard_normal(shape) * 10).astype(dtype)
    back = roundtrip({"x": array}, dict[str, np.ndarray])["x"]
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    assert back.flags.writeable and back.flags.owndata


def test_non_contiguous_array_and_copy_false():
    array = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2].T
    data = msgpack_numpy_encoder()(array)
    view = msgpack_numpy_decoder(np.ndarray, copy=False)(data)
    np.testing.assert_array_equal(view, array)
    assert not view.flags.writeable  # a view of the message bytes
    assert msgpack_numpy_decoder(np.ndarray)(data).flags.writeable


def test_embeddings_audio_image_roundtrip(rng):
    emb = EmbeddingsGenerationOutput(rng.standard_normal((2, 8)).astype(np.float32))
    assert msgpack_eq(roundtrip(emb, EmbeddingsGenerationOutput), emb)
    audio = AudioGenerationOutput(
        GenerationStatus.ACTIVE,
        2,
        audio_data=np.linspace(0, 1, 5, dtype=np.float32),
        buffer_speech_tokens=np.array([3, 4]),
    )
    back = roundtrip(audio, AudioGenerationOutput)
    assert back == audio and back.buffer_speech_tokens.dtype == np.int64
    img = ImageMetadata(
        start_idx=0, end_idx=4, pixel_values=rng.standard_normal((3, 2, 2)).astype(np.float32), image_hash=123
    )
    assert roundtrip([img], list[ImageMetadata]) == [img]


def test_lora_and_sets_tuples_enums():
    assert roundtrip(LoRARequest(LoRAOperation.LOAD, "a", "/p"), LoRARequest) == LoRARequest(
        LoRAOperation.LOAD, "a", "/p"
    )
    assert roundtrip({1, 3, 2}, set[int]) == {1, 2, 3}
    assert roundtrip((1, "a"), tuple[int, str]) == (1, "a")
    assert roundtrip([1, 2], tuple[int, ...]) == (1, 2)
    assert roundtrip(GenerationStatus.CANCELLED, GenerationStatus) is GenerationStatus.CANCELLED
    assert roundtrip(np.int64(3), int) == 3


def test_untyped_decoding_restores_arrays():
    back = roundtrip({"a": [np.ones(2, np.float32)], "b": 1}, dict)
    assert back["b"] == 1 and back["a"][0].dtype == np.float32


def test_shared_memory_path(rng):
    big = rng.standard_normal((256, 256)).astype(np.float32)  # 256 KiB
    small = np.arange(4, dtype=np.int32)
    enc = msgpack_numpy_encoder(use_shared_memory=True, shared_memory_threshold=64 * 1024)
    data = enc({"big": big, "small": small})
    assert len(data) < 1024  # only the segment name travels for the big array
    back = msgpack_numpy_decoder(dict[str, np.ndarray])(data)
    np.testing.assert_array_equal(back["big"], big)
    np.testing.assert_array_equal(back["small"], small)
    with pytest.raises(FileNotFoundError):  # the decoder freed the segment
        msgpack_numpy_decoder(dict[str, np.ndarray])(data)


def test_shared_memory_array_placeholder():
    ref = ndarray_to_shared_memory(np.full((2, 2), 7, np.int16))
    assert isinstance(ref, SharedMemoryArray) and ref.shape == (2, 2) and ref.dtype == "int16"
    back = roundtrip({"pixels": ref}, dict[str, np.ndarray])  # a placeholder decodes to the array
    assert back["pixels"].tolist() == [[7, 7], [7, 7]]
    with pytest.raises(FileNotFoundError):
        open_shm_array(ref)


def test_encoder_and_decoder_pickle():
    enc = pickle.loads(pickle.dumps(msgpack_numpy_encoder(use_shared_memory=True, shared_memory_threshold=10)))
    dec = pickle.loads(pickle.dumps(msgpack_numpy_decoder(TextGenerationOutput, copy=False)))
    assert (enc.use_shared_memory, enc.shared_memory_threshold, dec.copy) == (True, 10, False)
    out = TextGenerationOutput("r", [1], GenerationStatus.ACTIVE)
    assert dec(enc(out)) == out


def test_errors():
    with pytest.raises(TypeError, match="cannot encode function"):
        msgpack_numpy_encoder()(SamplingParams(logits_processors=[lambda x: None]))
    with pytest.raises(TypeError, match="dtype=object"):
        msgpack_numpy_encoder()(np.array([object()]))
    with pytest.raises(TypeError, match="has no field"):
        msgpack_numpy_decoder(TextGenerationOutput)(
            msgpack_numpy_encoder()({"request_id": "r", "tokens": [], "final_status": "active", "extra": 1})
        )
    with pytest.raises(TypeError, match="expected int, got str"):
        msgpack_numpy_decoder(list[int])(msgpack_numpy_encoder()(["x"]))
    with pytest.raises(ValueError, match="shared_memory_threshold must be an int >= 0"):
        msgpack_numpy_encoder(shared_memory_threshold=-1)


class Ctx(TextGenerationContext):
    def __init__(self, **kw):
        init_text_generation_state(self, **kw)


def test_state_backed_context_roundtrip():
    ctx = Ctx(request_id="c", tokens=[1, 2, 3], eos_token_ids={0, 2}, sampling_params=SamplingParams(seed=5))
    ctx.update(9, LogProbabilities([-0.5], [{9: -0.5}]))
    back = roundtrip(ctx, Ctx)
    assert type(back) is Ctx and back.request_id == "c" and back.status is GenerationStatus.ACTIVE
    assert back.all_tokens.tolist() == [1, 2, 3, 9] and back.next_tokens.tolist() == [9]
    assert back.sampling_params == ctx.sampling_params
    back.update(0)
    out = back.to_generation_output()
    assert back.is_done and out.tokens == [9, 0]
    assert out.log_probabilities == [LogProbabilities([-0.5], [{9: -0.5}])]  # pending state decoded to its type
    assert back.eos_token_ids == {0, 2}


def test_msgpack_eq():
    a = TextGenerationOutput("r", [1], GenerationStatus.ACTIVE)
    assert msgpack_eq(a, TextGenerationOutput("r", [1], GenerationStatus.ACTIVE))
    assert not msgpack_eq(a, TextGenerationOutput("r", [2], GenerationStatus.ACTIVE))
    assert not msgpack_eq(np.zeros(2, np.float32), np.zeros(2, np.float64))
    assert not msgpack_eq(a, "r")
