"""SamplingParams defaults, validation, and the user > generation_config > default merge."""

import dataclasses
import logging

import pytest

from maxfx.interfaces import SamplingParams, SamplingParamsGenerationConfigDefaults, SamplingParamsInput

MAX_DEFAULTS = {
    "top_k": -1,
    "top_p": 1,
    "min_p": 0.0,
    "temperature": 1,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "max_new_tokens": None,
    "min_new_tokens": 0,
    "ignore_eos": False,
    "stop": None,
    "stop_token_ids": None,
    "detokenize": True,
    "logits_processors": None,
}


def test_defaults_are_maxs():
    p = SamplingParams()
    assert {k: getattr(p, k) for k in MAX_DEFAULTS} == MAX_DEFAULTS
    assert [f.name for f in dataclasses.fields(SamplingParams)] == [
        *list(MAX_DEFAULTS)[:13],
        "seed",
        "logits_processors",
    ]


def test_default_seed_is_random_32_bit():
    seeds = {SamplingParams().seed for _ in range(20)}
    assert len(seeds) > 15
    assert all(0 <= s < 2**32 for s in seeds)
    assert SamplingParams(seed=7).seed == 7


def test_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SamplingParams().top_k = 3  # type: ignore[misc]
    assert dataclasses.replace(SamplingParams(seed=1), top_k=3).top_k == 3


def test_normalizations():
    assert SamplingParams(top_k=0).top_k == -1
    assert SamplingParams(temperature=0).top_k == 1
    assert SamplingParams(temperature=0, top_k=40).top_k == 1
    assert SamplingParams(top_k=None, top_p=None).top_k == -1  # JSON nulls mean "default"
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"top_p": 1.5}, ValueError, r"top_p must be in \[0, 1\], got 1.5"),
        ({"top_p": -0.1}, ValueError, "top_p"),
        ({"min_p": 1.2}, ValueError, r"min_p must be in \[0, 1\], got 1.2"),
        ({"temperature": -0.5}, ValueError, "temperature must be >= 0, got -0.5"),
        ({"temperature": float("nan")}, ValueError, "temperature must be finite"),
        ({"top_k": -2}, ValueError, "top_k must be -1 .* got -2"),
        ({"top_k": 2.0}, TypeError, "top_k must be an int, got float"),
        ({"repetition_penalty": 0.0}, ValueError, "repetition_penalty must be > 0, got 0.0"),
        ({"frequency_penalty": 3.0}, ValueError, r"frequency_penalty must be in \[-2, 2\], got 3.0"),
        ({"presence_penalty": -2.5}, ValueError, "presence_penalty"),
        ({"max_new_tokens": -1}, ValueError, "max_new_tokens must be >= 0, got -1"),
        ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an int, got bool"),
        ({"min_new_tokens": -3}, ValueError, "min_new_tokens must be >= 0, got -3"),
        ({"stop": ["ok", ""]}, ValueError, "stop must not contain an empty string"),
        ({"stop": [3]}, TypeError, "stop must hold str"),
        ({"stop_token_ids": [1, -4]}, ValueError, "stop_token_ids must hold non-negative ints, got -4"),
        ({"seed": "1"}, TypeError, "seed must be an int, got str"),
    ],
)
def test_validation_names_the_field(kwargs, error, message):
    with pytest.raises(error, match=message):
        SamplingParams(**kwargs)


def test_max_new_tokens_zero_and_edges_are_valid():
    p = SamplingParams(max_new_tokens=0, top_p=0.0, min_p=1.0, temperature=2.0, frequency_penalty=-2.0)
    assert (p.max_new_tokens, p.top_p, p.min_p) == (0, 0.0, 1.0)


def test_input_mirror_is_all_none():
    inp = SamplingParamsInput()
    names = [f.name for f in dataclasses.fields(SamplingParamsInput)]
    assert names == [f.name for f in dataclasses.fields(SamplingParams)]
    assert all(getattr(inp, n) is None for n in names)


def test_generation_config_defaults_values_to_update():
    d = SamplingParamsGenerationConfigDefaults(temperature=0.7, top_k=50)
    assert d.values_to_update == {"temperature": 0.7, "top_k": 50}
    d.values_to_update["top_k"] = 1  # a copy: mutating it does not change the defaults
    assert d.values_to_update["top_k"] == 50
    assert [f.name for f in dataclasses.fields(d)] == [
        "temperature",
        "top_p",
        "top_k",
        "repetition_penalty",
        "max_new_tokens",
        "min_new_tokens",
        "do_sample",
    ]


def test_from_generation_config_reads_known_keys_only():
    d = SamplingParamsGenerationConfigDefaults.from_generation_config(
        {"temperature": 0.6, "top_p": 0.9, "do_sample": True, "eos_token_id": [1, 2], "bos_token_id": 0}
    )
    assert d.values_to_update == {"temperature": 0.6, "top_p": 0.9, "do_sample": True}


def test_merge_priority_user_over_generation_config_over_defaults():
    gen = SamplingParamsGenerationConfigDefaults(
        temperature=0.6, top_p=0.9, top_k=20, max_new_tokens=256, repetition_penalty=1.1
    )
    p = SamplingParams.from_input_and_generation_config(
        SamplingParamsInput(temperature=0.2, max_new_tokens=8, seed=3), gen
    )
    assert p.temperature == 0.2  # user
    assert p.max_new_tokens == 8  # user
    assert p.top_p == 0.9 and p.top_k == 20 and p.repetition_penalty == 1.1  # generation config
    assert p.min_p == 0.0 and p.frequency_penalty == 0.0 and p.min_new_tokens == 0  # class defaults
    assert p.seed == 3


def test_merge_with_empty_generation_config_gives_class_defaults():
    p = SamplingParams.from_input_and_generation_config(
        SamplingParamsInput(max_new_tokens=32), SamplingParamsGenerationConfigDefaults()
    )
    assert (p.temperature, p.top_k, p.top_p, p.max_new_tokens) == (1, -1, 1, 32)


def test_do_sample_false_means_greedy_unless_user_overrides():
    greedy = SamplingParamsGenerationConfigDefaults(do_sample=False, temperature=0.8, top_k=50)
    p = SamplingParams.from_input_and_generation_config(SamplingParamsInput(), greedy)
    assert (p.temperature, p.top_k) == (0, 1)
    q = SamplingParams.from_input_and_generation_config(SamplingParamsInput(temperature=0.5, top_k=10), greedy)
    assert (q.temperature, q.top_k) == (0.5, 10)
    sampled = SamplingParams.from_input_and_generation_config(
        SamplingParamsInput(), SamplingParamsGenerationConfigDefaults(do_sample=True, temperature=0.8)
    )
    assert (sampled.temperature, sampled.top_k) == (0.8, -1)


def test_merge_validates_the_result_and_the_arguments():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.from_input_and_generation_config(
            SamplingParamsInput(top_p=3.0), SamplingParamsGenerationConfigDefaults()
        )
    with pytest.raises(TypeError, match="input_params must be a SamplingParamsInput, got dict"):
        SamplingParams.from_input_and_generation_config({"top_k": 1}, SamplingParamsGenerationConfigDefaults())


def test_needs_penalties():
    assert not SamplingParams().needs_penalties
    assert SamplingParams(repetition_penalty=1.2).needs_penalties
    assert SamplingParams(presence_penalty=0.5).needs_penalties


def test_log_sampling_info(caplog):
    with caplog.at_level(logging.INFO, logger="max.pipelines"):
        SamplingParams(top_k=5, stop=["END"], stop_token_ids=[2, 3]).log_sampling_info()
    text = caplog.text
    assert "Sampling Config" in text
    assert "top_k" in text and ": 5" in text
    assert '["END"]' in text and "[2, 3]" in text
