"""Eager Tensor benchmarks: maxfx against JAX, side by side in one process.

1. small step: ``y = x * 2 + 1`` on 4 float32 values, read back to numpy —
   maxfx with MAX's default semantics (each op runs when called) vs JAX eager
   (jnp). Target: ratio ≤ 1.0. The same step inside ``F.lazy()`` is shown too.
2. 20-op elementwise chain on 1M float32 values, read back — maxfx inside
   ``F.lazy()`` (one fused program) vs the same chain under ``jax.jit``
   (target ≤ 1.5×) and JAX eager; and maxfx's default mode (op by op) vs JAX
   eager.
3. cold start: a fresh process imports the library, builds a 3-element tensor,
   applies relu and prints it — maxfx vs plain JAX (target ≤ 1.5×).
4. one op at a time (MAX's default mode, results left on the device): the
   dispatch cost of single ops with and without params on a 3×4 float32
   tensor — ``F.exp``, ``F.sum(axis=-1)``, ``F.reshape``, ``F.transpose``,
   ``x[1]``, ``x @ y`` — each against its ``jnp`` counterpart (no target: shown
   so the per-op overhead stays visible).

Run: ``make bench`` or ``.venv/bin/python -m tests.bench.eager [--quick]``.
Results: a table on stdout and tests/bench/results/eager.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from maxfx import functional as F
from maxfx.tensor import Tensor
from tests.bench._timing import fmt_time, interleaved, machine, save


def small_step(repeats: int) -> dict[str, float]:
    x_np = np.arange(4, dtype=np.float32)
    xm = Tensor(x_np)
    xj = jnp.asarray(x_np)

    def maxfx_step():
        return np.asarray(xm * 2 + 1)

    def maxfx_lazy_step():
        with F.lazy():
            y = xm * 2 + 1
        return np.asarray(y)

    def jax_step():
        return np.asarray(xj * 2 + 1)

    np.testing.assert_array_equal(maxfx_step(), jax_step())
    np.testing.assert_array_equal(maxfx_lazy_step(), jax_step())
    return interleaved(
        {"maxfx": maxfx_step, "jax eager": jax_step, "maxfx lazy": maxfx_lazy_step}, repeats=repeats, warmup=200
    )


def _chain(x, relu, tanh):
    for _ in range(4):
        x = x * 1.5
        x = x + 1.0
        x = relu(x)
        x = x - 0.5
        x = tanh(x)
    return x


def fused_chain(repeats: int) -> dict[str, float]:
    x_np = np.linspace(-2, 2, 1_000_000, dtype=np.float32)
    xm = Tensor(x_np)
    xj = jnp.asarray(x_np)
    jitted = jax.jit(lambda x: _chain(x, jax.nn.relu, jnp.tanh))

    def maxfx_chain():
        with F.lazy():
            y = _chain(xm, F.relu, F.tanh)
        return np.asarray(y)

    def maxfx_default_chain():
        return np.asarray(_chain(xm, F.relu, F.tanh))

    def jit_chain():
        return np.asarray(jitted(xj))

    def eager_chain():
        return np.asarray(_chain(xj, jax.nn.relu, jnp.tanh))

    np.testing.assert_allclose(maxfx_chain(), jit_chain(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(maxfx_default_chain(), jit_chain(), rtol=1e-6, atol=1e-6)
    candidates = {
        "maxfx": maxfx_chain,
        "jax.jit": jit_chain,
        "jax eager": eager_chain,
        "maxfx default": maxfx_default_chain,
    }
    return interleaved(candidates, repeats=repeats, warmup=3)


def single_ops(repeats: int) -> dict[str, dict[str, float]]:
    a_np = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    xm, ym = Tensor(a_np), Tensor(a_np.T.copy())
    xj, yj = jnp.asarray(a_np), jnp.asarray(a_np.T)
    pairs = {
        "exp": (lambda: F.exp(xm), lambda: jnp.exp(xj)),
        "sum(axis=-1)": (lambda: F.sum(xm, axis=-1), lambda: jnp.sum(xj, axis=-1, keepdims=True)),
        "reshape": (lambda: F.reshape(xm, [4, 3]), lambda: jnp.reshape(xj, (4, 3))),
        "transpose": (lambda: F.transpose(xm, 0, 1), lambda: jnp.transpose(xj)),
        "x[1]": (lambda: xm[1], lambda: xj[1]),
        "x @ y": (lambda: xm @ ym, lambda: xj @ yj),
    }
    out = {}
    for name, (mine, theirs) in pairs.items():
        np.testing.assert_allclose(np.asarray(mine()), np.asarray(theirs()), rtol=1e-6)
        out[name] = interleaved({"maxfx": mine, "jax eager": theirs}, repeats=repeats, warmup=200)
    return out


def _report_ops(times: dict[str, dict[str, float]]) -> dict:
    print("\none op at a time on 3 × 4 f32 (maxfx: MAX's default mode; results stay on the device)")
    for name, t in times.items():
        print(
            f"  {name:13s} maxfx {fmt_time(t['maxfx'])}  jnp {fmt_time(t['jax eager'])}  ratio "
            f"{t['maxfx'] / t['jax eager']:4.2f}"
        )
    return {name: {"median_s": t, "ratio_vs_jax_eager": t["maxfx"] / t["jax eager"]} for name, t in times.items()}


COLD_MAXFX = (
    "from maxfx import functional as F\nfrom maxfx.tensor import Tensor\nprint(F.relu(Tensor([1.0, -2.0, 3.0])))\n"
)
COLD_JAX = "import jax, jax.numpy as jnp\nprint(jax.nn.relu(jnp.array([1.0, -2.0, 3.0])))\n"


def cold_start(repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {"maxfx": [], "jax": []}
    for _ in range(repeats):
        for name, code in (("maxfx", COLD_MAXFX), ("jax", COLD_JAX)):
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            samples[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in samples.items()}


def _report(title: str, times: dict[str, float], base: str, target: str) -> dict:
    print(f"\n{title}")
    for name, t in times.items():
        ratio = times["maxfx"] / t if name != "maxfx" else 1.0
        extra = f"   maxfx / {name} = {ratio:5.2f}" if not name.startswith("maxfx") else ""
        print(f"  {name:10s} {fmt_time(t)}{extra}")
    ratio = times["maxfx"] / times[base]
    print(f"  → maxfx / {base}: {ratio:.2f} (target {target})")
    return {"median_s": times, "ratio_vs_" + base.replace(" ", "_"): ratio, "target": target}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = parser.parse_args(argv)
    q = args.quick
    results = {"machine": machine()}
    results["small_step"] = _report(
        "small step: x * 2 + 1 (4 × f32) → numpy (maxfx: MAX's default, op by op)",
        small_step(300 if q else 5000),
        "jax eager",
        "≤ 1.0",
    )
    results["fused_chain"] = _report(
        "20-op elementwise chain on 1M × f32 → numpy (maxfx: inside F.lazy())",
        fused_chain(5 if q else 40),
        "jax.jit",
        "≤ 1.5",
    )
    results["single_ops"] = _report_ops(single_ops(300 if q else 3000))
    results["cold_start"] = _report(
        "cold start: import, 3-element tensor, relu, print", cold_start(2 if q else 7), "jax", "≤ 1.5"
    )
    print(f"\nwritten {save('eager', results)}")
    return results


if __name__ == "__main__":
    main()
