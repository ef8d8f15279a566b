"""MAX's two workflows on maxfx: the registry → tokenizer → contexts → ``execute`` loop, and ``LLM.generate``.

References: the fixture's transformers goldens (``golden_text.json``: greedy new ids of
two prompts) and the serial results of the same calls.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading

import numpy as np
import pytest

from maxfx.entrypoints.llm import LLM
from maxfx.interfaces import (
    GenerationStatus,
    PipelineTask,
    RequestID,
    SamplingParams,
    TextGenerationInputs,
    TextGenerationRequest,
)
from maxfx.pipelines import PipelineConfig
from maxfx.pipelines.lib.pipeline_variants.text_generation import TextGenerationPipeline
from maxfx.pipelines.lib.registry import PIPELINE_REGISTRY
from tests.models._helpers import LLAMA

GOLDEN = json.loads((LLAMA / "golden_text.json").read_text())


@pytest.fixture(scope="module")
def greedy_folder(tmp_path_factory):
    """tiny_llama with a generation_config.json whose top_k=1 makes decoding greedy (MAX merges it into
    SamplingParams).
    """
    folder = tmp_path_factory.mktemp("models") / "tiny_llama_greedy"
    shutil.copytree(LLAMA, folder)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_k": 1, "eos_token_id": 2}))
    return folder


def test_registry_execute_loop_matches_the_goldens():
    config = PipelineConfig(model_path=str(LLAMA), max_batch_size=4)
    tokenizer, pipeline = PIPELINE_REGISTRY.retrieve(config, task=PipelineTask.TEXT_GENERATION)
    assert isinstance(pipeline, TextGenerationPipeline)
    contexts = []
    for case in GOLDEN["cases"]:
        req = TextGenerationRequest(
            request_id=RequestID(),
            model_name="tiny",
            prompt=case["prompt"],
            sampling_params=SamplingParams(top_k=1, max_new_tokens=GOLDEN["greedy_new_tokens"], ignore_eos=True),
        )
        contexts.append(asyncio.run(tokenizer.new_context(req)))
    assert [c.prompt_tokens.tolist() for c in contexts] == [c["prompt_ids"] for c in GOLDEN["cases"]]
    tokens = {c.request_id: [] for c in contexts}
    live = {c.request_id: c for c in contexts}
    while live:
        outs = pipeline.execute(TextGenerationInputs(batches=[dict(live)], num_steps=4))
        for rid, out in outs.items():
            tokens[rid] += out.tokens
            if out.is_done:
                assert out.final_status is GenerationStatus.MAXIMUM_LENGTH
                pipeline.release(rid)
                del live[rid]
    for c, case in zip(contexts, GOLDEN["cases"]):
        assert tokens[c.request_id] == case["new_ids"]
    assert pipeline.runner.pool.num_used == 0


def test_generate_mixin_runs_requests_together():
    config = PipelineConfig(model_path=str(LLAMA), max_batch_size=4)
    _, pipeline = PIPELINE_REGISTRY.retrieve(config)
    reqs = [
        TextGenerationRequest(
            request_id=RequestID(),
            model_name="tiny",
            prompt=case["prompt"],
            sampling_params=SamplingParams(top_k=1, max_new_tokens=16, ignore_eos=True),
        )
        for case in GOLDEN["cases"]
    ]
    outs = pipeline.generate(reqs)
    assert [o.tokens for o in outs] == [case["new_ids"] for case in GOLDEN["cases"]]
    assert all(o.final_status is GenerationStatus.MAXIMUM_LENGTH for o in outs)


def test_llm_from_four_threads_equals_serial_results(greedy_folder):
    prompts = [[f"prompt {t}-{i}" for i in range(3)] for t in range(4)]
    with LLM(PipelineConfig(model_path=str(greedy_folder), max_batch_size=8)) as llm:
        serial = [llm.generate(p, max_new_tokens=8, use_tqdm=False) for p in prompts]
        results: dict[int, list[str]] = {}

        def work(t):
            results[t] = llm.generate(prompts[t], max_new_tokens=8, use_tqdm=False)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=120)
        assert [results[t] for t in range(4)] == serial
        assert (
            llm._scheduler.stats.decode_rows > llm._scheduler.stats.decode_steps
        )  # rows of different calls shared steps


@pytest.mark.parametrize("kv_cache_format", [None, "float16"])
def test_llm_greedy_text_equals_the_golden_completion(greedy_folder, kv_cache_format):
    with LLM(PipelineConfig(model_path=str(greedy_folder), max_batch_size=2, kv_cache_format=kv_cache_format)) as llm:
        texts = llm.generate([c["prompt"] for c in GOLDEN["cases"]], max_new_tokens=16, use_tqdm=False)
        tok = llm.tokenizer.delegate
        assert llm._scheduler.runner._pools[0][0].dtype == (np.float16 if kv_cache_format else np.float32)
    for text, case in zip(texts, GOLDEN["cases"]):
        ids = case["new_ids"]
        if 2 in ids:  # the completion ends at EOS
            ids = ids[: ids.index(2)]
        assert text == tok.decode(ids, skip_special_tokens=True)


def test_llm_samples_by_default_as_max_does():
    with LLM(PipelineConfig(model_path=str(LLAMA), max_batch_size=2)) as llm:
        params = llm._sampling(7)
        assert (params.temperature, params.top_k, params.top_p, params.max_new_tokens) == (1.0, -1, 1.0, 7)


def test_llm_progress_bar_counts_prompts(greedy_folder, capsys):
    with LLM(PipelineConfig(model_path=str(greedy_folder), max_batch_size=2)) as llm:
        llm.generate(["a", "b", "c"], max_new_tokens=2, use_tqdm=True)
    err = capsys.readouterr().err
    assert "3/3" in err and "prompt" in err


def test_llm_errors_name_the_problem(greedy_folder):
    with LLM(PipelineConfig(model_path=str(greedy_folder), max_batch_size=2)) as llm:
        with pytest.raises(ValueError, match="prompts is empty"):
            llm.generate([])
        with pytest.raises(ValueError, match="prompt 1 must be a non-empty string"):
            llm.generate(["ok", ""])
        with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
            llm.generate("x", max_new_tokens=-1)
        with pytest.raises(ValueError, match="max_length"):
            llm.generate("x" * 200)
        assert llm.generate("still serving", max_new_tokens=2, use_tqdm=False)[0] is not None
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate("x")


def test_pipeline_execute_with_chunked_prefill_and_bad_batches():
    config = PipelineConfig(model_path=str(LLAMA), max_batch_size=2, prefill_chunk_size=8)
    tokenizer, pipeline = PIPELINE_REGISTRY.retrieve(config)
    case = GOLDEN["cases"][0]
    req = TextGenerationRequest(
        request_id=RequestID(),
        model_name="tiny",
        prompt=case["prompt"],
        sampling_params=SamplingParams(top_k=1, max_new_tokens=4, ignore_eos=True),
    )
    ctx = asyncio.run(tokenizer.new_context(req))
    calls = 0
    got: list[int] = []
    while not ctx.is_done:
        got += pipeline.execute(TextGenerationInputs(batches=[{ctx.request_id: ctx}], num_steps=4))[
            ctx.request_id
        ].tokens
        calls += 1
    assert got == case["new_ids"][:4]
    assert calls >= 3  # an 18-token prompt in chunks of 8, then decode
    with pytest.raises(ValueError, match="length limit"):
        pipeline.calculate_num_steps(1, ctx)
    np.testing.assert_array_equal(ctx.generated_tokens, case["new_ids"][:4])


def test_llm_with_a_draft_model_runs_speculative_decoding(greedy_folder):
    config = PipelineConfig(model_path=str(greedy_folder), draft_model_path=str(greedy_folder), max_batch_size=2)
    with LLM(config) as llm, LLM(PipelineConfig(model_path=str(greedy_folder), max_batch_size=2)) as plain:
        assert llm.generate(["hello, world"], max_new_tokens=8, use_tqdm=False) == plain.generate(
            ["hello, world"], max_new_tokens=8, use_tqdm=False
        )


def test_llm_generate_inside_a_running_event_loop(greedy_folder):
    """A notebook cell runs in an event loop: generate must still work there (it tokenizes on a worker thread)."""
    with LLM(PipelineConfig(model_path=str(greedy_folder), max_batch_size=2)) as llm:
        expected = llm.generate(["hello"], max_new_tokens=4, use_tqdm=False)

        async def cell():
            return llm.generate(["hello"], max_new_tokens=4, use_tqdm=False)

        assert asyncio.run(cell()) == expected
