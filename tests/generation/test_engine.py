"""The generation engine (maxfx.generation) against references that do not use it.

References: the fixtures' transformers goldens, greedy decoding by full forward
passes without any KV cache (``model(ids)`` each step), numpy implementations of
the sampling filters, and ``log_softmax`` of the model's own full-forward logits.
"""

from __future__ import annotations

import numpy as np
import pytest

from maxfx.generation import ModelRunner, OutOfPagesError, PagePool, Scheduler, TextContext, compile_counts
from maxfx.interfaces import GenerationStatus, SamplingParams
from maxfx.models import Tokenizer
from tests.models._helpers import LLAMA, golden, model

MAX_LEN = 128
GREEDY = dict(top_k=1)


@pytest.fixture(scope="module")
def llama():
    return model(str(LLAMA))


def full_forward(m, ids):
    """Logits ``[len(ids), V]`` of one causal forward pass without any KV cache.

    The ids are right-padded to ``MAX_LEN`` so every call has one shape (one compile);
    causal attention keeps the padding out of the real positions' logits.
    """
    padded = np.zeros((1, MAX_LEN), np.int64)
    padded[0, : len(ids)] = ids
    return m(padded).to_numpy()[0, : len(ids)]


def full_forward_greedy(m, prompt, n):
    """Greedy tokens by recomputing the whole sequence each step (no cache at all)."""
    ids = list(map(int, prompt))
    out = []
    for _ in range(n):
        out.append(int(np.argmax(full_forward(m, ids)[-1])))
        ids.append(out[-1])
    return out


def ctx(prompt, max_new, **sampling):
    params = SamplingParams(max_new_tokens=max_new, **{**GREEDY, **sampling})
    return TextContext(max_length=MAX_LEN, tokens=np.asarray(prompt), sampling_params=params)


def prompts(n, seed=0, lo=3, hi=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(lo, hi))) for _ in range(n)]


def test_sixteen_staggered_requests_equal_their_greedy_tokens(llama):
    runner = ModelRunner(llama, max_batch_size=8, max_length=MAX_LEN, page_size=8, prefill_chunk_size=16)
    sched = Scheduler(runner)
    ps = prompts(16)
    limits = [1 + i % 12 for i in range(16)]
    streams = []
    for i, (p, n) in enumerate(zip(ps, limits)):
        streams.append(sched.submit(ctx(p, n)))
        if i % 3 == 2:  # later requests join a batch that is already decoding
            sched.step()
            sched.step()
    sched.run_until_idle()
    assert sched.stats.decode_steps > 0 and sched.stats.prefill_steps >= 16
    for p, n, s in zip(ps, limits, streams):
        res = s.result()
        assert res.tokens == full_forward_greedy(llama, p, n)
        assert res.status is GenerationStatus.MAXIMUM_LENGTH and res.finish_reason == "length"
    # Alone, each request gives the same tokens as in the crowd.
    alone = Scheduler(runner)
    for p, n, s in list(zip(ps, limits, streams))[:4]:
        one = alone.submit(ctx(p, n))
        alone.run_until_idle()
        assert one.result().tokens == s.result().tokens
    assert runner.pool.num_used == 0  # every page came back


def test_goldens_among_other_requests(llama):
    g = golden(LLAMA)
    runner = ModelRunner(llama, max_batch_size=16, max_length=MAX_LEN, page_size=16)
    sched = Scheduler(runner)
    crowd = [sched.submit(ctx(p, 5)) for p in prompts(6, seed=1)]
    mine = [sched.submit(ctx(row, g["greedy_ids"].shape[1])) for row in g["input_ids"]]
    sched.run_until_idle()
    for s, ref in zip(mine, g["greedy_ids"]):
        assert s.result().tokens == ref.tolist()
    assert all(len(s.result().tokens) == 5 for s in crowd)


def test_float16_kv_cache_halves_the_pool_and_keeps_the_goldens(llama):
    g = golden(LLAMA)
    full = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16)
    half = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16, kv_cache_dtype="float16")
    assert half.cache_bytes * 2 == full.cache_bytes and half._pools[0][0].dtype == np.float16
    sched = Scheduler(half)
    mine = [sched.submit(ctx(row, g["greedy_ids"].shape[1])) for row in g["input_ids"]]
    sched.run_until_idle()
    for s, ref in zip(mine, g["greedy_ids"]):
        assert s.result().tokens == ref.tolist()
    with pytest.raises(ValueError, match="kv_cache_dtype.*float dtype.*'int8'"):
        ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, kv_cache_dtype="int8")


def test_shared_prefix_served_from_cached_pages(llama):
    rng = np.random.default_rng(3)
    prefix = rng.integers(0, 256, 100)
    a, b = np.concatenate([prefix, [7, 8, 9]]), np.concatenate([prefix, [10, 11]])
    plain = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16)
    cached = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16, enable_prefix_caching=True)
    results = {}
    for name, runner in (("plain", plain), ("cached", cached)):
        sched = Scheduler(runner)
        first = sched.submit(ctx(a, 6))
        sched.run_until_idle()
        second = sched.submit(ctx(b, 6))
        sched.run_until_idle()
        results[name] = (first.result(), second.result())
    assert results["cached"][1].cached_tokens == 96  # six full pages of the 100 shared tokens
    assert cached.pool.stats.hit_tokens == 96 and plain.pool.stats.hit_tokens == 0
    assert [r.tokens for r in results["cached"]] == [r.tokens for r in results["plain"]]
    assert results["cached"][1].tokens == full_forward_greedy(llama, b, 6)


def test_small_page_pool_preempts_and_every_request_completes(llama):
    # 9 usable pages of 8 tokens: four requests of ~30 tokens growing by 20 cannot all fit.
    runner = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=8, num_pages=10)
    sched = Scheduler(runner)
    ps = prompts(4, seed=5, lo=20, hi=30)
    streams = [sched.submit(ctx(p, 20)) for p in ps]
    sched.run_until_idle()
    assert sched.stats.preemptions > 0
    for p, s in zip(ps, streams):
        assert s.result().tokens == full_forward_greedy(llama, p, 20)
    assert runner.pool.num_used == 0


def test_request_larger_than_the_pool_fails_alone(llama):
    runner = ModelRunner(llama, max_batch_size=2, max_length=MAX_LEN, page_size=8, num_pages=3)
    sched = Scheduler(runner)
    big = sched.submit(ctx(np.arange(40) % 256, 4))
    small = sched.submit(ctx([1, 2, 3], 4))
    sched.run_until_idle()
    with pytest.raises(ValueError, match="KV pages"):
        big.result()
    assert small.result().tokens == full_forward_greedy(llama, [1, 2, 3], 4)


def test_stop_string_across_token_boundaries(llama):
    tok = Tokenizer.from_file(LLAMA / "tokenizer.json")
    runner = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16)
    prompt = tok.encode("hello, world")
    ref = full_forward_greedy(llama, prompt, 16)
    text = tok.decode(ref, skip_special_tokens=True)
    # A stop string made of the 5th and 6th tokens' characters (one byte each in this tokenizer).
    stop = tok.decode(ref[4:6], skip_special_tokens=True)
    at = text.find(stop)
    assert len(stop) >= 2 and at >= 0
    sched = Scheduler(runner, tokenizer=tok)
    s = sched.submit(ctx(prompt, 16), stop=[stop])
    sched.run_until_idle()
    pieces = [e.text for e in s]
    res_text = "".join(pieces)
    assert res_text == text[:at]
    assert all(stop not in p for p in pieces)
    assert s.stop_string == stop


def test_log_probabilities_equal_log_softmax_of_the_logits(llama):
    runner = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16)
    sched = Scheduler(runner)
    prompt = [5, 6, 7, 8]
    c = ctx(prompt, 6)
    c.log_probabilities = 3
    s = sched.submit(c)
    sched.submit(ctx([9, 10], 3))  # a neighbour without log probabilities
    sched.run_until_idle()
    res = s.result()
    ids = prompt + res.tokens
    logits = full_forward(llama, ids).astype(np.float64)
    lsm = logits - logits.max(-1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(-1, keepdims=True))
    assert len(res.log_probabilities) == 6
    for i, lp in enumerate(res.log_probabilities):
        row = lsm[len(prompt) - 1 + i]
        assert abs(lp.token_log_probabilities[0] - row[res.tokens[i]]) < 1e-4
        top = lp.top_log_probabilities[0]
        assert list(top) == np.argsort(-row)[:3].tolist()
        assert max(abs(v - row[k]) for k, v in top.items()) < 1e-4


def test_seeded_sampling_reproducible_and_independent_of_neighbours(llama):
    runner = ModelRunner(llama, max_batch_size=8, max_length=MAX_LEN, page_size=16)

    def run(seed, neighbours):
        sched = Scheduler(runner)
        s = sched.submit(ctx([1, 2, 3, 4], 12, top_k=-1, temperature=0.9, top_p=0.95, seed=seed))
        for j in range(neighbours):
            sched.submit(ctx([5 + j, 6], 8, top_k=-1, temperature=1.0, seed=100 + j))
        sched.run_until_idle()
        return s.result().tokens

    alone = run(7, 0)
    assert run(7, 5) == alone == run(7, 2)
    assert run(8, 0) != alone


def test_penalties_and_min_tokens_reach_the_sampler(llama):
    runner = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16)
    sched = Scheduler(runner)
    plain = full_forward_greedy(llama, [1, 2, 3], 12)
    s = sched.submit(ctx([1, 2, 3], 12, presence_penalty=2.0, frequency_penalty=1.0))
    eos = plain[0]
    c = ctx([1, 2, 3], 4)
    c.eos_token_ids = {eos}
    early = sched.submit(c)
    c2 = ctx([1, 2, 3], 4, min_new_tokens=3)
    c2.eos_token_ids = {eos}
    held = sched.submit(c2)
    sched.run_until_idle()
    toks = s.result().tokens
    assert len(set(toks)) >= len(set(plain))  # penalties push away from repeats
    assert early.result().tokens == [eos] and early.result().finish_reason == "stop"
    held_tokens = held.result().tokens
    assert eos not in held_tokens[:3] and len(held_tokens) >= 3


def test_no_compile_after_warmup(llama):
    runner = ModelRunner(llama, max_batch_size=4, max_length=64, page_size=16, prefill_chunk_size=32, min_context=32)
    runner.warmup()
    before = compile_counts()["compiles"]
    sched = Scheduler(runner)
    streams = [
        sched.submit(TextContext(max_length=64, tokens=p, sampling_params=SamplingParams(top_k=1, max_new_tokens=n)))
        for p, n in zip(prompts(7, seed=9), [3, 9, 1, 20, 5, 2, 11])
    ]
    sched.run_until_idle()
    assert all(s.result().tokens for s in streams)
    assert compile_counts()["compiles"] == before


def test_no_compile_after_warmup_with_batched_prefill(llama):
    """Prompts arriving together prefill several per step (max_prefill_rows); warmup compiled those shapes too."""
    runner = ModelRunner(llama, max_batch_size=4, max_length=64, page_size=16, prefill_chunk_size=32, min_context=32)
    sched = Scheduler(runner, max_prefill_rows=4, max_prefill_tokens=64)
    runner.warmup(prefill_rows=sched.max_prefill_rows, prefill_tokens=sched.max_prefill_tokens)
    before = compile_counts()["compiles"]
    lengths = [3, 17, 30, 9, 31, 2]
    streams = [
        sched.submit(
            TextContext(
                max_length=64, tokens=np.arange(1, n + 1), sampling_params=SamplingParams(top_k=1, max_new_tokens=4)
            )
        )
        for n in lengths
    ]
    sched.run_until_idle()
    assert [len(s.result().tokens) for s in streams] == [4] * len(lengths)
    assert sched.stats.prefill_steps < len(lengths)  # some steps encoded several prompts
    assert compile_counts()["compiles"] == before


def test_cancel_frees_pages_at_once(llama):
    runner = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16)
    sched = Scheduler(runner)
    s = sched.submit(ctx([1, 2, 3], 50))
    sched.step()
    sched.step()
    assert runner.pool.num_used > 0
    sched.cancel(s.request_id)
    sched.step()
    assert runner.pool.num_used == 0
    assert s.result().status is GenerationStatus.CANCELLED


def test_bad_requests_have_clear_errors(llama):
    runner = ModelRunner(llama, max_batch_size=2, max_length=64, page_size=16)
    sched = Scheduler(runner)
    with pytest.raises(ValueError, match="max_length 128; the engine holds at most 64"):
        sched.submit(ctx([1, 2], 4))
    with pytest.raises(ValueError, match="leaves no room"):
        TextContext(max_length=4, tokens=[1, 2, 3, 4])
    with pytest.raises(ValueError, match="non-empty"):
        TextContext(max_length=4, tokens=[])
    with pytest.raises(ValueError, match="exceeds the model's context"):
        ModelRunner(llama, max_length=4096)


def test_page_pool_accounting():
    pool = PagePool(num_pages=6, page_size=4, enable_prefix_caching=True)
    a = pool.allocate(3)
    pool.seal(a, list(range(12)))
    pool.release(a)
    assert pool.num_available == 5 and pool.num_used == 0  # sealed pages stay cached but count as available
    hit = pool.match_prefix(list(range(13)))
    assert hit == a and pool.stats.hit_tokens == 12
    with pytest.raises(OutOfPagesError):
        pool.allocate(3)  # 2 free left; the 3 matched pages are held again
    pool.release(hit)
    b = pool.allocate(5)  # takes the 2 free pages, then evicts the 3 cached ones
    assert sorted(b) == [1, 2, 3, 4, 5] and pool.stats.evicted_pages == 3
    assert pool.match_prefix(list(range(13))) == []


def test_result_after_iterating_the_stream(llama):
    sched = Scheduler(ModelRunner(llama, max_batch_size=2, max_length=MAX_LEN, page_size=16))
    s = sched.submit(ctx([1, 2, 3], 5))
    sched.run_until_idle()
    events = list(s)
    assert sum(len(e.tokens) for e in events) == 5
    assert s.result().tokens == [t for e in events for t in e.tokens] and list(s) == events


def test_run_ahead_decode_equals_the_synchronous_path(llama, monkeypatch):
    """Decode steps dispatched behind the pending one (tokens taken on the device) give the no-cache greedy tokens;
    a cancel and an EOS arriving while a step is pending drop its extra token and free the pages."""
    runner = ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=8)
    ahead = []
    dispatch = runner.dispatch

    def spy(contexts, **kw):
        ahead.append(kw.get("after") is not None)
        return dispatch(contexts, **kw)

    monkeypatch.setattr(runner, "dispatch", spy)
    sched = Scheduler(runner)
    ps = prompts(3, seed=5)
    streams = [sched.submit(ctx(p, 10 + 3 * i)) for i, p in enumerate(ps)]
    victim = sched.submit(ctx([7, 8, 9], 40))
    for _ in range(8):
        sched.step()
    sched.cancel(victim.request_id)
    sched.run_until_idle()
    assert sum(ahead) >= 8  # the decode steps between prefills ran ahead
    for i, (p, s) in enumerate(zip(ps, streams)):
        assert s.result().tokens == full_forward_greedy(llama, p, 10 + 3 * i)
    assert victim.result().status.name == "CANCELLED"
    assert runner.pool.num_used == 0
    # The same with EOS set to a token the greedy run produces: it stops there, as the synchronous path does.
    eos_at = full_forward_greedy(llama, ps[0], 6)
    c = ctx(ps[0], 20)
    c.eos_token_ids = {eos_at[4]}
    first = eos_at.index(eos_at[4])
    s = sched.submit(c)
    sched.run_until_idle()
    assert s.result().tokens == eos_at[: first + 1] and s.result().status.name == "END_OF_SEQUENCE"
    assert runner.pool.num_used == 0
