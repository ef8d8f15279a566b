"""LLM generation benchmark: `model.generate` (maxfx) vs a plain-JAX decode loop, same weights, one process.

The baseline is ``tests/bench/_llm_jax.py``, independent of maxfx and written for
speed as a careful JAX user would: a jitted prefill into a fixed-size cache, a
jitted decode step with the position as a device scalar, ``dynamic_update_slice``
into donated cache buffers, argmax inside the step, projections that read each
weight in place (``dot_general``), tokens read back once at the end.

maxfx runs its public API, ``model.generate(ids, max_new_tokens=n)``, greedy. Both
sides generate 1 token (prefill only) and ``n`` tokens, interleaved, medians:

- prefill tokens/s = B * T / time(1 token);
- decode tokens/s = B * (n - 1) / (time(n tokens) - time(1 token)).

Both sides are compiled before timing (compile time is not in the tokens/s, and
maxfx's programs must not recompile while timed: asserted); both must produce
the same greedy tokens (asserted). Target: maxfx >= 0.95x the JAX tokens/s.

Default (CPU, float32): a random Llama (d=512, 4 layers, 8 heads / 4 KV heads,
vocab 8192), a Qwen3-shaped and a Gemma-shaped model (`FAMILY_CONFIGS`), batch 1
and 4. ``--gpu``: a ~1.2B Llama-3.2-1B-shaped model in bfloat16 (decode batch 1
with % of HBM bandwidth) plus the same model with Q4_0 weights (`QuantizedLinear`,
maxfx only).

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
from maxfx.experimental.tensor import Tensor
from maxfx.models import GemmaConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, compile_counts
from maxfx.models._source import RandomSource
from tests.bench import _llm_jax
from tests.bench._timing import fmt_time, interleaved, machine, save

CPU_CONFIG = LlamaConfig(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=2048,
)
GPU_CONFIG = LlamaConfig(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=True,
    max_position_embeddings=8192,
)
# Llama-family variants on CPU, built as their Hugging Face config.json would be read (random weights):
# Qwen3: q/k RMSNorm over head_dim, head_dim 128 != hidden 512 / 8 heads; Gemma: (1 + w) norms,
# embeddings times sqrt(hidden), tanh-GELU MLP, tied head, multi-query, head_dim 256 != 512 / 4.
FAMILY_CONFIGS = {
    "Qwen3": Qwen3Config.from_hf(
        {
            "model_type": "qwen3",
            "vocab_size": 4096,
            "hidden_size": 512,
            "intermediate_size": 1536,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1e6,
            "tie_word_embeddings": False,
            "max_position_embeddings": 2048,
        }
    ),
    "Gemma": GemmaConfig.from_hf(
        {
            "model_type": "gemma",
            "vocab_size": 4096,
            "hidden_size": 512,
            "intermediate_size": 2048,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "max_position_embeddings": 2048,
        }
    ),
}
PEAK_HBM = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}  # bytes/s (SXM parts)


# ─── Llama-family variants: maxfx vs the plain-JAX decoder of tests/bench/_llm_jax.py ───


def jax_arch(c: LlamaConfig) -> _llm_jax.Arch:
    """The plain numbers of a config for the independent JAX decoder (refuses variants it does not implement)."""
    gemma = c.architecture == "gemma"
    plain = not (c.qkv_bias or c.o_bias or c.sliding_window or c.rope_scaling or c.rope_freq_factors)
    assert plain and c.hidden_act == ("gelu_pytorch_tanh" if gemma else "silu"), f"_llm_jax does not implement {c}"
    return _llm_jax.Arch(
        vocab=c.vocab_size,
        hidden=c.hidden_size,
        inter=c.intermediate_size,
        layers=c.num_hidden_layers,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        eps=c.rms_norm_eps,
        theta=c.rope_theta,
        tied=c.tie_word_embeddings,
        qk_norm=c.qk_norm,
        gemma=gemma,
    )


def jax_params(model: LlamaForCausalLM) -> dict:
    """The model's arrays as a plain dict by Hugging Face name (the same device buffers, no copy)."""
    return {name: t._array() for name, t in model.parameters}


def bench_generate(
    model: LlamaForCausalLM, label: str, batch: int, prompt: int, new_tokens: int, repeats: int, jax_side: bool = True
) -> dict:
    """``model.generate`` vs the `_llm_jax` loop on the same weights (module docstring: what is timed)."""
    cfg = model.config
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, prompt))
    length = -(-max(prompt, prompt + new_tokens) // 64) * 64  # the cache length generate allocates
    out: dict = {"label": label, "batch": batch, "prompt": prompt, "new_tokens": new_tokens, "cache_length": length}
    tokens: dict[str, np.ndarray] = {}

    def mx(n: int):
        tokens["maxfx"] = model.generate(ids, max_new_tokens=n)

    candidates = {"maxfx_1": lambda: mx(1), "maxfx_n": lambda: mx(new_tokens)}
    if jax_side:
        params = jax_params(model)
        prefill, decode = _llm_jax.make_steps(jax_arch(cfg))
        ids_j, pos0 = jnp.asarray(ids, jnp.int32), jnp.asarray(prompt, jnp.int32)

        def jx(n: int):
            tok, caches = prefill(params, ids_j, length=length)
            seen, pos = [tok], pos0
            for _ in range(n - 1):
                tok, caches, pos = decode(params, caches, tok, pos)
                seen.append(tok)
            tokens["jax"] = np.asarray(jnp.stack(seen, 1))  # the one read-back

        candidates |= {"jax_1": lambda: jx(1), "jax_n": lambda: jx(new_tokens)}
    out["maxfx_compile_s"] = 0.0
    for name, fn in candidates.items():
        fn()  # compile
        if name.startswith("maxfx"):
            out["maxfx_compile_s"] += model.last_stats.compile_s  # the prefill and decode programs, compiled once
    before = compile_counts()
    med = interleaved(candidates, repeats=repeats, warmup=1)
    assert compile_counts() == before, "maxfx recompiled while timed"
    sides = ("maxfx", "jax") if jax_side else ("maxfx",)
    if jax_side:
        mx(new_tokens), jx(new_tokens)
        np.testing.assert_array_equal(tokens["maxfx"], tokens["jax"].astype(np.int64))  # the same greedy continuation
    for name in sides:
        pre, full = med[f"{name}_1"], med[f"{name}_n"]
        dec = max(full - pre, 1e-12) / (new_tokens - 1)
        out[name] = {
            "prefill_s": pre,
            "prefill_tok_s": batch * prompt / pre,
            "decode_s": dec,
            "decode_tok_s": batch / dec,
        }
    if jax_side:
        out["prefill_ratio"] = out["maxfx"]["prefill_tok_s"] / out["jax"]["prefill_tok_s"]
        out["decode_ratio"] = out["maxfx"]["decode_tok_s"] / out["jax"]["decode_tok_s"]
    return out


def decode_bytes(model: LlamaForCausalLM, batch: int, length: int) -> int:
    """Bytes a decode step must read: every parameter (the tied embedding once) plus the full KV cache."""
    weights = sum(t.num_elements() * t.dtype.size_in_bytes for _, t in model.parameters)
    c = model.config
    kv_dtype = model.model.norm.weight.dtype
    cache = 2 * c.num_hidden_layers * batch * length * c.num_key_value_heads * c.head_dim * kv_dtype.size_in_bytes
    return weights + cache


def _print(r: dict, peak: float | None = None, nbytes: int | None = None) -> None:
    print(
        f"\n{r['label']}: batch {r['batch']}, prompt {r['prompt']}, {r['new_tokens']} new tokens, cache "
        f"{r['cache_length']}"
    )
    for name in ("maxfx", "jax"):
        if name in r:
            m = r[name]
            line = (
                f"  {name:6s} prefill {fmt_time(m['prefill_s'])} ({m['prefill_tok_s']:10.0f} tok/s)  "
                f"decode {fmt_time(m['decode_s'])} ({m['decode_tok_s']:8.1f} tok/s)"
            )
            if peak and nbytes:
                m["hbm_fraction"] = nbytes / m["decode_s"] / peak
                line += f"  {100 * m['hbm_fraction']:.0f}% of HBM bandwidth"
            print(line)
    print(f"  maxfx compile (prefill + decode programs, not in the tokens/s): {r['maxfx_compile_s']:.2f} s")
    if "decode_ratio" in r:
        print(
            f"  maxfx/jax tokens/s: prefill {r['prefill_ratio']:.3f}x, decode {r['decode_ratio']:.3f}x (target >= "
            "0.95x)"
        )


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
    repeats = 5 if args.quick else 15
    results: dict = {"machine": machine(), "runs": []}
    if not args.gpu:
        models = {"Llama": CPU_CONFIG, **FAMILY_CONFIGS}
        for name, cfg in models.items():
            model = LlamaForCausalLM.random(cfg, seed=0)
            for batch, prompt in ((1, 128), (4, 64)):
                r = bench_generate(model, f"CPU {name}-shaped d=512 x4 layers, float32", batch, prompt, 32, repeats)
                _print(r)
                results["runs"].append(r)
    else:
        kind = jax.devices()[0].device_kind
        peak = next((v for k, v in PEAK_HBM.items() if k in kind), None)
        start = time.perf_counter()
        model = LlamaForCausalLM.random(GPU_CONFIG, seed=0, dtype=DType.bfloat16).to(_accelerator())
        print(f"built bf16 model in {time.perf_counter() - start:.0f} s on {kind}")
        r = bench_generate(model, "~1.2B Llama bf16", 1, 512, 64, repeats)
        _print(r, peak, decode_bytes(model, 1, r["cache_length"]))
        results["runs"].append(r)
        del model
        q4 = LlamaForCausalLM.from_source(GPU_CONFIG, Q4Source(0, DType.bfloat16)).to(_accelerator())
        rq = bench_generate(q4, "~1.2B Llama Q4_0 projections (bf16 activations)", 1, 512, 64, repeats, jax_side=False)
        _print(rq, peak, decode_bytes(q4, 1, rq["cache_length"]))
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
