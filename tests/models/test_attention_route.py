"""The eager-Module models' attention runs through the registry ``attention`` op, hence the Pallas kernel.

With ``MAXFX_PALLAS_INTERPRET=1`` the op's dispatch runs the Pallas flash kernel
in interpret mode on CPU; the tests count the kernel's entry point
(``custom_calls.attention.pallas_flash.flash_attention``) to prove the route,
for a full forward (causal prompt) and for decode steps against the
preallocated KV cache (one query per row at its own position, valid length =
position + 1, rows at different positions), and compare the logits with the
reference path (the jnp attention the dispatch runs on CPU by default).

Eager programs are cached per structure and shape, not per kernel mode, so the
two modes use different shapes (causal attention: padding after a sequence
leaves its logits alone); the jitted steps are fresh lambdas, traced anew.
The generated logits also match a full forward (no cache) of prompt + fed tokens.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from custom_calls.attention import dispatch
from custom_calls.attention import pallas_decode as pd
from custom_calls.attention import pallas_flash as pf
from lowering.compile import clear_cache
from lowering.x64 import x64
from maxfx.experimental import functional as F
from maxfx.experimental.tensor import Tensor
from maxfx.models import LlamaConfig, LlamaForCausalLM
from maxfx.models._layers import positions

CFG = LlamaConfig(
    vocab_size=48,
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
PROMPT = np.array([[5, 17, 3, 40, 11, 2], [7, 29, 13, 1, 0, 0]], np.int64)  # row 1 is 4 tokens long, right-padded
LENGTHS = np.array([6, 4], np.int64)
FED = np.array([[3, 9], [17, 1]], np.int64)  # the tokens fed to decode steps 1 and 2 (rows)
ATOL = 2e-5


@pytest.fixture(scope="module")
def llama():
    return LlamaForCausalLM.random(CFG, seed=3)


@pytest.fixture
def kernel_calls(monkeypatch):
    """Returns a function that switches interpret mode on or off; the list records each kernel trace (kernel, q shape).

    Prefill runs the flash kernel; one-token decode steps the split-K decode kernel.
    """
    calls: list[tuple] = []

    def counting(kernel, real):
        def run(q, *args, **kwargs):
            calls.append((kernel, tuple(q.shape)))
            return real(q, *args, **kwargs)

        return run

    monkeypatch.setattr(pf, "flash_attention", counting("flash", pf.flash_attention))
    monkeypatch.setattr(pd, "decode_attention", counting("decode", pd.decode_attention))

    def mode(interpret: bool) -> list:
        if interpret:
            monkeypatch.setenv(dispatch.ENV_INTERPRET, "1")
        else:
            monkeypatch.delenv(dispatch.ENV_INTERPRET, raising=False)
        clear_cache()  # compiled graphs are cached per structure, not per kernel mode
        calls.clear()
        return calls

    yield mode
    monkeypatch.delenv(dispatch.ENV_INTERPRET, raising=False)
    clear_cache()


def _eager_forward(model, ids: np.ndarray) -> np.ndarray:
    with x64():
        return model(Tensor(ids)).to_numpy()


def _prefill(model, ids, length):
    h, caches = model.hidden(ids, positions(ids), [("fresh", length)] * model.num_layers)
    return model.head(h), caches


def _decode(model, caches, tokens, pos):
    h, caches = model.hidden(F.unsqueeze(tokens, -1), F.unsqueeze(pos, -1), caches)
    return model.head(F.squeeze(h, 1)), caches


def _generation_logits(model, pad: int, length: int) -> list[np.ndarray]:
    """Logits at each row's prompt end, then after two decode steps (fresh jitted lambdas: traced in the current
    mode).
    """
    ids = np.zeros((2, pad), np.int64)
    ids[:, : PROMPT.shape[1]] = PROMPT
    with x64():
        logits, caches = jax.jit(lambda m, x: _prefill(m, x, length))(model, Tensor(ids))
        out = [logits.to_numpy()[np.arange(2), LENGTHS - 1]]
        step = jax.jit(lambda m, c, t, p: _decode(m, c, t, p))
        for i in range(FED.shape[1]):
            logits, caches = step(model, caches, Tensor(FED[:, i]), Tensor(LENGTHS + i))
            out.append(logits.to_numpy())
    return out


def test_forward_runs_the_pallas_kernel(llama, kernel_calls):
    calls = kernel_calls(True)
    got = _eager_forward(llama, PROMPT[:, :5])  # [2, 5]: a shape the reference run below does not use
    assert calls, "the Llama forward did not reach the Pallas flash kernel"
    assert all(kernel == "flash" and s[1:] == (5, CFG.num_attention_heads, CFG.head_dim) for kernel, s in calls)
    calls = kernel_calls(False)
    want = _eager_forward(llama, PROMPT)[:, :5]
    if dispatch.kernel_mode() is None:
        assert not calls, "the reference path ran the kernel"
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def test_prefill_and_decode_run_the_pallas_kernel(llama, kernel_calls):
    calls = kernel_calls(True)
    got = _generation_logits(llama, pad=8, length=16)
    shapes = set(calls)
    assert ("flash", (2, 8, CFG.num_attention_heads, CFG.head_dim)) in shapes, (
        f"prefill did not reach the flash kernel: {shapes}"
    )
    assert ("decode", (2, 1, CFG.num_attention_heads, CFG.head_dim)) in shapes, (
        f"decode did not reach the decode kernel: {shapes}"
    )
    calls = kernel_calls(False)
    want = _generation_logits(llama, pad=6, length=24)  # other padding and cache length: same logits
    if dispatch.kernel_mode() is None:
        assert not calls, "the reference path ran the kernel"
    assert len(got) == len(want) == 3
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, atol=ATOL, rtol=0, err_msg=f"step {i}")
    # independent of the cache: the full forward of prompt + fed tokens, at the positions the steps ran
    seq = np.zeros((2, 8), np.int64)
    for b in range(2):
        seq[b, : LENGTHS[b] + FED.shape[1]] = np.concatenate([PROMPT[b, : LENGTHS[b]], FED[b]])
    full = _eager_forward(llama, seq)
    for i, g in enumerate(got):
        np.testing.assert_allclose(
            g, full[np.arange(2), LENGTHS - 1 + i], atol=ATOL, rtol=0, err_msg=f"step {i} vs full forward"
        )
