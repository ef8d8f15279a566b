"""maxfx.pipelines.core: the TextContext re-export, TextAndVisionContext, TTSContext and the vision validators."""

import numpy as np
import pytest

import maxfx.pipelines as pipelines
from maxfx.generation import TextContext as EngineTextContext
from maxfx.interfaces import GenerationStatus, ImageMetadata
from maxfx.pipelines import core
from maxfx.pipelines.core import (
    InputError,
    SPEECH_TOKEN_audio_chunk_size,
    TextAndVisionContext,
    TextContext,
    TTSContext,
    validate_aspect_ratio_args,
    validate_image_grid_thw_args,
    validate_image_shape_5d,
    validate_initial_prompt_has_image,
    validate_only_one_image,
    validate_requires_vision_context,
    validate_vision_position_ids,
)

V = 9  # the vision placeholder token of these tests


def _image(start, end, ndim=3):
    return ImageMetadata(start_idx=start, end_idx=end, pixel_values=np.zeros((1,) * (ndim - 1) + (2,), np.float32))


def _vision(tokens=(5, V, V, V, 6, V, V, 7), images=((1, 4), (5, 7)), **kwargs):
    return TextAndVisionContext(
        max_length=32, tokens=np.array(tokens), vision_token_ids=[V], images=[_image(s, e) for s, e in images], **kwargs
    )


def test_text_context_is_the_engines_class():
    assert TextContext is EngineTextContext
    assert pipelines.TextContext is EngineTextContext and pipelines.core is core
    assert issubclass(TextAndVisionContext, EngineTextContext) and issubclass(TTSContext, EngineTextContext)


# ─── TextAndVisionContext ─────────────────────────────────────────────────────


def test_vision_context_tracks_which_images_are_encoded():
    ctx = _vision(extra_model_args={"image_grid_thw": np.ones((2, 3))})
    assert ctx.vision_token_ids == [V] and len(ctx.images) == 2 and set(ctx.extra_model_args) == {"image_grid_thw"}
    assert (ctx.image_idx, ctx.needs_vision_encoding, [i.start_idx for i in ctx.next_images]) == (0, True, [1, 5])
    assert [ctx.compute_image_aligned_idx(i) for i in range(9)] == [0, 1, 1, 1, 4, 5, 5, 7, 8]
    ctx.set_token_indices(start_idx=4)  # the first image is in the cache now
    assert (ctx.image_idx, [i.start_idx for i in ctx.next_images]) == (1, [5])
    ctx.bump_token_indices(start_idx=3)  # start_idx 7: both encoded
    assert (ctx.image_idx, ctx.needs_vision_encoding, ctx.next_images) == (2, False, [])
    ctx.update(3)
    assert ctx.generated_tokens.tolist() == [3] and ctx.is_initial_prompt is False


def test_vision_context_refuses_cursors_that_cut_an_image_and_keeps_the_old_ones():
    ctx = _vision()
    with pytest.raises(ValueError, match="cut the image"):
        ctx.set_token_indices(active_idx=2, end_idx=2)
    assert (ctx.start_idx, ctx.active_idx, ctx.end_idx) == (0, 8, 8)
    with pytest.raises(ValueError, match="must equal end_idx"):
        ctx.set_token_indices(end_idx=12)  # a reserved range: chunked prefill, which vision models do not do
    assert ctx.end_idx == 8


@pytest.mark.parametrize(
    ("tokens", "images", "message"),
    [
        ((5, V, V, V, 6, V, V, 7), ((5, 7), (1, 4)), "sorted"),
        ((5, V, V, V, V, V, V, 7), ((1, 4), (3, 6)), "overlap"),
        ((5, V, V, 6), ((1, 6),), "past the"),
        ((5, V, 1, 6), ((1, 3),), "vision tokens"),
    ],
)
def test_vision_context_checks_its_images(tokens, images, message):
    with pytest.raises(ValueError, match=message):
        _vision(tokens=tokens, images=images)


# ─── TTSContext ───────────────────────────────────────────────────────────────


def test_tts_context_fields_and_done_from_the_audio_status():
    ctx = TTSContext(
        max_length=16, tokens=np.array([1, 2]), audio_prompt_tokens=[4, 5], streaming=True, prev_samples_beyond_offset=3
    )
    assert ctx.audio_prompt_tokens.tolist() == [4, 5] and ctx.audio_prompt_tokens.dtype == np.int32
    assert (
        ctx.streaming,
        ctx.prev_samples_beyond_offset,
        ctx.decoded_index,
        ctx.buffer_speech_tokens,
        ctx.audio_buffer,
    ) == (True, 3, 0, None, None)
    assert ctx.audio_generation_status is GenerationStatus.ACTIVE and not ctx.is_done
    ctx.update(2)  # text EOS does not end a TTS request: the audio side decides
    ctx.audio_generation_status = GenerationStatus.END_OF_SEQUENCE
    assert ctx.is_done


def test_tts_speech_tokens_grow_past_a_chunk_and_come_out_in_chunks():
    ctx = TTSContext(max_length=16, tokens=np.array([1]))
    first = np.arange(100)
    second = np.arange(100, 100 + SPEECH_TOKEN_audio_chunk_size + 5)
    ctx.update_speech_tokens(first)
    ctx.update_speech_tokens(second)
    assert ctx.block_counter == 2
    assert ctx.speech_tokens.tolist() == np.concatenate([first, second]).tolist()
    chunk, lead = ctx.next_speech_tokens(audio_chunk_size=10)
    assert chunk.tolist() == list(range(10)) and lead == 0
    ctx.decoded_index = 50
    chunk, lead = ctx.next_speech_tokens(audio_chunk_size=10, buffer=4)
    assert chunk.tolist() == list(range(46, 60)) and lead == 4
    chunk, lead = ctx.next_speech_tokens(buffer=80)  # the lead is bounded by what was decoded
    assert lead == 50 and chunk[0] == 0 and chunk[-1] == 100 + SPEECH_TOKEN_audio_chunk_size + 4
    assert ctx.decoded_index == 50  # next_speech_tokens does not move it


# ─── validators ───────────────────────────────────────────────────────────────


def test_text_contexts_pass_the_vision_validators_except_the_vision_requirement():
    text = TextContext(max_length=8, tokens=np.array([1, 2]))
    for validator in (
        validate_only_one_image,
        validate_initial_prompt_has_image,
        validate_aspect_ratio_args,
        validate_image_shape_5d,
        validate_image_grid_thw_args,
        validate_vision_position_ids,
    ):
        validator(text)
    with pytest.raises(InputError, match="requires a TextAndVisionContext, got TextContext"):
        validate_requires_vision_context(text)
    validate_requires_vision_context(_vision())
    assert issubclass(InputError, ValueError)


def test_vision_validators_check_images_and_model_args():
    two = _vision()
    with pytest.raises(InputError, match="only one image per request, got 2"):
        validate_only_one_image(two)
    validate_only_one_image(_vision(images=((1, 4),)))
    with pytest.raises(InputError, match="prompt with an image"):
        validate_initial_prompt_has_image(_vision(tokens=(1, 2, 3), images=()))
    validate_initial_prompt_has_image(two)
    with pytest.raises(InputError, match="aspect_ratio_ids"):
        validate_aspect_ratio_args(two)
    with pytest.raises(InputError, match="aspect_ratio_mask"):
        validate_aspect_ratio_args(_vision(extra_model_args={"aspect_ratio_ids": np.zeros(1)}))
    validate_aspect_ratio_args(
        _vision(extra_model_args={"aspect_ratio_ids": np.zeros(1), "aspect_ratio_mask": np.zeros(1)})
    )
    with pytest.raises(InputError, match="expected 5 dimensions, got 3"):
        validate_image_shape_5d(two)
    validate_image_shape_5d(
        TextAndVisionContext(
            max_length=32, tokens=np.array([5, V, V]), vision_token_ids=[V], images=[_image(1, 3, ndim=5)]
        )
    )
    for validator, key in (
        (validate_image_grid_thw_args, "image_grid_thw"),
        (validate_vision_position_ids, "vision_position_ids"),
    ):
        with pytest.raises(InputError, match=key):
            validator(two)
        validator(_vision(extra_model_args={key: np.zeros(1)}))
        encoded = _vision()
        encoded.set_token_indices(start_idx=8)  # every image encoded: nothing needed any more
        validator(encoded)
