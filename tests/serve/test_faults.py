"""Faults and load against a real ``maxfx serve`` on 127.0.0.1, bounded in count and time.

Every accepted request must complete or be cancelled cleanly, the server must
stay up and its resident memory flat.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import httpx

from tests.serve.conftest import Server
from tests.serve.test_openai_client import CASE

COMPLETIONS = "/v1/completions"


async def _stream(client: httpx.AsyncClient, body: dict, stop_after: int | None = None) -> tuple[str, str | None, int]:
    """(text, finish_reason, chunks) of one streamed completion; ``stop_after`` chunks then disconnect."""
    text, reason, n = [], None, 0
    async with client.stream("POST", COMPLETIONS, json=dict(body, stream=True)) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            n += 1
            text.append(chunk["choices"][0]["text"])
            reason = chunk["choices"][0]["finish_reason"] or reason
            if stop_after is not None and n >= stop_after:
                break
    return "".join(text), reason, n


def _wait_idle(server, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.metric("maxserve_num_requests_running") + server.metric("maxserve_num_requests_queued") > 0:
        assert time.monotonic() < deadline, "requests still running"
        time.sleep(0.05)


def test_64_concurrent_streams_and_10_disconnects(server):
    body = {"model": "tiny", "prompt": CASE["prompt"], "max_tokens": 16, "temperature": 0}
    cancelled = server.metric("maxserve_request_cancelled_total")

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            full = [_stream(c, body) for _ in range(64)]
            gone = [_stream(c, dict(body, max_tokens=100, ignore_eos=True), stop_after=2) for _ in range(10)]
            return await asyncio.gather(*full, *gone)

    results = asyncio.run(run())
    for text, reason, _ in results[:64]:
        assert (text, reason) == (CASE["completion"], "length")
    assert all(n == 2 for _, _, n in results[64:])
    _wait_idle(server)
    # A disconnect is seen when the server next writes to that stream: on a loaded machine the engine may
    # have streamed all of a request's tokens by then (it ends normally), so how many of the ten are counted
    # as cancelled depends on timing (test_closed_stream_frees_its_request checks one cancellation). What
    # must hold: none of the 64 complete streams was cancelled, and every page came back.
    assert cancelled <= server.metric("maxserve_request_cancelled_total") <= cancelled + 10
    assert server.metric("maxserve_kv_cache_usage_ratio") == 0  # every page back, cancelled or finished
    assert httpx.get(server.url + "/health").status_code == 200


def test_bad_inputs_get_400_and_the_server_stays_up(server):
    post = lambda body, **kw: httpx.post(server.url + COMPLETIONS, timeout=60, **kw)  # noqa: E731
    r = post(None, content=b'{"prompt": "x", "max_tokens": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = post(None, json={"prompt": "a" * (1 << 20), "max_tokens": 4})
    assert r.status_code == 400 and "too long" in r.json()["error"]["message"]
    r = post(None, json={"prompt": "hi", "max_tokens": 10_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(None, json={"prompt": "hi", "max_tokens": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(None, json={"prompt": [1, 2, 9999], "max_tokens": 4})
    assert r.status_code == 400 and "[0, 256)" in r.json()["error"]["message"]
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}},
        },
    )
    assert r.status_code == 400 and "schema" in r.json()["error"]["message"]
    good = post(None, json={"prompt": CASE["prompt"], "max_tokens": 16, "temperature": 0})
    assert good.status_code == 200 and good.json()["choices"][0]["text"] == CASE["completion"]


def test_burst_above_the_queue_limit_is_503_and_nothing_is_lost(server):
    # 16 rows run, 128 may wait: 260 at once overflow the queue.
    body = {"model": "tiny", "prompt": CASE["prompt"], "max_tokens": 16, "temperature": 0}

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=300)) as c:
            return await asyncio.gather(*(c.post(COMPLETIONS, json=body) for _ in range(260)))

    responses = asyncio.run(run())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503} and codes.count(503) > 0 and codes.count(200) >= 144
    for r in responses:
        if r.status_code == 200:
            assert r.json()["choices"][0]["text"] == CASE["completion"]
        else:
            assert r.json()["error"]["code"] == "queue_full"
    _wait_idle(server)


def test_resident_memory_is_flat_over_500_requests(server):
    async def batch(n: int):
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            sem = asyncio.Semaphore(16)

            async def one(i: int):
                async with sem:
                    r = await c.post(
                        COMPLETIONS, json={"prompt": f"request {i}", "max_tokens": 3, "temperature": 0.5, "seed": i}
                    )
                    assert r.status_code == 200

            await asyncio.gather(*(one(i) for i in range(n)))

    asyncio.run(batch(100))  # warm: allocator pools, token caches
    before = server.rss_bytes()
    asyncio.run(batch(500))
    after = server.rss_bytes()
    assert abs(after - before) <= 0.05 * before, f"RSS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB"


def test_sigterm_lets_running_streams_finish(tmp_path):
    """Graceful shutdown: a stream running when SIGTERM arrives still completes; then the server exits."""
    srv = Server("--max-batch-size", "2", log=tmp_path / "shutdown.log")
    body = {"prompt": CASE["prompt"], "max_tokens": 100, "temperature": 0, "ignore_eos": True, "stream": True}
    first_chunk = threading.Event()
    got: dict = {}

    def read():  # a plain client that says when its first chunk arrived
        reasons, chunks = [], 0
        with httpx.stream("POST", srv.url + COMPLETIONS, json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    reasons.append(json.loads(line[6:])["choices"][0]["finish_reason"])
                    first_chunk.set()
                elif line == "data: [DONE]":
                    got["done"] = True
        got["reason"], got["chunks"] = reasons[-1], chunks

    reader = threading.Thread(target=read)
    try:
        reader.start()
        assert first_chunk.wait(60), "no chunk within 60 s"
        srv.proc.send_signal(signal.SIGTERM)
        reader.join(60)
        assert got.get("done") and got["reason"] == "length" and got["chunks"] >= 2
        assert srv.proc.wait(60) in (0, -signal.SIGTERM)
        assert "engine stopped" in srv.log.read_text()
    finally:
        srv.stop()
