"""Module benchmarks: `Module.compile` against raw JAX on identical weights, one process.

1. MLP 1024-4096-4096-1024, batch 64, float32: compiled forward vs ``jax.jit``
   forward (target ≤ 1.10×) and compile time vs ``jax.jit(...).lower().compile()``
   (target ≤ 3×).
2. GPT-2-small block (batch 4, seq 128): the same two ratios; then a
   `Sequential` of 12 such blocks with different weights compiled with
   ``use_subgraphs=True`` against one block (target ≤ 2×), timing everything
   the compile call does (tracing, lowering, XLA compilation of every piece),
   interleaved with the one-block compile; and what the subgraphs cost at run
   time: the 12-block forward against the same 12 blocks compiled as one
   program (``use_subgraphs=False``).

Run: ``make bench`` or ``.venv/bin/python -m tests.bench.modules [--quick]``.
Results: a table on stdout and tests/bench/results/modules.json.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from lowering.compile import clear_cache
from maxfx import functional as F
from maxfx.dtype import DType
from maxfx.experimental.nn import LayerNorm, Linear, Module, Sequential, module_dataclass
from maxfx.experimental.tensor import Tensor, TensorType
from tests.bench._timing import fmt_time, interleaved, machine, save


@module_dataclass
class MLP(Module):
    fc1: Linear
    fc2: Linear
    fc3: Linear

    def forward(self, x: Tensor) -> Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def _jax_mlp(params, x):
    (w1, b1), (w2, b2), (w3, b3) = params
    h = jax.nn.relu(x @ w1.T + b1)
    h = jax.nn.relu(h @ w2.T + b2)
    return h @ w3.T + b3


def mlp(repeats: int, compile_repeats: int) -> dict:
    model = MLP(fc1=Linear(1024, 4096), fc2=Linear(4096, 4096), fc3=Linear(4096, 1024))
    params = [(layer.weight._array(), layer.bias._array()) for layer in (model.fc1, model.fc2, model.fc3)]
    x_np = np.random.default_rng(0).normal(size=(64, 1024)).astype(np.float32)
    x_t, x_j = Tensor(x_np), jnp.asarray(x_np)
    in_type = TensorType(DType.float32, [64, 1024])

    compiled = model.compile(in_type)
    exe = jax.jit(_jax_mlp).lower(params, x_j).compile()
    np.testing.assert_allclose(compiled(x_t).to_numpy(), np.asarray(exe(params, x_j)), rtol=1e-4, atol=1e-4)
    run = interleaved(
        {
            "maxfx": lambda: jax.block_until_ready(compiled(x_t)._array()),
            "jax.jit": lambda: jax.block_until_ready(exe(params, x_j)),
        },
        repeats=repeats,
        warmup=5,
    )
    ct = {
        "maxfx": _compile_seconds(lambda: _maxfx_compile(model, in_type, x_t), compile_repeats),
        "jax.jit": _compile_seconds(lambda: jax.jit(_jax_mlp).lower(params, x_j).compile(), compile_repeats),
    }
    print("\nMLP 1024-4096-4096-1024, batch 64, float32")
    print(
        f"  forward   maxfx {fmt_time(run['maxfx'])}   jax.jit {fmt_time(run['jax.jit'])}   ratio "
        f"{run['maxfx'] / run['jax.jit']:.2f} (target ≤ 1.10)"
    )
    print(
        f"  compile   maxfx {fmt_time(ct['maxfx'])}   jax.jit {fmt_time(ct['jax.jit'])}   ratio "
        f"{ct['maxfx'] / ct['jax.jit']:.2f} (target ≤ 3)"
    )
    return {
        "forward_s": run,
        "forward_ratio": run["maxfx"] / run["jax.jit"],
        "compile_s": ct,
        "compile_ratio": ct["maxfx"] / ct["jax.jit"],
    }


# ─── GPT-2 block ──────────────────────────────────────────────────────────

D, H, SEQ, BATCH = 768, 12, 128, 4


@module_dataclass
class GPT2Block(Module):
    ln_1: LayerNorm
    c_attn: Linear
    attn_proj: Linear
    ln_2: LayerNorm
    c_fc: Linear
    mlp_proj: Linear

    def forward(self, x: Tensor) -> Tensor:
        b, s = x.shape[0], x.shape[1]
        qkv = self.c_attn(self.ln_1(x))
        q, k, v = F.split(qkv, [D, D, D], axis=-1)
        heads = lambda t: F.permute(F.reshape(t, [b, s, H, D // H]), [0, 2, 1, 3])  # noqa: E731
        q, k, v = heads(q), heads(k), heads(v)
        scores = (q @ F.transpose(k, -1, -2)) * (1.0 / (D // H) ** 0.5)
        causal = F.band_part(
            F.broadcast_to(F.constant(1.0, DType.float32, x.device), [s, s]), num_lower=None, num_upper=0
        )
        scores = F.where(causal > 0, scores, -1e9)
        attn = F.reshape(F.permute(F.softmax(scores, axis=-1) @ v, [0, 2, 1, 3]), [b, s, D])
        x = x + self.attn_proj(attn)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def gpt2_block() -> GPT2Block:
    return GPT2Block(LayerNorm(D), Linear(D, 3 * D), Linear(D, D), LayerNorm(D), Linear(D, 4 * D), Linear(4 * D, D))


def _jax_block(p, x):
    def ln(x, w, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + 1e-5) * w + b

    b, s, _ = x.shape
    qkv = ln(x, *p["ln_1"]) @ p["c_attn"][0].T + p["c_attn"][1]
    q, k, v = jnp.split(qkv, 3, axis=-1)
    heads = lambda t: t.reshape(b, s, H, D // H).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    scores = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(D // H)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    attn = (jax.nn.softmax(scores, -1) @ v).transpose(0, 2, 1, 3).reshape(b, s, D)
    x = x + attn @ p["attn_proj"][0].T + p["attn_proj"][1]
    h = jax.nn.gelu(ln(x, *p["ln_2"]) @ p["c_fc"][0].T + p["c_fc"][1], approximate=True)
    return x + h @ p["mlp_proj"][0].T + p["mlp_proj"][1]


def _block_params(block: GPT2Block) -> dict:
    return {
        name: (getattr(block, name).weight._array(), getattr(block, name).bias._array())
        for name in ("ln_1", "c_attn", "attn_proj", "ln_2", "c_fc", "mlp_proj")
    }


def _compile_seconds(compile_only, repeats: int) -> float:
    """Median seconds of ``compile_only()`` (tracing + lowering + XLA compile, no execution), caches emptied."""
    times = []
    for _ in range(repeats):
        clear_cache()
        jax.clear_caches()
        gc.collect()  # the previous compile's weights go now, not in the middle of this timing
        t = time.perf_counter()
        compile_only()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _maxfx_compile(module, in_type, x, **options):
    """Module.compile and XLA compilation for ``x``'s shape, without running it; weights ready on return."""
    compiled = module.compile(in_type, **options)
    compiled.model._compiled.precompile([x._array()])
    jax.block_until_ready(list(compiled.model._compiled.weights.values()))


def _interleaved_compile_seconds(candidates: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each ``compile_only()``, alternating candidates, caches emptied before each."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, compile_only in candidates.items():
            times[name].append(_compile_seconds(compile_only, 1))
    return {name: statistics.median(t) for name, t in times.items()}


def gpt2(repeats: int, compile_repeats: int) -> dict:
    block = gpt2_block()
    params = _block_params(block)
    x_np = np.random.default_rng(1).normal(size=(BATCH, SEQ, D)).astype(np.float32)
    x_t, x_j = Tensor(x_np), jnp.asarray(x_np)
    in_type = TensorType(DType.float32, [BATCH, SEQ, D])
    compiled = block.compile(in_type)
    exe = jax.jit(_jax_block).lower(params, x_j).compile()
    np.testing.assert_allclose(compiled(x_t).to_numpy(), np.asarray(exe(params, x_j)), rtol=2e-3, atol=2e-3)
    run = interleaved(
        {
            "maxfx": lambda: jax.block_until_ready(compiled(x_t)._array()),
            "jax.jit": lambda: jax.block_until_ready(exe(params, x_j)),
        },
        repeats=repeats,
        warmup=3,
    )
    ct = {
        "maxfx": _compile_seconds(lambda: _maxfx_compile(block, in_type, x_t), compile_repeats),
        "jax.jit": _compile_seconds(lambda: jax.jit(_jax_block).lower(params, x_j).compile(), compile_repeats),
    }
    # 12 blocks with different weights, use_subgraphs=True, against one block: everything the compile call does.
    blocks = [gpt2_block() for _ in range(12)]
    jax.block_until_ready([t._array() for b in blocks for _, t in b.parameters])
    twelve = Sequential(*blocks)
    stack = {
        "one block": lambda: _maxfx_compile(block, in_type, x_t),
        "12 blocks": lambda: _maxfx_compile(twelve, in_type, x_t, use_subgraphs=True),
    }
    st = _interleaved_compile_seconds(stack, max(compile_repeats, 5))
    ratio = st["12 blocks"] / st["one block"]
    # The run-time price of the subgraphs: one dispatch per block, no fusion across blocks.
    whole_compile = _compile_seconds(lambda: _maxfx_compile(twelve, in_type, x_t), 1)
    pieces, whole = twelve.compile(in_type, use_subgraphs=True), twelve.compile(in_type)
    np.testing.assert_allclose(pieces(x_t).to_numpy(), whole(x_t).to_numpy(), rtol=2e-3, atol=2e-3)
    run12 = interleaved(
        {
            "subgraphs": lambda: jax.block_until_ready(pieces(x_t)._array()),
            "one program": lambda: jax.block_until_ready(whole(x_t)._array()),
        },
        repeats=max(repeats // 4, 3),
        warmup=1,
    )
    print(f"\nGPT-2-small block (batch {BATCH}, seq {SEQ}, d {D}), float32")
    print(
        f"  forward   maxfx {fmt_time(run['maxfx'])}   jax.jit {fmt_time(run['jax.jit'])}   ratio "
        f"{run['maxfx'] / run['jax.jit']:.2f} (target ≤ 1.10)"
    )
    print(
        f"  compile   maxfx {fmt_time(ct['maxfx'])}   jax.jit {fmt_time(ct['jax.jit'])}   ratio "
        f"{ct['maxfx'] / ct['jax.jit']:.2f} (target ≤ 3)"
    )
    print(
        f"  12 blocks, use_subgraphs=True: compile {fmt_time(st['12 blocks'])} vs one block "
        f"{fmt_time(st['one block'])}: ratio {ratio:.2f} (target ≤ 2)"
    )
    print(f"   (as one program, use_subgraphs=False: {fmt_time(whole_compile)});")
    print(
        f"   12-block forward with subgraphs {fmt_time(run12['subgraphs'])} vs one program "
        f"{fmt_time(run12['one program'])}: ratio {run12['subgraphs'] / run12['one program']:.2f}"
    )
    return {
        "forward_s": run,
        "forward_ratio": run["maxfx"] / run["jax.jit"],
        "compile_s": ct,
        "compile_ratio": ct["maxfx"] / ct["jax.jit"],
        "stack12_subgraphs_compile_s": st["12 blocks"],
        "stack12_one_block_compile_s": st["one block"],
        "stack12_vs_one_block_compile_ratio": ratio,
        "stack12_one_program_compile_s": whole_compile,
        "stack12_forward_s": run12,
        "stack12_forward_subgraphs_vs_one_program": run12["subgraphs"] / run12["one program"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = parser.parse_args(argv)
    results = {"machine": machine(), "mlp": mlp(5 if args.quick else 50, 1 if args.quick else 3)}
    results["gpt2_block"] = gpt2(3 if args.quick else 20, 1 if args.quick else 3)
    print(f"\nwritten {save('modules', results)}")
    return results


if __name__ == "__main__":
    main()
