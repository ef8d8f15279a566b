"""The request bodies' own checks (no server): OpenAI's ranges where they are the API's, not the sampler's."""

import pydantic
import pytest

from maxfx.interfaces import SamplingParams
from maxfx.serve._protocol import ChatCompletionRequest, CompletionRequest


@pytest.mark.parametrize("body", [CompletionRequest, ChatCompletionRequest])
@pytest.mark.parametrize("temperature", [-0.1, 2.5])
def test_temperature_outside_openais_range_is_rejected(body, temperature):
    with pytest.raises(pydantic.ValidationError, match="temperature"):
        body(prompt="hi", messages=[{"role": "user", "content": "hi"}], temperature=temperature)


def test_sampling_params_take_any_temperature_the_sampler_can():
    """MAX documents no upper bound; `CausalLM.generate(temperature=50)` runs through the same params."""
    assert SamplingParams(temperature=50.0).temperature == 50.0
    assert CompletionRequest(prompt="hi", temperature=2).sampling_input().temperature == 2
