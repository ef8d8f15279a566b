"""LLM inference benchmark: the eager-Module Llama (`maxfx.models`) vs a plain JAX Llama, same weights.

Both sides run in one process on identical arrays, timed alternately (medians):

- prefill: the whole prompt ``[B, T]`` into a fresh KV cache, first token out
  (tokens/s = B * T / time);
- decode: one token per row with a preallocated cache (tokens/s = B / time).

The maxfx side is `maxfx.models`' own jitted ``prefill_step`` / ``decode_step``
(the functions ``model.generate`` uses: the Module tree is the pytree argument);
the JAX side is written below with ``jax.numpy`` only. Target: maxfx ≥ 0.9× the
JAX tokens/s; the decode step must not recompile while timed (asserted).

Default (CPU): random Llama, d=512, 4 layers, 8 heads / 4 KV heads, vocab 8192,
float32; then a Qwen3-shaped and a Gemma-shaped model (vocab 4096, d=512, 4
layers, `FAMILY_CONFIGS`) against the independent plain-JAX decoder of
``tests/bench/_llm_jax.py``, written for speed (fixed-size cache updated with
``dynamic_update_slice`` in donated buffers, position as a device scalar, argmax
in the step). There both sides are compiled ahead (compile seconds reported
apart) and decode runs as a generation loop: 16 steps fed token to token on
device, tokens read back once at the end (`bench_generation`). ``--gpu``: a ~1.2B Llama-3.2-1B-shaped model in bfloat16 (decode batch 1
with % of HBM bandwidth) plus the same model with Q4_0 weights (`QuantizedLinear`).

Run: ``.venv/bin/python -m tests.bench.llm [--quick] [--gpu]``.
Results: stdout and tests/bench/results/llm.json.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from lowering.dtypes import DType
from lowering.x64 import x64
from maxfx.experimental.tensor import Tensor
from maxfx.models import GemmaConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, compile_counts
from maxfx.models._generate import decode_step, prefill_step
from maxfx.models._source import RandomSource
from tests.bench import _llm_jax
from tests.bench._timing import fmt_time, interleaved, machine, save

CPU_CONFIG = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=4, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=2048)
GPU_CONFIG = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                         max_position_embeddings=8192)
# Llama-family variants on CPU, built as their Hugging Face config.json would be read (random weights):
# Qwen3: q/k RMSNorm over head_dim, head_dim 128 != hidden 512 / 8 heads; Gemma: (1 + w) norms,
# embeddings times sqrt(hidden), tanh-GELU MLP, tied head, multi-query, head_dim 256 != 512 / 4.
FAMILY_CONFIGS = {
    "Qwen3": Qwen3Config.from_hf({"model_type": "qwen3", "vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
                                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                                  "tie_word_embeddings": False, "max_position_embeddings": 2048}),
    "Gemma": GemmaConfig.from_hf({"model_type": "gemma", "vocab_size": 4096, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4,
                                  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                                  "max_position_embeddings": 2048}),
}
PEAK_HBM = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}  # bytes/s (SXM parts)


# ─── plain JAX Llama ─────────────────────────────────────────────────────


def jax_params(model: LlamaForCausalLM) -> dict:
    """The model's arrays as a plain dict (the same device buffers, no copy)."""
    return {name: t._array() for name, t in model.parameters}


def _rms(x, w, eps):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps)).astype(x.dtype) * w


def _rope(x, pos, inv):
    ang = pos[..., None].astype(jnp.float32) * inv
    ang = jnp.concatenate([ang, ang], -1)[:, :, None, :]
    cos, sin = jnp.cos(ang).astype(x.dtype), jnp.sin(ang).astype(x.dtype)
    h = x.shape[-1] // 2
    return x * cos + jnp.concatenate([-x[..., h:], x[..., :h]], -1) * sin


def _attn(q, k, v, qpos):
    b, t, h, d = q.shape
    hkv, s = k.shape[2], k.shape[1]
    qg = q.reshape(b, t, hkv, h // hkv, d)
    sc = jnp.einsum("btgrd,bsgd->bgrts", qg, k).astype(jnp.float32) / np.sqrt(d)
    sc = jnp.where((jnp.arange(s) <= qpos[:, :, None])[:, None, None], sc, -jnp.inf)
    p = jax.nn.softmax(sc, -1).astype(v.dtype)
    return jnp.einsum("bgrts,bsgd->btgrd", p, v).reshape(b, t, h * d)


def jax_forward(params, cfg: LlamaConfig, ids, qpos, caches, fresh_len=None):
    inv = jnp.asarray(cfg.inv_freq(), jnp.float32)
    h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    x = params["model.embed_tokens.weight"][ids]
    b, t = ids.shape
    new = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        y = _rms(x, params[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = _rope((y @ params[p + "self_attn.q_proj.weight"].T).reshape(b, t, h, d), qpos, inv)
        k = _rope((y @ params[p + "self_attn.k_proj.weight"].T).reshape(b, t, hkv, d), qpos, inv)
        v = (y @ params[p + "self_attn.v_proj.weight"].T).reshape(b, t, hkv, d)
        if fresh_len is not None:
            a = _attn(q, k, v, qpos)
            pad = ((0, 0), (0, fresh_len - t), (0, 0), (0, 0))
            new.append((jnp.pad(k, pad), jnp.pad(v, pad)))
        else:
            rows = jnp.arange(b)
            kc = caches[i][0].at[rows, qpos[:, 0]].set(k[:, 0])
            vc = caches[i][1].at[rows, qpos[:, 0]].set(v[:, 0])
            a = _attn(q, kc, vc, qpos)
            new.append((kc, vc))
        x = x + a @ params[p + "self_attn.o_proj.weight"].T
        y = _rms(x, params[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        g = y @ params[p + "mlp.gate_proj.weight"].T
        x = x + (jax.nn.silu(g) * (y @ params[p + "mlp.up_proj.weight"].T)) @ params[p + "mlp.down_proj.weight"].T
    x = _rms(x, params["model.norm.weight"], cfg.rms_norm_eps)
    return x, new


def _head(params, x):
    w = params.get("lm_head.weight", params["model.embed_tokens.weight"])
    return (x @ w.T).astype(jnp.float32)


def make_jax_steps(cfg: LlamaConfig):
    def prefill(params, ids, last, *, length):
        qpos = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
        x, caches = jax_forward(params, cfg, ids, qpos, None, fresh_len=length)
        logits = _head(params, x[jnp.arange(ids.shape[0]), last])
        return jnp.argmax(logits, -1), caches

    def decode(params, caches, tokens, pos):
        x, caches = jax_forward(params, cfg, tokens[:, None], pos[:, None], caches)
        return jnp.argmax(_head(params, x[:, 0]), -1), caches

    return jax.jit(prefill, static_argnames=("length",)), jax.jit(decode, donate_argnums=(1,))


# ─── timing ──────────────────────────────────────────────────────────────


def _tensor(a, dtype) -> Tensor:
    with x64():
        return Tensor.from_dlpack(jnp.asarray(np.asarray(a, dtype)))


def bench_model(model: LlamaForCausalLM, label: str, batch: int, prompt: int, length: int, repeats: int, jax_side: bool = True) -> dict:
    cfg = model.config
    rng = np.random.default_rng(0)
    ids_np = rng.integers(0, cfg.vocab_size, (batch, prompt))
    last_np = np.full(batch, prompt - 1)
    ids, last = _tensor(ids_np, np.int64), _tensor(last_np, np.int64)
    key, one = _tensor([0, 0], np.uint32), _tensor(1.0, np.float32)
    static = {"greedy": True, "top_k": None, "use_top_p": False}
    out: dict = {"label": label, "batch": batch, "prompt": prompt, "cache_length": length}

    with x64():
        tok_mx, cache_mx = prefill_step(model, ids, last, key, one, one, length=length, **static)
    state = {"mx": (tok_mx, cache_mx), "pos": _tensor(np.full(batch, prompt), np.int64)}

    def mx_prefill():
        with x64():
            t, _ = prefill_step(model, ids, last, key, one, one, length=length, **static)
        t._array().block_until_ready()

    def mx_decode():
        with x64():
            t, c = decode_step(model, state["mx"][1], state["mx"][0], state["pos"], key, one, one, **static)
        state["mx"] = (t, c)
        t._array().block_until_ready()

    candidates_p = {"maxfx": mx_prefill}
    candidates_d = {"maxfx": mx_decode}
    if jax_side:
        params = jax_params(model)
        jprefill, jdecode = make_jax_steps(cfg)
        with x64():
            ids_j, last_j, pos_j = jnp.asarray(ids_np), jnp.asarray(last_np), jnp.full(batch, prompt)
            tok_j, cache_j = jprefill(params, ids_j, last_j, length=length)
        np.testing.assert_array_equal(np.asarray(tok_j), tok_mx.to_numpy())  # same first token from the same weights
        state["jax"] = (tok_j, cache_j)

        def jax_prefill():
            with x64():
                t, _ = jprefill(params, ids_j, last_j, length=length)
            t.block_until_ready()

        def jax_decode():
            with x64():
                t, c = jdecode(params, state["jax"][1], state["jax"][0], pos_j)
            state["jax"] = (t, c)
            t.block_until_ready()

        candidates_p["jax"] = jax_prefill
        candidates_d["jax"] = jax_decode

    pre = interleaved(candidates_p, repeats=max(3, repeats // 4), warmup=2)
    for fn in candidates_d.values():
        fn()  # compile once, outside the count
    before = compile_counts()["decode"]
    dec = interleaved(candidates_d, repeats=repeats, warmup=5)
    assert compile_counts()["decode"] == before, "decode step recompiled while timed"
    if jax_side:
        assert jdecode._cache_size() == 1
    for name in pre:
        out[name] = {"prefill_s": pre[name], "prefill_tok_s": batch * prompt / pre[name], "decode_s": dec[name], "decode_tok_s": batch / dec[name]}
    if jax_side:
        out["prefill_ratio"] = pre["jax"] / pre["maxfx"]
        out["decode_ratio"] = dec["jax"] / dec["maxfx"]
    return out


# ─── Llama-family variants: maxfx vs the plain-JAX decoder of tests/bench/_llm_jax.py ───


def jax_arch(c: LlamaConfig) -> _llm_jax.Arch:
    """The plain numbers of a config for the independent JAX decoder (refuses variants it does not implement)."""
    gemma = c.architecture == "gemma"
    plain = not (c.qkv_bias or c.o_bias or c.sliding_window or c.rope_scaling or c.rope_freq_factors)
    assert plain and c.hidden_act == ("gelu_pytorch_tanh" if gemma else "silu"), f"_llm_jax does not implement {c}"
    return _llm_jax.Arch(
        vocab=c.vocab_size, hidden=c.hidden_size, inter=c.intermediate_size, layers=c.num_hidden_layers, heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads, head_dim=c.head_dim, eps=c.rms_norm_eps, theta=c.rope_theta, tied=c.tie_word_embeddings,
        qk_norm=c.qk_norm, gemma=gemma,
    )  # fmt: skip


def _timed_compile(jitted, *args, **static):
    start = time.perf_counter()
    exe = jitted.lower(*args, **static).compile()
    return exe, time.perf_counter() - start


def bench_generation(model: LlamaForCausalLM, label: str, batch: int, prompt: int, length: int, steps: int, repeats: int) -> dict:
    """maxfx's compiled prefill / decode steps vs `_llm_jax`'s on the same weights, as a generation loop runs them.

    Both sides are compiled ahead (``lower().compile()``, timed and reported
    apart). Prefill: one call per sample, waited for. Decode: ``steps`` tokens
    per sample, each step fed the previous step's token on device, the tokens
    read back once at the end (tokens/s = batch * steps / time). Every sample
    restarts from the prefill's token and position, so each side's tokens must
    be the same every time, and the same as the other side's.
    """
    cfg = model.config
    rng = np.random.default_rng(0)
    ids_np = rng.integers(0, cfg.vocab_size, (batch, prompt))
    ids, last = _tensor(ids_np, np.int64), _tensor(np.full(batch, prompt - 1), np.int64)
    key, one = _tensor([0, 0], np.uint32), _tensor(1.0, np.float32)
    static = {"greedy": True, "top_k": None, "use_top_p": False}
    mx_pos = [_tensor(np.full(batch, prompt + i), np.int64) for i in range(steps)]
    out: dict = {"label": label, "batch": batch, "prompt": prompt, "cache_length": length, "decode_steps": steps}

    with x64():
        mx_pre, mx_pre_c = _timed_compile(prefill_step, model, ids, last, key, one, one, length=length, **static)
        tok_mx, cache_mx = mx_pre(model, ids, last, key, one, one)
        mx_dec, mx_dec_c = _timed_compile(decode_step, model, cache_mx, tok_mx, mx_pos[0], key, one, one, **static)

    arch, params = jax_arch(cfg), jax_params(model)
    jprefill, jdecode = _llm_jax.make_steps(arch)
    ids_j, pos0 = jnp.asarray(ids_np, jnp.int32), jnp.asarray(prompt, jnp.int32)
    j_pre, j_pre_c = _timed_compile(jprefill, params, ids_j, length=length)
    tok_j, cache_j = j_pre(params, ids_j)
    j_dec, j_dec_c = _timed_compile(jdecode, params, cache_j, tok_j, pos0)
    np.testing.assert_array_equal(np.asarray(tok_j), tok_mx.to_numpy())  # same first token from the same weights

    state = {"mx": cache_mx, "jax": cache_j}
    tokens: dict[str, np.ndarray] = {}

    def mx_prefill():
        with x64():
            t, _ = mx_pre(model, ids, last, key, one, one)
        t._array().block_until_ready()

    def jax_prefill():
        t, _ = j_pre(params, ids_j)
        t.block_until_ready()

    def mx_decode():
        t, c, seen = tok_mx, state["mx"], []
        with x64():
            for pos in mx_pos:
                t, c = mx_dec(model, c, t, pos, key, one, one)
                seen.append(t._array())
        state["mx"] = c
        tokens["maxfx"] = np.asarray(jnp.stack(seen))

    def jax_decode():
        t, c, pos, seen = tok_j, state["jax"], pos0, []
        for _ in range(steps):
            t, c, pos = j_dec(params, c, t, pos)
            seen.append(t)
        state["jax"] = c
        tokens["jax"] = np.asarray(jnp.stack(seen))

    pre = interleaved({"maxfx": mx_prefill, "jax": jax_prefill}, repeats=repeats, warmup=2)
    dec = interleaved({"maxfx": mx_decode, "jax": jax_decode}, repeats=max(3, repeats // 4), warmup=1)
    np.testing.assert_array_equal(tokens["maxfx"], tokens["jax"].astype(np.int64))  # the same greedy continuation
    compile_s = {"maxfx": (mx_pre_c, mx_dec_c), "jax": (j_pre_c, j_dec_c)}
    for name in pre:
        out[name] = {
            "prefill_s": pre[name], "prefill_tok_s": batch * prompt / pre[name], "decode_s": dec[name] / steps,
            "decode_tok_s": batch * steps / dec[name], "prefill_compile_s": compile_s[name][0], "decode_compile_s": compile_s[name][1],
        }  # fmt: skip
    out["prefill_ratio"] = pre["jax"] / pre["maxfx"]
    out["decode_ratio"] = dec["jax"] / dec["maxfx"]
    return out


def decode_bytes(model: LlamaForCausalLM, batch: int, length: int) -> int:
    """Bytes a decode step must read: every parameter (the tied embedding once) plus the full KV cache."""
    weights = sum(t.num_elements() * t.dtype.size_in_bytes for _, t in model.parameters)
    c = model.config
    kv_dtype = model.model.norm.weight.dtype
    cache = 2 * c.num_hidden_layers * batch * length * c.num_key_value_heads * c.head_dim * kv_dtype.size_in_bytes
    return weights + cache


def _print(r: dict, peak: float | None = None, nbytes: int | None = None) -> None:
    print(f"\n{r['label']}: batch {r['batch']}, prompt {r['prompt']}, cache {r['cache_length']}")
    for name in ("maxfx", "jax"):
        if name in r:
            m = r[name]
            line = f"  {name:6s} prefill {fmt_time(m['prefill_s'])} ({m['prefill_tok_s']:10.0f} tok/s)  decode {fmt_time(m['decode_s'])} ({m['decode_tok_s']:8.1f} tok/s)"
            if peak and nbytes:
                m["hbm_fraction"] = nbytes / m["decode_s"] / peak
                line += f"  {100 * m['hbm_fraction']:.0f}% of HBM bandwidth"
            print(line)
    for name in ("maxfx", "jax"):
        if "prefill_compile_s" in r.get(name, {}):
            m = r[name]
            print(f"  {name:6s} compile: prefill {m['prefill_compile_s']:.2f} s, decode step {m['decode_compile_s']:.2f} s (not in the tok/s)")
    if "decode_ratio" in r:
        print(f"  maxfx/jax tokens/s: prefill {r['prefill_ratio']:.3f}x, decode {r['decode_ratio']:.3f}x (target >= 0.9x)")


class Q4Source(RandomSource):
    """Random weights with every projection quantized to Q4_0 (packed, `QuantizedLinear`)."""

    def linear(self, name, out_dim, in_dim, *, rope_heads=None):
        import gguf  # noqa: PLC0415

        from maxfx.experimental.nn import QuantizedLinear  # noqa: PLC0415

        w = self._rng.standard_normal((out_dim, in_dim), np.float32) / np.float32(np.sqrt(in_dim))
        packed = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
        return QuantizedLinear(Tensor.from_dlpack(np.ascontiguousarray(packed)), "Q4_0")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--gpu", action="store_true", help="~1B Llama in bfloat16 (+ Q4_0) on the default accelerator")
    args = parser.parse_args(argv)
    repeats = 20 if args.quick else 60
    results: dict = {"machine": machine(), "runs": []}
    if not args.gpu:
        model = LlamaForCausalLM.random(CPU_CONFIG, seed=0)
        for batch, prompt in ((1, 128), (4, 64)):
            r = bench_model(model, "CPU Llama d=512 x4 layers, float32", batch, prompt, 256, repeats)
            _print(r)
            results["runs"].append(r)
        for name, cfg in FAMILY_CONFIGS.items():
            model = LlamaForCausalLM.random(cfg, seed=0)
            for batch, prompt in ((1, 128), (4, 64)):
                r = bench_generation(model, f"CPU {name}-shaped d=512 x4 layers, float32 (vs _llm_jax)", batch, prompt, 256, 16, repeats)
                _print(r)
                results["runs"].append(r)
    else:
        kind = jax.devices()[0].device_kind
        peak = next((v for k, v in PEAK_HBM.items() if k in kind), None)
        start = time.perf_counter()
        model = LlamaForCausalLM.random(GPU_CONFIG, seed=0, dtype=DType.bfloat16).to(_accelerator())
        print(f"built bf16 model in {time.perf_counter() - start:.0f} s on {kind}")
        r = bench_model(model, "~1.2B Llama bf16", 1, 512, 1024, repeats)
        _print(r, peak, decode_bytes(model, 1, 1024))
        results["runs"].append(r)
        del model
        q4 = LlamaForCausalLM.from_source(GPU_CONFIG, Q4Source(0, DType.bfloat16)).to(_accelerator())
        rq = bench_model(q4, "~1.2B Llama Q4_0 projections (bf16 activations)", 1, 512, 1024, repeats, jax_side=False)
        _print(rq, peak, decode_bytes(q4, 1, 1024))
        rq["q4_over_bf16_decode"] = rq["maxfx"]["decode_tok_s"] / r["maxfx"]["decode_tok_s"]
        print(f"  Q4_0 / bf16 decode tokens/s: {rq['q4_over_bf16_decode']:.2f}x (target >= 1.8x)")
        results["runs"].append(rq)
    print(f"\nwritten {save('llm', results)}")
    return results


def _accelerator():
    from maxfx import driver  # noqa: PLC0415

    return driver.Accelerator()


if __name__ == "__main__":
    main()
