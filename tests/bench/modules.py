"""Module benchmarks: `Module.compile` against raw JAX on identical weights, one process.

1. MLP 1024-4096-4096-1024, batch 64, float32: compiled forward vs ``jax.jit``
   forward (target ≤ 1.10×) and compile time vs ``jax.jit(...).lower().compile()``
   (target ≤ 3×).

Run: ``make bench`` or ``.venv/bin/python tests/bench/modules.py [--quick]``.
Results: a table on stdout and tests/bench/results/modules.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from _timing import fmt_time, interleaved, machine, save

from lowering.compile import clear_cache
from maxfx import functional as F
from maxfx.dtype import DType
from maxfx.experimental.nn import Linear, Module, module_dataclass
from maxfx.experimental.tensor import Tensor, TensorType


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
    x_t, x_j = Tensor.constant(x_np), jnp.asarray(x_np)
    in_type = TensorType(DType.float32, [64, 1024])

    # Compile time: tracing + lowering + XLA compile, measured as (first call) - (steady-state call),
    # with every cache emptied first (maxfx's executables and JAX's own compile caches).
    first: dict[str, list[float]] = {"maxfx": [], "jax.jit": []}
    compiled = exe = None
    for _ in range(compile_repeats):
        clear_cache()
        jax.clear_caches()
        t = time.perf_counter()
        compiled = model.compile(in_type)
        jax.block_until_ready(compiled(x_t)._array())
        first["maxfx"].append(time.perf_counter() - t)
        jax.clear_caches()
        t = time.perf_counter()
        exe = jax.jit(_jax_mlp).lower(params, x_j).compile()
        jax.block_until_ready(exe(params, x_j))
        first["jax.jit"].append(time.perf_counter() - t)

    np.testing.assert_allclose(compiled(x_t).to_numpy(), np.asarray(exe(params, x_j)), rtol=1e-4, atol=1e-4)
    run = interleaved(
        {
            "maxfx": lambda: jax.block_until_ready(compiled(x_t)._array()),
            "jax.jit": lambda: jax.block_until_ready(exe(params, x_j)),
        },
        repeats=repeats,
        warmup=5,
    )
    ct = {k: max(statistics.median(v) - run[k], 1e-6) for k, v in first.items()}
    print("\nMLP 1024-4096-4096-1024, batch 64, float32")
    print(f"  forward   maxfx {fmt_time(run['maxfx'])}   jax.jit {fmt_time(run['jax.jit'])}   ratio {run['maxfx'] / run['jax.jit']:.2f} (target ≤ 1.10)")
    print(f"  compile   maxfx {fmt_time(ct['maxfx'])}   jax.jit {fmt_time(ct['jax.jit'])}   ratio {ct['maxfx'] / ct['jax.jit']:.2f} (target ≤ 3)")
    return {
        "forward_s": run,
        "forward_ratio": run["maxfx"] / run["jax.jit"],
        "compile_s": ct,
        "compile_ratio": ct["maxfx"] / ct["jax.jit"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = parser.parse_args(argv)
    results = {"machine": machine(), "mlp": mlp(5 if args.quick else 50, 1 if args.quick else 3)}
    print(f"\nwritten {save('modules', results)}")
    return results


if __name__ == "__main__":
    main()
