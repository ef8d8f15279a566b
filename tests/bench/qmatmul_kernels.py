"""Benchmark: Pallas quantized-matmul kernels vs the XLA bf16 matmul ``x @ w.T``.

GPU (the real run)::

    python3 -m tests.bench.qmatmul_kernels            # all formats, decode + prefill
    python3 -m tests.bench.qmatmul_kernels --formats Q4_0,Q4_K --no-prefill

CPU smoke (tiny shapes, Pallas interpret mode; exercised by
tests/custom_calls/test_qmatmul_kernels.py so the script cannot rot)::

    .venv/bin/python -m tests.bench.qmatmul_kernels --smoke

Method. Each candidate is one ``jax.jit`` holding ``R`` independent matmuls,
each with its *own* activation and weight (so no operand is shared that XLA
could merge, and the weights of one call — ≥ 150 MB in bf16 at 4096×4096 —
do not sit in the 50 MB L2 for the next). Candidates (bf16 XLA and every
kernel tiling) are timed alternately (``_timing.interleaved``), medians of
the wall time of one jitted call divided by ``R``. Decode (M=1): ``speedup =
t_bf16 / t_kernel`` and the kernel's effective bandwidth (prepared weight
bytes / time). Prefill (M=512): ``throughput ratio = t_bf16 / t_kernel``.
Writes tests/bench/results/qmatmul_kernels.json (git-ignored).
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp

from custom_calls.qmatmul import pallas_gguf, pallas_gptq
from custom_calls.qmatmul import reference as ref
from custom_calls.qmatmul._pallas_core import KernelConfig, default_config
from tests.bench import _timing

FORMATS = ("Q4_0", "Q4_K", "Q5_K", "Q8_0", "Q6_K", "GPTQ", "INT8")
GPTQ_GROUP = 128


# Tilings swept per shape class (the default heuristic is always timed too).
def _fma(bn, splits=1, unroll=1, warps=4):
    return KernelConfig(bm=1, bn=bn, mode="fma", splits=splits, unroll=unroll, num_warps=warps, num_stages=3)


DECODE_CONFIGS = {
    "fma_bn16": _fma(16),
    "fma_bn16_u4": _fma(16, unroll=4),
    "fma_bn16_s4_u2": _fma(16, splits=4, unroll=2),
    "fma_bn8_s4_u4": _fma(8, splits=4, unroll=4, warps=2),
    "fma_bn32_s4_u2": _fma(32, splits=4, unroll=2),
    "fma_bn16_s8": _fma(16, splits=8),
    "fma_bn32_s2_u4_w8": _fma(32, splits=2, unroll=4, warps=8),
    "fma_bn16_s2_u8": _fma(16, splits=2, unroll=8),
    "dot_bm16_bn32_swap_s4_u2": KernelConfig(bm=16, bn=32, swap=True, splits=4, unroll=2, num_warps=4, num_stages=3),
    "dot_bm16_bn64_s2_u2": KernelConfig(bm=16, bn=64, splits=2, unroll=2, num_warps=4, num_stages=3),
}
PREFILL_CONFIGS = {
    "bm128_bn128_w8_s2_swap": KernelConfig(bm=128, bn=128, swap=True, num_warps=8, num_stages=2),
    "bm128_bn128_w8_s2": KernelConfig(bm=128, bn=128, num_warps=8, num_stages=2),
    "bm64_bn128_w4_s3": KernelConfig(bm=64, bn=128, num_warps=4, num_stages=3),
    "bm64_bn128_w4_s3_swap": KernelConfig(bm=64, bn=128, swap=True, num_warps=4, num_stages=3),
    "bm128_bn64_w4_s2": KernelConfig(bm=128, bn=64, num_warps=4, num_stages=2),
    "bm128_bn128_w4_s2_swap": KernelConfig(bm=128, bn=128, swap=True, num_warps=4, num_stages=2),
}


def _gpu_times(fn, iters: int):
    """(busy, span) ns per call of ``fn`` from a profiler trace: the summed duration of the GPU
    kernels (busy) and first-start-to-last-end (span). None when the trace has no GPU stream events."""
    import glob
    import shutil
    import tempfile

    from jax.profiler import ProfileData

    d = tempfile.mkdtemp()
    try:
        jax.profiler.start_trace(d)
        for _ in range(iters):
            fn()
        jax.profiler.stop_trace()
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        if not files:
            return None
        busy, lo, hi, lines = 0, None, None, set()
        for plane in ProfileData.from_file(files[0]).planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in plane.lines:
                lines.add(line.name)
                if not line.name.startswith("Stream"):
                    continue
                for e in line.events:
                    busy += e.duration_ns
                    lo = e.start_ns if lo is None else min(lo, e.start_ns)
                    hi = e.start_ns + e.duration_ns if hi is None else max(hi, e.start_ns + e.duration_ns)
        _LINES.update(lines)
        return None if lo is None else (busy / iters, (hi - lo) / iters)
    finally:
        shutil.rmtree(d, ignore_errors=True)


_LINES: set[str] = set()


def device_interleaved(cands: dict, rounds: int = 3, iters: int = 2) -> dict[str, tuple[float, float]] | None:
    """Median (busy, span) seconds per call of each candidate, traced alternately; None without GPU events."""
    samples: dict[str, list] = {k: [] for k in cands}
    for _ in range(rounds):
        for name, fn in cands.items():
            r = _gpu_times(fn, iters)
            if r is None:
                return None
            samples[name].append(r)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return {k: (med([b for b, _ in v]) * 1e-9, med([sp for _, sp in v]) * 1e-9) for k, v in samples.items()}


def _f16_bytes(key, shape, scale=0.05):
    v = jax.random.uniform(key, shape, jnp.float32, -scale, scale).astype(jnp.float16)
    return jax.lax.bitcast_convert_type(v, jnp.uint8)  # shape + (2,)


def make_weight(fmt: str, key, n: int, k: int, *, dequant: bool = False):
    """A random prepared weight of ``fmt``, logical shape ``[N, K]``, built on device.

    With ``dequant`` returns ``(prepared, float32 [N, K] reference dequantization)``.
    """
    w, deq = _make_weight(fmt, key, n, k)
    return (w, deq()) if dequant else w


def _make_weight(fmt: str, key, n: int, k: int):
    kq, ks = jax.random.split(key)
    if fmt in pallas_gguf.FORMATS:
        elems, nbytes = ref.block_shape(fmt)
        nb = k // elems
        b = jax.random.bits(kq, (n, nb, nbytes), jnp.uint8)
        offs = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[fmt]
        for i, off in enumerate(offs):
            b = b.at[..., off : off + 2].set(_f16_bytes(jax.random.fold_in(ks, i), (n, nb)))
        raw = b.reshape(n, nb * nbytes)
        return jax.jit(pallas_gguf.prepare, static_argnums=0)(fmt, raw), lambda: ref.dequantize(fmt, raw)
    if fmt == "GPTQ":
        g = GPTQ_GROUP
        q = jax.random.bits(kq, (k // 2, n), jnp.uint8)
        s = _f16_bytes(ks, (k // g, n), 0.02).reshape(2 * k // g, n)
        packed = jnp.concatenate([q, s], axis=0)
        w = jax.jit(pallas_gptq.prepare_gptq, static_argnames="group_size")(packed, group_size=g)
        return w, lambda: ref.gptq_dequantize_packed(packed, group_size=g).T
    if fmt == "INT8":
        q = jax.lax.bitcast_convert_type(jax.random.bits(kq, (n, k), jnp.uint8), jnp.int8)
        s = jax.random.uniform(ks, (n,), jnp.float32, 0.001, 0.02)
        return jax.jit(pallas_gptq.prepare_int8)(q, s), lambda: ref.int8_dequantize(q, s)
    raise ValueError(f"unknown format {fmt}")


def kernel_fn(fmt: str, cfg: KernelConfig | None, interpret: bool):
    if fmt == "GPTQ":
        return lambda x, w: pallas_gptq.gptq_qmatmul(x, w, group_size=GPTQ_GROUP, config=cfg, interpret=interpret)
    if fmt == "INT8":
        return lambda x, w: pallas_gptq.int8_qmatmul(x, w, config=cfg, interpret=interpret)
    return lambda x, w: pallas_gguf.qmatmul(fmt, x, w, config=cfg, interpret=interpret)


def _chain(fn):
    return jax.jit(lambda xs, ws: [fn(x, w) for x, w in zip(xs, ws)])


def bench_case(fmt, m, n, k, configs, *, reps, repeats, interpret, key):
    """Time bf16 XLA and each kernel tiling on one shape; returns a result dict."""
    kx, kw, kb = jax.random.split(key, 3)
    xs = [jax.random.normal(jax.random.fold_in(kx, r), (m, k), jnp.bfloat16) for r in range(reps)]
    w0, w_deq = make_weight(fmt, jax.random.fold_in(kw, 0), n, k, dequant=True)
    wq = [w0] + [make_weight(fmt, jax.random.fold_in(kw, r), n, k) for r in range(1, reps)]
    wb = [jax.random.normal(jax.random.fold_in(kb, r), (n, k), jnp.bfloat16) for r in range(reps)]
    jax.block_until_ready((xs, wq, wb))
    cands = {"xla_bf16": (_chain(lambda x, w: x @ w.T), wb)}
    n_chunks, np_ = wq[0].kp // 256, wq[0].np_
    dflt = default_config(m, n_chunks, np_)
    result = {"format": fmt, "M": m, "N": n, "K": k, "reps_per_call": reps, "default_config": str(dflt), "configs": {}}
    for name, cfg in {"default": None, **configs}.items():
        if cfg is not None and (np_ % cfg.bn or (cfg.mode == "fma") != (m == 1) or n_chunks % cfg.splits):
            continue
        f = _chain(kernel_fn(fmt, cfg, interpret))
        t0 = time.perf_counter()
        try:
            jax.block_until_ready(f(xs, wq))
        except Exception as e:  # noqa: BLE001 - record tilings that fail to compile
            result["configs"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            continue
        result["configs"][name] = {"compile_s": round(time.perf_counter() - t0, 2)}
        cands[name] = (f, wq)
    if len(cands) == 1:
        result["best"] = None
        return result
    calls = {name: (lambda f=f, w=w: jax.block_until_ready(f(xs, w))) for name, (f, w) in cands.items()}
    wall = _timing.interleaved(calls, repeats=repeats, warmup=2)
    dev = None if interpret else device_interleaved(calls)
    # Primary figure: GPU busy time (kernels only; what a CUDA-graph'd or well-pipelined model sees),
    # else wall time per matmul.
    times = {k: (dev[k][0] if dev else wall[k]) / reps for k in calls}
    result["timing"] = "gpu_busy" if dev else "wall"
    t_bf16 = times.pop("xla_bf16")
    result["xla_bf16_us"] = round(t_bf16 * 1e6, 2)
    result["xla_bf16_wall_us"] = round(wall["xla_bf16"] / reps * 1e6, 2)
    wbytes = wq[0].nbytes
    for name, t in times.items():
        entry = dict(
            us=round(t * 1e6, 2), speedup_vs_bf16=_timing.sig(t_bf16 / t), weight_GBps=_timing.sig(wbytes / t / 1e9)
        )
        entry["wall_us"] = round(wall[name] / reps * 1e6, 2)
        entry["wall_speedup_vs_bf16"] = _timing.sig(wall["xla_bf16"] / wall[name])
        if dev:
            entry["span_us"] = round(dev[name][1] / reps * 1e6, 2)
        result["configs"][name].update(entry)
    best = min(times, key=times.get)
    result["best"] = best
    result["best_speedup_vs_bf16"] = result["configs"][best]["speedup_vs_bf16"]
    result["default_speedup_vs_bf16"] = result["configs"].get("default", {}).get("speedup_vs_bf16")
    result["bf16_weight_GBps"] = _timing.sig(n * k * 2 / t_bf16 / 1e9)
    # Check the best tiling's numbers against dequantize + f32 matmul (same device).
    y = kernel_fn(fmt, None if best == "default" else configs[best], interpret)(xs[0], wq[0])
    want = jnp.dot(xs[0].astype(jnp.float32), w_deq.T, precision="highest")
    result["best_max_rel_err"] = float(jnp.max(jnp.abs(y.astype(jnp.float32) - want)) / jnp.max(jnp.abs(want)))
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes in Pallas interpret mode (CPU)")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--no-prefill", action="store_true")
    p.add_argument("--no-sweep", action="store_true", help="time only the default tiling")
    p.add_argument("--sweep-formats", default="Q4_0,Q4_K", help="formats whose tilings are swept")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--reps", type=int, default=12, help="independent matmuls (own x and weight) per timed call")
    p.add_argument("--budget-s", type=float, default=0, help="skip the remaining cases after this many seconds")
    p.add_argument("--out", default=None, help="JSON path (default tests/bench/results/qmatmul_kernels.json)")
    a = p.parse_args(argv)
    _, smoke = _timing.small_run(a.smoke, "--smoke")
    formats = [f for f in a.formats.split(",") if f]
    sweep = set() if a.no_sweep else set(a.sweep_formats.split(","))
    if smoke:
        decode_shapes, prefill_shapes, m_prefill, reps, repeats = [(256, 512)], [(256, 512)], 32, 2, 2
    else:
        decode_shapes = [(4096, 4096), (4096, 14336), (14336, 4096)]
        prefill_shapes = [(4096, 4096), (4096, 14336)]
        m_prefill, reps, repeats = 512, a.reps, a.repeats
    out = {**_timing.run_header(), "smoke": smoke, "decode": [], "prefill": []}
    path, save = _timing.results_file(a.out, "qmatmul_kernels", out)
    key = jax.random.key(0)

    # Tasks in priority order (a --budget-s cut keeps the most important ones).
    tasks = []
    swept = [f for f in formats if f in sweep]
    rest = [f for f in formats if f not in sweep]
    tasks += [("decode", f, s) for s in decode_shapes[:2] for f in swept]
    if not a.no_prefill:
        tasks += [("prefill", f, prefill_shapes[0]) for f in swept]
    tasks += [("decode", f, s) for s in decode_shapes[2:] for f in swept]
    tasks += [("decode", f, s) for f in rest for s in decode_shapes]
    if not a.no_prefill:
        tasks += [("prefill", f, s) for s in prefill_shapes[1:] for f in swept]
        tasks += [("prefill", f, s) for f in rest for s in prefill_shapes]
    t_start = time.perf_counter()
    for kind, fmt, (n, k) in tasks:
        if a.budget_s and time.perf_counter() - t_start > a.budget_s:
            out.setdefault("skipped_for_budget", []).append(f"{kind} {fmt} {n}x{k}")
            continue
        if kind == "decode":
            cfgs = DECODE_CONFIGS if fmt in sweep else {}
            r = bench_case(fmt, 1, n, k, cfgs, reps=reps, repeats=repeats, interpret=smoke, key=key)
            out["decode"].append(r)
            out["profile_lines"] = sorted(_LINES)
            save()
            if r["best"] is None:
                print(f"decode {fmt} {n}x{k}: no kernel tiling ran: {r['configs']}", flush=True)
                continue
            print(
                f"decode {fmt:5s} M=1 N={n:5d} K={k:5d} [{r['timing']}]: bf16 {r['xla_bf16_us']:8.1f} µs, best "
                f"{r['best']} "
                f"{r['configs'][r['best']]['us']:8.1f} µs = {r['best_speedup_vs_bf16']:.2f}x "
                f"({r['configs'][r['best']]['weight_GBps']} GB/s; default {r['default_speedup_vs_bf16']}x; "
                f"err {r['best_max_rel_err']:.1e}; {time.perf_counter() - t_start:.0f}s)",
                flush=True,
            )
        else:
            cfgs = PREFILL_CONFIGS if fmt in sweep and not smoke else {}
            r = bench_case(
                fmt, m_prefill, n, k, cfgs, reps=max(2, reps // 4), repeats=repeats, interpret=smoke, key=key
            )
            out["prefill"].append(r)
            save()
            if r["best"] is None:
                print(f"prefill {fmt} {n}x{k}: no kernel tiling ran: {r['configs']}", flush=True)
                continue
            tflops = 2 * m_prefill * n * k / (r["configs"][r["best"]]["us"] * 1e-6) / 1e12
            print(
                f"prefill {fmt:5s} M={m_prefill} N={n:5d} K={k:5d} [{r['timing']}]: bf16 {r['xla_bf16_us']:8.1f} µs, "
                f"best {r['best']} "
                f"{r['configs'][r['best']]['us']:8.1f} µs = {r['best_speedup_vs_bf16']:.2f}x of bf16 throughput "
                f"({tflops:.0f} TFLOP/s; default {r['default_speedup_vs_bf16']}x; err {r['best_max_rel_err']:.1e}; "
                f"{time.perf_counter() - t_start:.0f}s)",
                flush=True,
            )
    save()
    print(f"wrote {path}", flush=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
