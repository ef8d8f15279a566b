"""Structured output (maxfx.generation._grammar): JSON schemas enforced while decoding.

References that do not use the engine's grammar code: ``json`` / ``jsonschema`` on
the text, llguidance driven directly (its own matcher and bitmask, unpacked here
with shifts) on the tokens, and masked greedy decoding by full forward passes
without any KV cache (which also checks that fast-forwarded tokens reach the cache).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import llguidance
import numpy as np
import pytest
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from maxfx.generation import GrammarMatcher, ModelRunner, Scheduler, TextContext, compile_json_schema
from maxfx.generation._grammar import JSON_DEFAULTS, apply_token_masks
from maxfx.interfaces import GenerationStatus, SamplingParams
from maxfx.models import Tokenizer
from tests.models._helpers import LLAMA, model

MAX_LEN = 128
EOS = 2
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["name", "age"],
    "additionalProperties": False,  # JSON Schema allows extra keys by default; a random model would add some forever
}


@pytest.fixture(scope="module")
def llama():
    return model(str(LLAMA))


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(LLAMA / "tokenizer.json")


@pytest.fixture(scope="module")
def runner(llama):
    return ModelRunner(llama, max_batch_size=4, max_length=MAX_LEN, page_size=16, prefill_chunk_size=32)


def ctx(tok, prompt, schema=None, max_new=100, eos=(EOS,), **sampling):
    params = SamplingParams(max_new_tokens=max_new, **({"top_k": 1} | sampling))
    text = None if schema is None else json.dumps(schema)
    return TextContext(
        max_length=MAX_LEN,
        tokens=np.asarray(tok.encode(prompt)),
        eos_token_ids=set(eos),
        json_schema=text,
        sampling_params=params,
    )


def run(sched, contexts):
    streams = [sched.submit(c) for c in contexts]
    sched.run_until_idle()
    return [s.result() for s in streams]


# ─── references ───────────────────────────────────────────────────────────


def direct_matcher(tok, schema):
    llt = llguidance.LLTokenizer(tok.backend.to_str(), eos_token=[EOS])
    return llguidance.LLMatcher(
        llt, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_DEFAULTS), log_level=0
    )


def direct_allowed(m, vocab=256):
    """llguidance's own mask for the next token, as a set of ids (bit t%32 of word t//32)."""
    mask = allocate_token_bitmask(1, vocab)
    fill_next_token_bitmask(m, mask)
    words = mask[0].astype(np.int64) & 0xFFFFFFFF
    return {t for t in range(vocab) if (words[t // 32] >> (t % 32)) & 1}


def replay(tok, schema, tokens):
    """Feed ``tokens`` to a fresh llguidance matcher, checking each was allowed; returns (matcher, positions where a
    token was forced).
    """
    m = direct_matcher(tok, schema)
    forced = []
    for i, t in enumerate(tokens):
        allowed = direct_allowed(m)
        assert t in allowed, f"token {t} at {i} was not allowed by the grammar (allowed: {sorted(allowed)[:20]}...)"
        if len(allowed) == 1:
            forced.append(i)
        assert m.consume_token(t), m.get_error()
    return m, forced


def full_forward(m, ids):
    padded = np.zeros((1, MAX_LEN), np.int64)
    padded[0, : len(ids)] = ids
    return m(padded).to_numpy()[0, len(ids) - 1]


def masked_greedy_reference(llama, tok, prompt, schema, limit):
    """Greedy decoding over the grammar's allowed tokens, recomputing the whole sequence each step (no KV cache)."""
    m = direct_matcher(tok, schema)
    ids, out = list(tok.encode(prompt)), []
    while len(out) < limit and not m.is_stopped():
        ff = m.compute_ff_tokens()
        if ff:  # forced: no model call
            new = list(ff)
        else:
            logits = full_forward(llama, ids)
            allowed = np.array(sorted(direct_allowed(m)))
            new = [int(allowed[np.argmax(logits[allowed])])]
        for t in new:
            out.append(t)
            ids.append(t)
            if t == EOS:
                return out
            assert m.consume_token(t)
    return out


# ─── through the scheduler ────────────────────────────────────────────────


def test_json_schema_output_validates_and_equals_masked_greedy(llama, tok, runner):
    sched = Scheduler(runner, tokenizer=tok)
    prompts = ["Person: ", "{", "name and age?"]
    results = run(sched, [ctx(tok, p, PERSON) for p in prompts])
    forced_somewhere = False
    for p, res in zip(prompts, results):
        assert res.status is GenerationStatus.END_OF_SEQUENCE and res.finish_reason == "stop"
        value = json.loads(res.text)
        jsonschema.validate(value, PERSON)
        assert bytes(res.tokens).decode("utf-8") == res.text  # byte tokenizer: the text is exactly the tokens
        m, forced = replay(tok, PERSON, res.tokens)
        assert m.is_stopped() and m.is_accepting()  # ended exactly where the grammar is complete
        forced_somewhere |= bool(forced)
        assert res.tokens == masked_greedy_reference(llama, tok, p, PERSON, 100)
    assert forced_somewhere  # the schema's keys force tokens: the fast-forward path ran
    # Forced tokens were appended without a sampling step of their own.
    sampled = (
        sched.stats.decode_rows + sched.stats.prefill_steps
    )  # every step of a row sampled one token (no prompt needed two chunks)
    assert sched.stats.generated_tokens == sum(len(r.tokens) for r in results)
    assert sampled < sched.stats.generated_tokens
    assert runner.pool.num_used == 0


def test_json_object_and_scalar_schemas(tok, runner):
    sched = Scheduler(runner, tokenizer=tok)
    number = {"type": "integer", "minimum": 0, "maximum": 999}
    obj, obj2, num, no_eos = run(
        sched,
        [
            ctx(tok, "x", {"type": "object"}),
            ctx(tok, "A", {"type": "object"}),
            ctx(tok, "n=", number),
            ctx(tok, "Person: ", PERSON, eos=()),
        ],
    )
    for res in (obj, obj2):
        assert isinstance(json.loads(res.text), dict) and res.status is GenerationStatus.END_OF_SEQUENCE
    assert isinstance(json.loads(num.text), int) and 0 <= json.loads(num.text) <= 999
    # Without any EOS id (ignore_eos) the request still ends once the grammar is complete.
    jsonschema.validate(json.loads(no_eos.text), PERSON)
    assert no_eos.status is GenerationStatus.END_OF_SEQUENCE and EOS not in no_eos.tokens
    # json_object bounds nothing: this prompt's greedy key never closes. At the limit the
    # output is cut (finish_reason "length"), but every token still followed the grammar.
    (long,) = run(sched, [ctx(tok, "json please", {"type": "object"}, max_new=40)])
    assert long.status is GenerationStatus.MAXIMUM_LENGTH and long.finish_reason == "length" and len(long.tokens) == 40
    m, _ = replay(tok, {"type": "object"}, long.tokens)
    assert not m.is_accepting()


def test_sampling_with_temperature_and_seed(tok, runner):
    sched = Scheduler(runner, tokenizer=tok)
    first = run(sched, [ctx(tok, "Person: ", PERSON, temperature=1.0, top_k=-1, seed=s) for s in (1, 2, 3)])
    again = run(sched, [ctx(tok, "Person: ", PERSON, temperature=1.0, top_k=-1, seed=1)])
    for res in first:
        assert res.status is GenerationStatus.END_OF_SEQUENCE
        jsonschema.validate(json.loads(res.text), PERSON)
        replay(tok, PERSON, res.tokens)  # every sampled token was allowed
    assert again[0].tokens == first[0].tokens
    assert len({tuple(r.tokens) for r in first}) == 3  # the seeds sample different objects


def test_constrained_and_unconstrained_in_one_batch(tok, runner):
    free_prompt = "hello there"
    alone = run(Scheduler(runner, tokenizer=tok), [ctx(tok, free_prompt, None, max_new=30)])[0]
    sched = Scheduler(runner, tokenizer=tok)
    free, constrained, obj = run(
        sched,
        [ctx(tok, free_prompt, None, max_new=30), ctx(tok, "Person: ", PERSON), ctx(tok, "x", {"type": "object"})],
    )
    assert sched.stats.decode_rows > sched.stats.decode_steps  # rows shared decode steps
    assert free.tokens == alone.tokens and len(free.tokens) == 30
    assert not free.text.startswith("{")  # unconstrained: the mask did not leak into its row
    jsonschema.validate(json.loads(constrained.text), PERSON)
    assert isinstance(json.loads(obj.text), dict)


def test_preempted_request_is_not_fed_to_its_grammar_twice(tok, runner):
    reference = run(Scheduler(runner, tokenizer=tok), [ctx(tok, "Person: ", PERSON)])[0]
    sched = Scheduler(runner, tokenizer=tok)
    other = sched.submit(ctx(tok, "{", PERSON))
    mine = sched.submit(ctx(tok, "Person: ", PERSON))
    for _ in range(6):
        sched.step()
    assert mine.context.num_generated > 0
    assert sched._preempt_for(sched._running[0])  # the newest admitted (mine) gives its pages back
    assert mine.context.start_idx == 0
    sched.run_until_idle()
    assert sched.stats.preemptions == 1
    assert mine.result().tokens == reference.tokens  # re-prefilled, not re-consumed: same JSON
    jsonschema.validate(json.loads(other.result().text), PERSON)


def test_matcher_error_fails_that_request_only(tok, runner):
    sched = Scheduler(runner, tokenizer=tok)
    broken = sched.submit(ctx(tok, "Person: ", PERSON))
    fine = sched.submit(ctx(tok, "{", PERSON))
    sched.step()
    assert not broken.context.matcher.consume(
        1
    )  # a control byte: never valid JSON; the matcher is now in its error state
    sched.run_until_idle()
    with pytest.raises(RuntimeError, match="grammar is in an error state"):
        broken.result()
    jsonschema.validate(json.loads(fine.result().text), PERSON)
    assert sched.stats.requests_failed == 1 and runner.pool.num_used == 0


def test_bad_schemas_raise_at_submit(tok, runner):
    sched = Scheduler(runner, tokenizer=tok)
    for schema, why in (
        ('{"type": "objekt"}', "objekt"),
        ("{not json", "not valid JSON"),
        ('{"$ref": "#/nowhere"}', "nowhere"),
        ("[1, 2]", "must be a JSON object"),
    ):
        c = TextContext(max_length=MAX_LEN, tokens=np.array([5, 6]), json_schema=schema)
        with pytest.raises(ValueError, match=f"json_schema.*{why}"):
            sched.submit(c)
    assert not sched.has_work()  # nothing was queued
    with pytest.raises(ValueError, match="json_schema.*tokenizer"):
        Scheduler(runner).submit(ctx(tok, "x", PERSON))
    with pytest.raises(ValueError, match="GrammarMatcher"):
        c = ctx(tok, "x")
        c.set_matcher(object())
        sched.submit(c)


# ─── the mask itself ──────────────────────────────────────────────────────


@pytest.mark.parametrize("vocab", [200, 256, 300])
def test_token_mask_equals_llguidance_and_fits_the_model_vocab(tok, vocab):
    g = compile_json_schema(tok, json.dumps(PERSON), eos_token_ids=[EOS])
    ref = direct_matcher(tok, PERSON)
    for t in b'{"name":"ab':  # inside a string: most bytes, UTF-8 lead bytes past 200 included, are allowed
        assert g.consume(t) and ref.consume_token(t)
    bias = np.zeros((3, vocab), np.float32)
    bias[:, 7] = -1.5  # a penalty already there stays on allowed tokens
    rows = [
        SimpleNamespace(matcher=None),
        SimpleNamespace(matcher=g),
        SimpleNamespace(matcher=compile_json_schema(tok, '{"type": "object"}', eos_token_ids=[EOS])),
    ]
    apply_token_masks(rows, bias)
    assert np.all(bias[0, :7] == 0) and bias[0, 7] == -1.5  # unconstrained row untouched
    allowed = {t for t in range(vocab) if np.isfinite(bias[1, t])}
    assert (
        allowed == {t for t in direct_allowed(ref) if t < vocab} and allowed
    )  # ids past the tokenizer's 256 are never allowed
    assert {t for t in range(vocab) if np.isfinite(bias[2, t])} == {ord("{")}
    assert set(g.allowed_tokens().tolist()) == direct_allowed(ref)
    assert isinstance(g, GrammarMatcher) and not g.is_stopped()
