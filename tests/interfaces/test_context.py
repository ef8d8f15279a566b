"""The context protocols: isinstance on duck-typed classes, and the state-backed defaults."""

import numpy as np
import pytest

from maxfx.interfaces import (
    BaseContext,
    EmbeddingsContext,
    GenerationStatus,
    ImageMetadata,
    LogProbabilities,
    RequestID,
    SamplingParams,
    TextGenerationContext,
    VLMTextGenerationContext,
    init_text_generation_state,
)
from maxfx.interfaces._text_context import CHUNK_SIZE


class Ctx(TextGenerationContext):
    def __init__(self, tokens=(1, 2, 3), **kw):
        kw.setdefault("request_id", "r")
        init_text_generation_state(self, tokens=tokens, **kw)


def test_fresh_context_layout():
    c = Ctx(tokens=[5, 6, 7, 8], eos_token_ids=[0], max_length=64)
    assert (c.start_idx, c.active_idx, c.end_idx) == (0, 4, 4)
    assert c.next_tokens.tolist() == [5, 6, 7, 8] and c.active_length == 4 and c.current_length == 4
    assert c.prompt_tokens.tolist() == [5, 6, 7, 8] and c.generated_tokens.size == 0
    assert c.all_tokens.tolist() == [5, 6, 7, 8] and len(c.tokens) == CHUNK_SIZE
    assert c.needs_ce and c.is_initial_prompt and not c.is_done
    assert c.tokens.dtype == np.int32 and c.eos_token_ids == {0}
    assert c.request_id == "r" and c.status is GenerationStatus.ACTIVE
    with pytest.raises(ValueError, match="has not generated any token yet"):
        c.get_last_generated_token()


def test_update_moves_the_window_and_stops_on_eos():
    c = Ctx(eos_token_ids={0})
    c.update(9)
    assert (c.start_idx, c.active_idx, c.end_idx) == (3, 4, 4)
    assert c.next_tokens.tolist() == [9] and not c.needs_ce and not c.is_initial_prompt
    assert c.get_last_generated_token() == 9 and c.status is GenerationStatus.ACTIVE
    c.update(0)
    assert c.status is GenerationStatus.END_OF_SEQUENCE and c.is_done
    out = c.to_generation_output()
    assert (
        out.tokens == [9, 0] and out.final_status is GenerationStatus.END_OF_SEQUENCE and out.log_probabilities is None
    )
    assert c.to_generation_output().tokens == []  # handed out once


def test_ignore_eos_and_stop_token_ids():
    c = Ctx(eos_token_ids={0}, sampling_params=SamplingParams(ignore_eos=True, stop_token_ids=[42]))
    c.update(0)
    assert c.status is GenerationStatus.ACTIVE
    c.update(42)
    assert c.status is GenerationStatus.END_OF_SEQUENCE


def test_max_new_tokens_and_max_length():
    c = Ctx(sampling_params=SamplingParams(max_new_tokens=2))
    c.update(4)
    assert c.status is GenerationStatus.ACTIVE
    c.update(4)
    assert c.status is GenerationStatus.MAXIMUM_LENGTH
    d = Ctx(max_length=4)
    d.update(4)
    assert d.status is GenerationStatus.MAXIMUM_LENGTH
    with pytest.raises(ValueError, match="more than max_length=2"):
        Ctx(max_length=2)


def test_log_probabilities_are_returned_with_the_tokens():
    c = Ctx(log_probabilities=2)
    lp = LogProbabilities([-0.1], [{9: -0.1, 3: -2.0}])
    c.update(9, lp)
    out = c.to_generation_output()
    assert out.log_probabilities == [lp] and c.log_probabilities == 2


def test_buffer_grows_past_a_chunk():
    c = Ctx(tokens=np.arange(CHUNK_SIZE))
    for t in range(5):
        c.update(t)
    assert len(c.tokens) == 2 * CHUNK_SIZE and c.generated_tokens.tolist() == [0, 1, 2, 3, 4]
    assert c.all_tokens.size == CHUNK_SIZE + 5


def test_chunked_prefill_with_set_token_indices():
    c = Ctx(tokens=np.arange(10))
    c.set_token_indices(active_idx=4)  # first chunk
    assert c.next_tokens.tolist() == [0, 1, 2, 3] and c.needs_ce
    c.bump_token_indices(start_idx=4, active_idx=6)  # second chunk
    assert c.next_tokens.tolist() == [4, 5, 6, 7, 8, 9] and c.needs_ce
    with pytest.raises(ValueError, match="0 <= start_idx <= active_idx <= end_idx"):
        c.set_token_indices(start_idx=11)


def test_jump_ahead_and_reset():
    c = Ctx(eos_token_ids={0})
    c.update(7)
    c.jump_ahead(8)  # a forced token joins the tokens to run next
    assert c.next_tokens.tolist() == [7, 8] and c.generated_tokens.tolist() == [7, 8]
    c.reset()  # evicted: everything is encoded again
    assert c.start_idx == 0 and c.next_tokens.tolist() == [1, 2, 3, 7, 8] and c.is_initial_prompt and c.needs_ce


def test_compute_num_available_steps():
    c = Ctx(tokens=np.arange(10))
    assert c.compute_num_available_steps(16) == 7  # the prompt step + 6 decode positions
    c.update(1)
    assert c.compute_num_available_steps(16) == 6


def test_min_token_logit_mask():
    c = Ctx(eos_token_ids={2, 0}, sampling_params=SamplingParams(min_new_tokens=2))
    masks = c.get_min_token_logit_mask(3)
    assert [m.tolist() for m in masks] == [[0, 2], [0, 2], []]
    assert all(m.dtype == np.int32 for m in masks)
    c.update(5)
    assert [m.tolist() for m in c.get_min_token_logit_mask(2)] == [[0, 2], []]
    assert c.min_tokens == 2


def test_matcher_is_advanced_on_update():
    class Matcher:
        def __init__(self):
            self.seen = []

        def consume_token(self, token):
            self.seen.append(token)
            return True

    c = Ctx(json_schema='{"type": "object"}')
    m = Matcher()
    c.set_matcher(m)
    c.update(11)
    c.jump_ahead(12)
    assert c.matcher is m and m.seen == [11, 12] and c.json_schema == '{"type": "object"}'


def test_status_setter_and_missing_state_error():
    c = Ctx()
    c.status = "cancelled"
    assert c.status is GenerationStatus.CANCELLED and c.is_done

    class Bare(TextGenerationContext):
        pass

    with pytest.raises(
        AttributeError, match="Bare must override 'start_idx' or store its state in the attribute '_start_idx'"
    ):
        _ = Bare().start_idx


def test_protocols_accept_duck_typed_classes():
    class Duck:
        request_id = RequestID("d")
        status = GenerationStatus.ACTIVE
        is_done = False
        tokens = np.zeros(3, np.int32)
        active_length = 3
        model_name = "bert"

    assert isinstance(Duck(), BaseContext) and isinstance(Duck(), EmbeddingsContext)
    assert not isinstance(Duck(), TextGenerationContext)
    assert isinstance(Ctx(), TextGenerationContext) and not isinstance(object(), BaseContext)


def test_embeddings_context_defaults():
    class E(EmbeddingsContext):
        def __init__(self):
            self._request_id, self._status, self._tokens, self._model_name = (
                RequestID("e"),
                GenerationStatus.ACTIVE,
                np.array([101, 5, 102]),
                "bert",
            )

    e = E()
    assert (e.active_length, e.model_name, e.request_id, e.is_done) == (3, "bert", "e", False)


def test_vlm_context_defaults():
    class V(VLMTextGenerationContext):
        def __init__(self):
            init_text_generation_state(self, request_id="v", tokens=np.arange(12))
            self._images = [
                ImageMetadata(start_idx=2, end_idx=5, pixel_values=np.zeros(1)),
                ImageMetadata(start_idx=8, end_idx=10, pixel_values=np.ones(1)),
            ]

    v = V()
    assert v.image_idx == 0 and v.needs_vision_encoding and len(v.next_images) == 2
    assert [v.compute_image_aligned_idx(i) for i in (2, 3, 5, 9, 11)] == [2, 2, 5, 8, 11]
    v.set_token_indices(start_idx=6)
    assert v.image_idx == 1 and v.next_images[0].start_idx == 8
    v.set_token_indices(start_idx=10)
    assert v.image_idx == 2 and not v.needs_vision_encoding
    assert isinstance(v, VLMTextGenerationContext) and isinstance(v, TextGenerationContext)
