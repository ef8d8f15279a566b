"""RequestID, GenerationStatus and the small enums: values and behaviour MAX documents."""

import pickle
import uuid

import pytest

from maxfx.interfaces import (
    AudioGenerationOutput,
    BatchType,
    EmbeddingsGenerationOutput,
    GenerationStatus,
    LoRAOperation,
    LoRARequest,
    LoRAResponse,
    LoRAStatus,
    LoRAType,
    PipelineTask,
    Request,
    RequestID,
    TextGenerationOutput,
)


def test_request_id_fresh_is_a_uuid4_string():
    a, b = RequestID(), RequestID()
    assert a != b
    assert uuid.UUID(a).version == 4
    assert isinstance(a, str) and isinstance(a, RequestID)


def test_request_id_keeps_value_and_behaves_as_its_string():
    rid = RequestID("req-7")
    assert rid == "req-7" and "req-7" == rid
    assert rid.value == "req-7" and type(rid.value) is str
    assert {rid: 1}["req-7"] == 1 and {"req-7": 2}[rid] == 2
    assert str(rid) == "req-7" and type(str(rid)) is str
    assert repr(rid) == "RequestID('req-7')"
    assert RequestID(rid) is rid


def test_request_id_rejects_non_strings():
    with pytest.raises(TypeError, match="RequestID value must be a str, got int"):
        RequestID(5)


def test_request_id_pickles():
    rid = RequestID("p")
    back = pickle.loads(pickle.dumps(rid))
    assert back == "p" and type(back) is RequestID


def test_request_converts_plain_string_id():
    assert type(Request(request_id="x").request_id) is RequestID


def test_generation_status_values_and_is_done():
    assert [s.value for s in GenerationStatus] == ["active", "end_of_sequence", "maximum_length", "cancelled"]
    assert [s.is_done for s in GenerationStatus] == [False, True, True, True]
    assert GenerationStatus("cancelled") is GenerationStatus.CANCELLED


def test_pipeline_task_values_and_output_types():
    assert {t.name: t.value for t in PipelineTask} == {
        "TEXT_GENERATION": "text_generation",
        "EMBEDDINGS_GENERATION": "embeddings_generation",
        "AUDIO_GENERATION": "audio_generation",
        "SPEECH_TOKEN_GENERATION": "speech_token_generation",
    }
    assert PipelineTask.TEXT_GENERATION.output_type is TextGenerationOutput
    assert PipelineTask.EMBEDDINGS_GENERATION.output_type is EmbeddingsGenerationOutput
    assert PipelineTask.AUDIO_GENERATION.output_type is AudioGenerationOutput
    assert PipelineTask.SPEECH_TOKEN_GENERATION.output_type is TextGenerationOutput


def test_batch_type_and_lora_enum_values():
    assert [b.value for b in BatchType] == ["CE", "TG"]
    assert {o.value for o in LoRAOperation} == {"load", "unload", "list"}
    assert {s.value for s in LoRAStatus} == {
        "success",
        "load_name_exists",
        "unload_name_nonexistent",
        "load_error",
        "unload_error",
        "load_invalid_path",
        "load_invalid_adapter",
    }
    assert (LoRAType.A.value, LoRAType.B.value, LoRAType.BIAS.value) == ("lora_A", "lora_B", "lora.bias")


def test_lora_request_validation_and_coercion():
    assert LoRARequest("list").operation is LoRAOperation.LIST
    with pytest.raises(ValueError, match=r"LoRARequest\(load\) needs lora_path"):
        LoRARequest(LoRAOperation.LOAD, lora_name="a")
    with pytest.raises(ValueError, match="'bogus' is not a valid LoRAOperation"):
        LoRARequest("bogus")
    resp = LoRAResponse("load_name_exists", "adapter 'a' is already loaded")
    assert resp.status is LoRAStatus.LOAD_NAME_EXISTS
