"""Benchmark: maxfx's C++ CPU quantized products on AMX beside AVX-512 VNNI (or AVX2).

    .venv/bin/python -m tests.bench.cpu_qgemv [--repeats 30] [--rows 1,4,8,16,32,128]

On a CPU with Intel AMX (Sapphire Rapids and later) the batched products (more
than 4 rows of x) run on AMX tiles; `custom_calls.cpu.use_amx` switches that
off, so both paths are timed in one process, call by call in random order
(`_timing.interleaved`), medians. Shapes are SmolLM2-135M's (the serve and
engine benchmarks' model): the MLP's gate (1536x576) and down (576x1536)
projections and the tied head (49152x576). Without AMX the script times the one
path there is and says so. Writes tests/bench/results/cpu_qgemv.json (git-ignored).
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from custom_calls import cpu as cpu_library
from custom_calls.qmatmul import cpu
from tests.bench import _timing

SHAPES = {"gate 1536x576": (1536, 576), "down 576x1536": (576, 1536), "head 49152x576": (49152, 576)}


def _weights(rng: np.random.Generator, qname: str, n: int, k: int) -> tuple[np.ndarray, ...]:
    """Random weights in the kernel's operand layout (the values do not change the time)."""
    scales = rng.uniform(1e-3, 2e-2, (n, k // 32)).astype(np.float16)
    if qname == "Q8_0":
        return rng.integers(-127, 128, (n, k), dtype=np.int8), scales
    nbytes = {"Q4_0": 18, "Q4_K": 144}[qname]
    per = 32 if qname == "Q4_0" else 256
    packed = rng.integers(0, 256, (n, k // per, nbytes), dtype=np.uint8)
    packed[..., 0:2] = scales[:, : k // per, None].view(np.uint8).reshape(n, k // per, 2)
    if qname == "Q4_K":
        packed[..., 2:4] = scales[:, : k // per, None].view(np.uint8).reshape(n, k // per, 2)
    return (packed.reshape(n, -1),)


def _product(qname: str):
    return jax.jit({"Q8_0": cpu.q8_0_matmul, "Q4_0": cpu.q4_0_matmul, "Q4_K": cpu.q4_k_matmul}[qname])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--rows", default="1,4,8,16,32,128")
    p.add_argument("--formats", default="Q8_0,Q4_0,Q4_K")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    amx = cpu_library.qgemv_path() == "amx"
    other = "avx512-vnni" if amx else cpu_library.qgemv_path()
    print(f"batched path: {cpu_library.qgemv_path()}" + ("" if amx else " (no AMX on this CPU: one column)"))
    results = []
    for qname in args.formats.split(","):
        fn = _product(qname)
        for label, (n, k) in SHAPES.items():
            w = _weights(rng, qname, n, k)
            for rows in map(int, args.rows.split(",")):
                x = rng.standard_normal((rows, k)).astype(np.float32)

                def run(on: bool, x=x, w=w, fn=fn) -> None:
                    cpu_library.use_amx(on)
                    fn(x, *w).block_until_ready()

                cands = {other: lambda: run(False)}
                if amx:
                    cands["amx"] = lambda: run(True)
                t = _timing.interleaved(cands, repeats=args.repeats, warmup=3)
                cpu_library.use_amx(True)
                row = {
                    "format": qname,
                    "shape": label,
                    "rows": rows,
                    **{f"{c}_ms": _timing.sig(s * 1e3) for c, s in t.items()},
                }
                if amx:
                    row["speedup"] = _timing.sig(t[other] / t["amx"])
                results.append(row)
                gmacs = rows * n * k / min(t.values()) / 1e9
                print(
                    f"{qname:5} {label:15} rows {rows:4}: "
                    + "  ".join(f"{c} {_timing.fmt_time(s)}" for c, s in t.items())
                    + (f"  AMX {row['speedup']:.2f}x" if amx else "")
                    + f"  ({gmacs:.0f} GMAC/s)",
                    flush=True,
                )
    _timing.save("cpu_qgemv", {"path": cpu_library.qgemv_path(), "results": results})
    return {"results": results}


if __name__ == "__main__":
    main()
