"""Queue helpers and protocols; Pipeline, Scheduler, SchedulerResult, PipelineTokenizer, PipelineOutput."""

import asyncio
import queue
import threading
import time

import numpy as np
import pytest

import maxfx.interfaces as interfaces
from maxfx.interfaces import (
    EmbeddingsGenerationInputs,
    EmbeddingsGenerationOutput,
    GenerationStatus,
    MAXPullQueue,
    MAXPushQueue,
    Pipeline,
    PipelineInputs,
    PipelineOutput,
    PipelinesFactory,
    PipelineTokenizer,
    RequestID,
    Scheduler,
    SchedulerResult,
    TextGenerationOutput,
    drain_queue,
    get_blocking,
)


def test_drain_queue():
    q = queue.Queue()
    for i in range(6):
        q.put(i)
    assert drain_queue(q, max_items=4) == [0, 1, 2, 3]
    assert drain_queue(q) == [4, 5]
    assert drain_queue(q) == [] and drain_queue(q, max_items=0) == []
    with pytest.raises(ValueError, match="max_items must be None or an int >= 0, got -1"):
        drain_queue(q, max_items=-1)


def test_get_blocking_waits_for_an_item():
    q = queue.Queue()

    def later():
        time.sleep(0.05)
        q.put("late")

    t = threading.Thread(target=later)
    t.start()
    start = time.monotonic()
    assert get_blocking(q) == "late"
    assert time.monotonic() - start >= 0.04
    t.join()


def test_queue_protocols_and_defaults():
    assert isinstance(queue.Queue(), MAXPullQueue) and isinstance(queue.Queue(), MAXPushQueue)
    assert isinstance(asyncio.Queue(), MAXPullQueue)
    assert not isinstance([], MAXPullQueue)

    class Blocking(MAXPullQueue, MAXPushQueue):
        """Only the blocking API: the protocol defaults give the non-blocking one."""

        def __init__(self):
            self.q = queue.Queue(maxsize=1)

        def get(self, block=True):
            return self.q.get(block=block)

        def put(self, item, block=True):
            self.q.put(item, block=block)

    b = Blocking()
    b.put_nowait(1)
    with pytest.raises(queue.Full):
        b.put_nowait(2)
    assert b.get_nowait() == 1
    with pytest.raises(queue.Empty):
        b.get_nowait()

    class Nothing(MAXPullQueue):
        pass

    with pytest.raises(TypeError, match=r"Nothing must implement get_nowait\(\)"):
        Nothing().get_nowait()


class OnesPipeline(Pipeline):
    def __init__(self):
        self.released = []

    def execute(self, inputs):
        return {rid: EmbeddingsGenerationOutput(np.ones(2, np.float32)) for rid in inputs.batch}

    def release(self, request_id):
        self.released.append(request_id)


def test_pipeline_abc_and_factory():
    with pytest.raises(TypeError, match="abstract"):
        Pipeline()
    factory: PipelinesFactory = OnesPipeline
    p = factory()
    out = p.execute(EmbeddingsGenerationInputs([{RequestID("a"): None}]))
    assert list(out) == ["a"] and out["a"].is_done
    p.release(RequestID("a"))
    assert p.released == ["a"]
    assert isinstance(EmbeddingsGenerationInputs([]), PipelineInputs)


def test_pipeline_output_protocol():
    assert isinstance(TextGenerationOutput("r", [], GenerationStatus.ACTIVE), PipelineOutput)
    assert isinstance(EmbeddingsGenerationOutput(np.zeros(1)), PipelineOutput)
    assert not isinstance(object(), PipelineOutput)

    class Out(PipelineOutput):
        final_status = GenerationStatus.MAXIMUM_LENGTH

    assert Out().is_done


def test_scheduler_and_result():
    with pytest.raises(TypeError, match="abstract"):
        Scheduler()
    out = TextGenerationOutput("r", [1], GenerationStatus.END_OF_SEQUENCE)
    res = SchedulerResult.create(out)
    assert res.is_done and res.result is out
    assert not SchedulerResult.create(TextGenerationOutput("r", [1], GenerationStatus.ACTIVE)).is_done
    cancelled = SchedulerResult.cancelled()
    assert cancelled.is_done and cancelled.result is None


def test_pipeline_tokenizer_protocol():
    class Chars(PipelineTokenizer):
        eos = 0

        async def encode(self, prompt, add_special_tokens=True):
            return np.array([ord(c) for c in prompt])

        async def decode(self, encoded, **kwargs):
            return "".join(chr(int(t)) for t in encoded)

        async def new_context(self, request):
            return request

    tok = Chars()
    assert isinstance(tok, PipelineTokenizer) and not tok.expects_content_wrapping
    assert asyncio.run(tok.decode(asyncio.run(tok.encode("hey")))) == "hey"

    class Duck:
        eos = 2
        expects_content_wrapping = True

        async def encode(self, prompt, add_special_tokens):
            return []

        async def decode(self, encoded, **kwargs):
            return ""

        async def new_context(self, request):
            return None

    assert isinstance(Duck(), PipelineTokenizer)


def test_package_is_a_leaf_and_exports_all_names():
    """maxfx.interfaces imports only the standard library, numpy and msgpack (and itself)."""
    import ast
    import pathlib
    import sys

    allowed = set(sys.stdlib_module_names) | {"numpy", "msgpack"}
    for path in pathlib.Path(interfaces.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            assert set(roots) <= allowed, f"{path.name} imports {roots}"
    for name in interfaces.__all__:
        assert hasattr(interfaces, name), name
