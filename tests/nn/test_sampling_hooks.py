"""max.nn.sampling samplers against numpy versions of their algorithms; max.nn.hooks.PrintHook."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from maxfx import nn
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType
from maxfx.nn import hooks as hooks_mod
from maxfx.nn import sampling as sampling_mod
from tests.graph_run import run_graph

CPU = DeviceRef.CPU()


def _type(a):
    return TensorType(DType.from_numpy(a.dtype), list(a.shape))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# ─── MinPSampler ──────────────────────────────────────────────────────────


def np_min_p(logits, u, min_p, temperature):
    probs = softmax(logits.astype(np.float64) / temperature)
    kept = np.where(probs >= min_p * probs.max(-1, keepdims=True), probs, 0.0)
    cdf = np.cumsum(kept, -1)
    return (cdf <= u[:, None] * cdf[:, -1:]).sum(-1), kept > 0


def test_min_p_sampler_matches_numpy_inverse_cdf(rng):
    logits = rng.normal(size=(6, 20)).astype(np.float32) * 3
    u = rng.uniform(size=6).astype(np.float32)
    sampler = nn.MinPSampler(DType.float32, [6, 1], temperature=0.7, min_p=0.2)
    assert (sampler.dtype, sampler.min_p, sampler.temperature, list(sampler.shape)) == (DType.float32, 0.2, 0.7, [6, 1])
    (tokens,) = run_graph(lambda x, uu: sampler(x, uniforms=uu), logits, u)
    ref, kept = np_min_p(logits, u, 0.2, 0.7)
    assert tokens.shape == (6, 1) and tokens.dtype == np.int64
    np.testing.assert_array_equal(tokens[:, 0], ref)
    assert kept[np.arange(6), tokens[:, 0]].all()


def test_min_p_random_draws_stay_in_the_kept_set_and_follow_probs(rng):
    row = rng.normal(size=12).astype(np.float32) * 2
    logits = np.tile(row, (4000, 1))
    sampler = nn.MinPSampler(DType.float32, [4000], min_p=0.1, seed=3)
    (tokens,) = run_graph(sampler, logits)
    _, kept = np_min_p(row[None], np.zeros(1), 0.1, 1.0)
    assert kept[0, tokens].all() and len(np.unique(tokens)) == kept.sum()
    p = softmax(row.astype(np.float64))
    p = np.where(kept[0], p, 0)
    p /= p.sum()
    freq = np.bincount(tokens, minlength=12) / len(tokens)
    np.testing.assert_allclose(freq, p, atol=0.03)
    # Same seed, same graph: same draws; another seed: different draws.
    (again,) = run_graph(nn.MinPSampler(DType.float32, [4000], min_p=0.1, seed=3), logits)
    (other,) = run_graph(nn.MinPSampler(DType.float32, [4000], min_p=0.1, seed=4), logits)
    np.testing.assert_array_equal(tokens, again)
    assert (tokens != other).any()


def test_min_p_one_keeps_only_the_argmax(rng):
    logits = rng.normal(size=(5, 30)).astype(np.float32)
    (tokens,) = run_graph(
        lambda x, uu: nn.MinPSampler(DType.float32, [5, 1], min_p=1.0)(x, uniforms=uu),
        logits,
        rng.uniform(size=5).astype(np.float32),
    )
    np.testing.assert_array_equal(tokens[:, 0], logits.argmax(-1))


def test_min_p_bad_inputs():
    with pytest.raises(ValueError, match="MinPSampler: min_p must be in"):
        nn.MinPSampler(DType.float32, [1, 1], min_p=1.5)
    s = nn.MinPSampler(DType.float32, [2, 1])
    with Graph("b", input_types=[TensorType(DType.float32, [2, 3, 4]), TensorType(DType.float16, [2, 4])]) as g:
        with pytest.raises(ValueError, match=r"MinPSampler: expected \[batch, vocab\] logits, got shape \[2, 3, 4\]"):
            s(g.inputs[0].tensor)
        with pytest.raises(ValueError, match="MinPSampler: expected float32 logits, got float16"):
            s(g.inputs[1].tensor)
    with Graph("sym", input_types=[TensorType(DType.float32, ["batch", 4])]) as g:
        with pytest.raises(ValueError, match="needs a static shape"):
            s(g.inputs[0].tensor)


# ─── speculative decoding ─────────────────────────────────────────────────


def spec_inputs(rng, batch=3, steps=4, vocab=10):
    target = rng.normal(size=(batch * (steps + 1), vocab)).astype(np.float32)
    offsets = np.arange(0, batch * (steps + 1) + 1, steps + 1).astype(np.uint32)
    draft_tokens = rng.integers(0, vocab, size=(batch, steps)).astype(np.int64)
    return target, offsets, draft_tokens


def first_true(mask):
    marked = np.concatenate([mask, np.ones((mask.shape[0], 1), bool)], 1)
    return marked.argmax(1)


def test_rejection_sampler_matches_numpy(rng):
    target, offsets, tokens = spec_inputs(rng)
    rows = offsets[:-1, None] + np.arange(4)[None]
    target_for_draft = target[rows, tokens]
    # Make draft logits reject some steps and accept others.
    draft_logits = (target_for_draft + rng.choice([-1.0, 1.0], size=tokens.shape)).astype(np.float32)
    draft_logits[1] = target_for_draft[1] - 0.5  # all accepted in sequence 1
    sampler = nn.RejectionSampler(CPU, top_k=1, eps=1e-5)
    first, sampled = run_graph(sampler, tokens, draft_logits, target, offsets)
    ref_first = first_true(draft_logits > target_for_draft + 1e-5)
    assert ref_first[1] == 4
    np.testing.assert_array_equal(first[:, 0], ref_first)
    # top_k=1: the recovered token is the argmax of the target row at the first rejection.
    np.testing.assert_array_equal(sampled[:, 0], target[offsets[:-1] + ref_first].argmax(-1))


def test_rejection_sampler_with_residuals_matches_numpy(rng):
    batch, steps, vocab = 3, 4, 10
    target, offsets, tokens = spec_inputs(rng, batch, steps, vocab)
    all_draft = rng.normal(size=(steps, batch, vocab)).astype(np.float32)
    rej_u = rng.uniform(size=(batch, steps)).astype(np.float32)
    res_u = rng.uniform(size=(batch, steps, vocab)).astype(np.float32)
    sampler = nn.RejectionSamplerWithResiduals(CPU, top_k=1)
    first, recovered, bonus = run_graph(
        lambda t, dl, tl, o, ad, r1, r2: sampler(t, dl, tl, o, ad, rejection_rand=r1, residual_rand=r2),
        tokens,
        np.zeros((batch, steps), np.float32),
        target,
        offsets,
        all_draft,
        rej_u,
        res_u,
    )
    p = softmax(target.reshape(batch, steps + 1, vocab)[:, :steps].astype(np.float64))
    q = softmax(all_draft.transpose(1, 0, 2).astype(np.float64))
    b, s = np.meshgrid(np.arange(batch), np.arange(steps), indexing="ij")
    ratio = p[b, s, tokens] / (q[b, s, tokens] + 1e-10)
    np.testing.assert_array_equal(first, first_true(rej_u >= np.minimum(ratio, 1.0)))
    resid = np.maximum(p - q, np.finfo(np.float32).tiny)
    resid /= resid.sum(-1, keepdims=True)
    np.testing.assert_array_equal(recovered, (resid / -np.log(np.maximum(res_u, np.finfo(np.float32).eps))).argmax(-1))
    np.testing.assert_array_equal(bonus[:, 0], target[offsets[1:] - 1].argmax(-1))


def test_residual_sampler_random_path_and_debug_print(rng, capfd):
    batch, steps, vocab = 2, 3, 6
    target, offsets, tokens = spec_inputs(rng, batch, steps, vocab)
    # Identical draft and target distributions: every draft is accepted (ratio ~ 1 > u).
    all_draft = target.reshape(batch, steps + 1, vocab)[:, :steps].transpose(1, 0, 2).copy()
    sampler = nn.RejectionSamplerWithResiduals(CPU, seed=1, eps=0.0, debug=True)
    first, recovered, _ = run_graph(sampler, tokens, np.zeros((batch, steps), np.float32), target, offsets, all_draft)
    jax.effects_barrier()
    np.testing.assert_array_equal(first, [steps, steps])
    assert recovered.shape == (batch, steps) and ((recovered >= 0) & (recovered < vocab)).all()
    assert "rejection_sampler.ratio = tensor(" in capfd.readouterr().out


def test_rejection_sampler_bad_inputs(rng):
    sampler = nn.RejectionSampler(CPU)
    with Graph(
        "b",
        input_types=[
            TensorType(DType.float32, [2, 3]),
            TensorType(DType.float32, [2, 3]),
            TensorType(DType.float32, [8, 5]),
            TensorType(DType.uint32, [3]),
        ],
    ) as g:
        with pytest.raises(
            ValueError,
            match=r"RejectionSampler: draft_tokens must be integer \[batch, num_steps\], got float32\[2, 3\]",
        ):
            sampler(*[v.tensor for v in g.inputs])
    with pytest.raises(ValueError, match="top_k must be an int >= 1"):
        nn.RejectionSampler(CPU, top_k=0)


# ─── PrintHook ────────────────────────────────────────────────────────────


def _mlp_graph(model, x):
    with Graph("hooked", input_types=[_type(x)]) as g:
        g.output(model(g.inputs[0].tensor))
    return g


def test_print_hook_prints_named_layer_outputs(rng, capfd):
    model = nn.Sequential([nn.Linear(4, 3, DType.float32, CPU), nn.Linear(3, 2, DType.float32, CPU)])
    state = {k: rng.normal(size=np.shape(v)).astype(np.float32) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    x = rng.normal(size=(1, 4)).astype(np.float32)
    hook = nn.PrintHook()
    try:
        assert hook.export_path is None
        hook.name_layers(model)
        g = _mlp_graph(model, x)
    finally:
        hook.remove()
    InferenceSession().load(g, weights_registry=model.state_dict()).execute(x)
    jax.effects_barrier()
    out = capfd.readouterr().out
    h = x @ state["0.weight"].T  # the state dict names a Sequential's layers by position, as in MAX ...
    # ... and PrintHook by attribute path, as MAX's does: the Sequential's list is its attribute `layers`.
    assert "model.layers.0-input_0 = tensor(" in out and "model.layers.1-output = tensor(" in out
    assert "model-output = tensor(" in out
    # The printed first-layer output is the numpy value.
    line = next(ln for ln in out.splitlines() if ln.startswith("model.layers.0-output = "))
    assert line.startswith("model.layers.0-output = tensor([[" + ", ".join(f"{v:.4f}" for v in h[0]))
    # After remove(), new graphs get no print ops.
    g2 = _mlp_graph(model, x)
    InferenceSession().load(g2, weights_registry=model.state_dict()).execute(x)
    jax.effects_barrier()
    assert "tensor(" not in capfd.readouterr().out


def test_print_hook_exports_npy_and_print_value(rng, tmp_path):
    lin = nn.Linear(4, 3, DType.float32, CPU)
    w = rng.normal(size=(3, 4)).astype(np.float32)
    lin.load_state_dict({"weight": w})
    x = rng.normal(size=(2, 4)).astype(np.float32)
    hook = nn.PrintHook(export_path=str(tmp_path))
    try:
        assert hook.export_path == str(tmp_path)
        g = _mlp_graph(lin, x)  # unnamed layers get class name + counter
        assert hook.print_value("not-a-tensor", 3) is False
    finally:
        hook.remove()
    InferenceSession().load(g, weights_registry=lin.state_dict()).execute(x)
    jax.effects_barrier()
    np.testing.assert_allclose(np.load(tmp_path / "Linear1-input_0.npy"), x)
    np.testing.assert_allclose(np.load(tmp_path / "Linear1-output.npy"), x @ w.T, rtol=1e-5, atol=1e-5)


def _printed(out: str, label: str) -> np.ndarray:
    """The values of the print labelled ``label`` (COMPACT prints, one row per line)."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"{label} = tensor("))
    text = []
    for ln in lines[start:]:
        text.append(ln.split("tensor(", 1)[-1])
        if "dtype=" in ln:
            break
    body = " ".join(text).split(", dtype=")[0]
    return np.array(eval(body), np.float32)  # noqa: S307 - the test's own printed numbers


def test_print_hook_watches_eager_modules_by_name_with_a_filter(rng, capfd):
    """MAX's name_layers / name_layers_v3 on an experimental (V3) module, and PrintHook(filter=...)."""
    from maxfx.experimental import nn as enn
    from maxfx.experimental.tensor import Tensor

    model = enn.Sequential(enn.Linear(4, 3), enn.Linear(3, 2))
    w0, b0, w1, b1 = (t.to_numpy() for _, t in model.parameters)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    hook = nn.PrintHook(filter=["model.1"])
    try:
        hook.name_layers(model)  # a V3 module goes to name_layers_v3
        model(Tensor(x))  # eager: prints at once, only the filtered layer
        out = capfd.readouterr().out
        h = x @ w0.T + b0
        assert "model.0-" not in out and "model-output" not in out
        np.testing.assert_allclose(_printed(out, "model.1-input_0"), h, rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(_printed(out, "model.1-output"), h @ w1.T + b1, rtol=1e-3, atol=1e-3)
        compiled = model.compile(TensorType(DType.float32, ["batch", 4]))  # traced copies keep the names
        compiled(Tensor(x))
        out = capfd.readouterr().out  # printed before the call returned
        np.testing.assert_allclose(_printed(out, "model.1-output"), h @ w1.T + b1, rtol=1e-3, atol=1e-3)
    finally:
        hook.remove()
    model(Tensor(x))
    assert "tensor(" not in capfd.readouterr().out
    other = nn.PrintHook()
    try:
        with pytest.raises(
            TypeError,
            match=(
                r"PrintHook.name_layers expects a max.nn \(V2\) Layer "
                r"or a max.experimental.nn \(V3\) Module, got int"
            ),
        ):
            other.name_layers(42)
    finally:
        other.remove()
    with pytest.raises(TypeError, match="filter must be a list of layer names"):
        nn.PrintHook(filter="model.1")


def test_public_module_names():
    for mod in (sampling_mod, hooks_mod):
        for name in mod.__all__:
            assert getattr(nn, name) is getattr(mod, name)


@pytest.mark.parametrize("module", ["maxfx.nn._print_hook", "maxfx.experimental.nn._hooks"])
def test_hook_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
