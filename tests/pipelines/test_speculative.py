"""`SpeculativeDecodingTextGenerationPipeline` against references that do not use it.

References: the fixture's transformers goldens (``golden.npz`` greedy ids,
``golden_text.json``), and the definition of speculative sampling (Leviathan et al.)
written out in numpy here. Drafts: the target itself (every draft accepted), a
random Llama with tiny_llama's config (nothing accepted) and the target with noised
weights (some accepted). All three share the target's pytree, so the engine's
compiled programs are shared and the file stays fast.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from maxfx.generation import TextContext
from maxfx.interfaces import (
    GenerationStatus,
    PipelineTask,
    RequestID,
    SamplingParams,
    TextGenerationInputs,
    TextGenerationRequest,
)
from maxfx.models import LlamaForCausalLM
from maxfx.pipelines import PipelineConfig
from maxfx.pipelines.lib.registry import PIPELINE_REGISTRY, get_pipeline_for_task
from maxfx.pipelines.lib.speculative_decoding import (
    SpeculativeDecodingMetrics,
    SpeculativeDecodingTextGenerationPipeline,
    rejection_sample,
    sample_from,
)
from tests.models._helpers import LLAMA, golden, model

GOLDEN = golden(LLAMA)
GOLDEN_TEXT = json.loads((LLAMA / "golden_text.json").read_text())
EOS = 2


@pytest.fixture(scope="module")
def target():
    return model(str(LLAMA))


@pytest.fixture(scope="module")
def random_draft(target):
    return LlamaForCausalLM.random(target.config, seed=1)


@pytest.fixture(scope="module")
def noised_draft(target):
    """The target with 4% Gaussian noise on its matrices: it agrees with the target about half the time."""
    leaves, tree = jax.tree_util.tree_flatten(target)
    rng = np.random.default_rng(0)
    noisy = [
        w + (0.04 * np.std(np.asarray(w)) * rng.standard_normal(w.shape)).astype(np.asarray(w).dtype)
        if w.ndim >= 2
        else w
        for w in leaves
    ]
    return jax.tree_util.tree_unflatten(tree, noisy)


def _pipeline(target, draft, k=2, **options):
    config = PipelineConfig(
        model_path=str(LLAMA), draft_model_path=str(LLAMA), max_batch_size=2, num_speculative_tokens=k, **options
    )
    return SpeculativeDecodingTextGenerationPipeline(config, None, EOS, {}, None, model=target, draft_model=draft)


def _greedy(n=16):
    return SamplingParams(top_k=1, max_new_tokens=n, ignore_eos=True)


def _contexts(params, rows=(0, 1), **kw):
    return [
        TextContext(max_length=128, tokens=GOLDEN["input_ids"][r], sampling_params=p, **kw)
        for r, p in zip(rows, params)
    ]


def _drive(pipe, contexts):
    """``execute`` until every context is done (releasing each); the tokens, final statuses and the calls it took."""
    tokens = {c.request_id: [] for c in contexts}
    status = {}
    live = {c.request_id: c for c in contexts}
    calls = 0
    while live:
        calls += 1
        assert calls < 100
        for rid, out in pipe.execute(TextGenerationInputs(batches=[dict(live)], num_steps=1)).items():
            tokens[rid] += out.tokens
            if out.is_done:
                status[rid] = out.final_status
                pipe.release(rid)
                del live[rid]
    return [tokens[c.request_id] for c in contexts], [status[c.request_id] for c in contexts], calls


# ─── (1) the target as its own draft ───────────────────────────────────────────


def test_registry_routes_a_draft_config_and_the_target_as_draft_accepts_everything():
    config = PipelineConfig(
        model_path=str(LLAMA), draft_model_path=str(LLAMA), max_batch_size=2, num_speculative_tokens=3
    )
    assert get_pipeline_for_task(PipelineTask.TEXT_GENERATION, config) is SpeculativeDecodingTextGenerationPipeline
    tokenizer, pipe = PIPELINE_REGISTRY.retrieve(config)
    assert isinstance(pipe, SpeculativeDecodingTextGenerationPipeline) and pipe.num_speculative_tokens == 3
    n = GOLDEN_TEXT["greedy_new_tokens"]
    reqs = [
        TextGenerationRequest(
            request_id=RequestID(), model_name="tiny", prompt=c["prompt"], sampling_params=_greedy(n), logprobs=2
        )
        for c in GOLDEN_TEXT["cases"]
    ]
    outs = pipe.generate(reqs)
    assert [o.tokens for o in outs] == [c["new_ids"] for c in GOLDEN_TEXT["cases"]]
    assert all(o.final_status is GenerationStatus.MAXIMUM_LENGTH for o in outs)
    m = pipe.metrics
    assert m.acceptance_rate == 1.0 and m.draft_tokens_accepted == m.draft_tokens_generated
    # 16 tokens = 1 (prefill) + 3 rounds of 3 drafts + bonus + 1 round of 2 drafts + bonus, per request
    assert (
        m.draft_tokens_generated == 2 * 11
        and m.rounds == 2 * 4
        and m.bonus_tokens_used == m.rounds
        and m.avg_acceptance_length == 11 / 4
    )
    for o in outs:  # a log probability per emitted token, the greedy token the most likely
        assert len(o.log_probabilities) == n
        for token, lp in zip(o.tokens, o.log_probabilities):
            top = lp.top_log_probabilities[0]
            assert (
                len(top) == 2
                and max(top, key=top.get) == token
                and lp.token_log_probabilities[0] == pytest.approx(top[token])
            )
    assert [p.num_used for p in pipe.kv_managers] == [0, 0]


def test_target_as_draft_with_chunked_prefill_equals_the_transformers_greedy_ids(target):
    pipe = _pipeline(
        target, target, k=2, prefill_chunk_size=8
    )  # the 12-token prompts prefill in two calls, on both models
    tokens, status, calls = _drive(pipe, _contexts([_greedy(), _greedy()]))
    assert tokens == GOLDEN["greedy_ids"].tolist()
    assert status == [GenerationStatus.MAXIMUM_LENGTH] * 2
    assert (
        pipe.metrics.acceptance_rate == 1.0 and pipe.metrics.draft_tokens_generated == 2 * 10
    )  # 2 prefill calls, then 5 rounds of 2 drafts + 1 bonus
    assert calls == 2 + 5


# ─── (2) different drafts: the output is still the target's greedy output ────────


@pytest.mark.parametrize("which", ["random_draft", "noised_draft"])
def test_a_different_draft_leaves_the_greedy_tokens_unchanged(request, target, which):
    pipe = _pipeline(target, request.getfixturevalue(which), k=3)
    tokens, _, _ = _drive(pipe, _contexts([_greedy(), _greedy()]))
    assert tokens == GOLDEN["greedy_ids"].tolist()
    m = pipe.metrics
    assert m.draft_tokens_generated > 0 and m.acceptance_rate < 1.0
    if which == "noised_draft":  # some rounds accept part of the drafts, some all of them
        assert 0.2 < m.acceptance_rate and m.bonus_tokens_used > 0
    print(f"{which}: {m}")


# ─── (3) the rejection-sampling step against its definition ─────────────────────


def _reference(drafts, q, p, u_accept, u_final):
    """Speculative sampling as the paper defines it (accept w.p. min(1, p/q); residual at the first rejection; else
    bonus).
    """

    def draw(w, u):
        w = w / w.sum()
        return int(np.argmax(np.cumsum(w) > u))

    for i, d in enumerate(drafts):
        if u_accept[i] < min(1.0, p[i, d] / q[i, d]):
            continue
        r = np.maximum(p[i] - q[i], 0)
        return i, draw(r if r.sum() > 0 else p[i], u_final)
    return len(drafts), draw(p[len(drafts)], u_final)


def test_rejection_sample_decisions_equal_the_definition():
    rng = np.random.default_rng(0)
    seen = set()
    for trial in range(400):
        k, v = int(rng.integers(0, 4)), int(rng.integers(2, 7))
        p = rng.dirichlet(np.ones(v) * 0.7, size=k + 1)
        q = rng.dirichlet(np.ones(v) * 0.7, size=k) if k else np.zeros((0, v))
        drafts = [sample_from(q[i], rng.random()) for i in range(k)]
        u, final = rng.random(k), rng.random()
        got = rejection_sample(drafts, q, p, u, final)
        assert got == _reference(drafts, q, p, u, final), trial
        seen.add("bonus" if got[0] == k else "replace")
    assert seen == {"bonus", "replace"}
    # greedy: one-hot p and q accept while the draft is the target's argmax; the final token is the argmax
    one = np.eye(5)
    p, q = one[[3, 1, 4]], one[[3, 2]]
    assert rejection_sample([3, 2], q, p, [0.99, 0.0], 0.5) == (1, 1)
    assert rejection_sample([3, 1], one[[3, 1]], p, [0.99, 0.99], 0.5) == (2, 4)
    assert sample_from(np.array([0.0, 0.0, 1.0, 0.0]), 0.999) == 2 and sample_from(np.array([0.5, 0.0, 0.5]), 0.5) == 2


def test_first_emitted_token_follows_the_target_distribution():
    p = np.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]])  # far from p: many rejections
    n = 2000
    first = np.zeros(4)
    accepted = np.zeros(3)
    for seed in range(n):
        u = np.random.default_rng(seed).random(5)
        drafts = [sample_from(q[0], u[0]), sample_from(q[1], u[1])]
        a, token = rejection_sample(drafts, q, p, u[2:4], u[4])
        first[drafts[0] if a > 0 else token] += 1
        accepted[a] += 1
    assert np.abs(first / n - p[0]).max() < 0.035  # 3.5 standard deviations of a 2000-draw frequency at most
    # the first draft is accepted with probability sum_x min(p, q) = 0.1 + 0.2 + 0.15 + 0.05
    assert abs(accepted[1:].sum() / n - 0.5) < 0.035


# ─── (4) limits and stops ──────────────────────────────────────────────────────


def test_max_new_tokens_is_exact_when_k_exceeds_the_remaining_budget(target):
    pipe = _pipeline(target, target, k=4)
    gold = GOLDEN["greedy_ids"].tolist()
    for a, b in [(1, 6), (2, 5), (3, 4)]:
        tokens, status, _ = _drive(pipe, _contexts([_greedy(a), _greedy(b)]))
        assert tokens == [gold[0][:a], gold[1][:b]] and status == [GenerationStatus.MAXIMUM_LENGTH] * 2
    # drafts never exceed what a request may still emit: after the prefill token, k_eff = min(4, remaining - 1)
    assert pipe.metrics.draft_tokens_generated == sum(max(0, min(4, n - 2)) for n in (1, 6, 2, 5, 3, 4))
    # max_length limits the same way; an EOS inside an accepted run ends the request there
    prompt = len(GOLDEN["input_ids"][0])
    eos = gold[0][3]
    limited = TextContext(
        max_length=prompt + 3, tokens=GOLDEN["input_ids"][0], sampling_params=SamplingParams(top_k=1), ignore_eos=True
    )
    stopped = TextContext(
        max_length=128,
        tokens=GOLDEN["input_ids"][0],
        sampling_params=SamplingParams(top_k=1, max_new_tokens=16),
        eos_token_ids={eos},
    )
    tokens, status, _ = _drive(pipe, [limited, stopped])
    assert tokens == [gold[0][:3], gold[0][: gold[0].index(eos) + 1]]
    assert status == [GenerationStatus.MAXIMUM_LENGTH, GenerationStatus.END_OF_SEQUENCE]


# ─── (5) release ───────────────────────────────────────────────────────────────


def test_release_frees_both_pools(target, noised_draft):
    pipe = _pipeline(target, noised_draft, k=2)
    contexts = _contexts([_greedy(), _greedy()])
    batch = {c.request_id: c for c in contexts}
    for _ in range(3):
        pipe.execute(TextGenerationInputs(batches=[batch], num_steps=1))
    assert pipe.runner.pool.num_used > 0 and pipe.draft_runner.pool.num_used > 0
    for c in contexts:
        pipe.release(c.request_id)
    assert pipe.runner.pool.num_used == 0 and pipe.draft_runner.pool.num_used == 0
    assert not pipe._shadows
    pipe.release(RequestID())  # unknown ids are ignored


# ─── seeded sampling ───────────────────────────────────────────────────────────


def test_seeded_sampling_reproduces_whatever_the_neighbour(target, noised_draft):
    pipe = _pipeline(target, noised_draft, k=3)

    def sampled(seed, row):
        return _contexts([SamplingParams(temperature=0.8, seed=seed, max_new_tokens=12, ignore_eos=True)], rows=(row,))[
            0
        ]

    first, _, _ = _drive(pipe, [sampled(7, 0), sampled(1, 1)])
    again, _, _ = _drive(pipe, [sampled(7, 0), sampled(2, 1)])
    assert again[0] == first[0] and len(first[0]) == 12
    assert first[1] != again[1]
    m = pipe.metrics
    assert m.draft_tokens_generated > 0 and 0.0 < m.acceptance_rate <= 1.0


def test_metrics_counts_and_validation(target):
    m = SpeculativeDecodingMetrics()
    assert m.acceptance_rate == 0.0 and m.avg_acceptance_length == 0.0
    m.update(6, 3, 1, [2, 1, 0])
    assert m.get_stats() == {
        "acceptance_rate": 0.5,
        "bonus_tokens_used": 1,
        "draft_tokens_accepted": 3,
        "draft_tokens_generated": 6,
        "avg_acceptance_length": 1.0,
    }
    assert m.rounds == 3 and "50.00%" in str(m)
    config = PipelineConfig(model_path=str(LLAMA), max_batch_size=2)
    with pytest.raises(ValueError, match="draft model is needed"):
        SpeculativeDecodingTextGenerationPipeline(config, None, EOS, {}, None, model=target)
