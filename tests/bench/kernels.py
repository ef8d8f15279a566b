"""Benchmark: Pallas attention kernels vs ``jax.nn.dot_product_attention`` (XLA and cuDNN).

GPU (the real run)::

    python3 -m tests.bench.kernels                   # prefill fwd/bwd sweep + decode
    python3 -m tests.bench.kernels --no-sweep --out $OUT/kernels.json
    python3 -m tests.bench.kernels --with-qmatmul    # also run tests.bench.qmatmul_kernels

CPU smoke (tiny shapes, Pallas interpret mode; exercised by
tests/custom_calls/test_attention_kernels.py so the script cannot rot)::

    .venv/bin/python -m tests.bench.kernels --quick

What is reported (``FLOPs = 4·B·H·S²·D``, halved when causal; backward counted
as 2.5× the forward FLOPs, the FlashAttention convention):

* prefill bf16, head_dim 128, seq 4096 (B4 H16, causal and not): forward
  TFLOP/s of each kernel tiling and of ``jax.nn.dot_product_attention``
  (``implementation='xla'`` and ``'cudnn'``); forward+backward through
  ``jax.grad`` and the backward alone (``t(fwd+bwd) − t(fwd)``) with the ratio
  to cuDNN's backward (issue 7 targets: ≥ 300 TFLOP/s forward, backward ≥ 0.8× cuDNN);
* decode bf16, one new token, 8k context, Hq32/Hkv8, batch 1/2/4/8: K+V bytes
  read per second and the percentage of the card's copy bandwidth (measured in
  the same run) and of the nominal H100 HBM3 3.35 TB/s (target ≥ 60 %), for the
  dense and the paged (page 128) kernels, XLA and cuDNN.

Method: candidates are timed alternately (``_timing.interleaved``). Each timed
call is one ``jax.jit`` running ``R`` independent attention calls with their
own operands (decode caches are 33 MB per batch row, so ``R`` calls keep the
data out of the 50 MB L2 and the host dispatch cost is amortized). On GPU the
primary figure is GPU busy time from profiler traces
(``tests.bench.qmatmul_kernels.device_interleaved``), wall time is also
recorded. Writes tests/bench/results/kernels.json (git-ignored) or ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp

from custom_calls.attention import pallas_decode as pd
from custom_calls.attention import pallas_flash as pf
from tests.bench import _timing

H100_HBM_GBPS = 3350.0

FWD_CONFIGS = {
    "q128_k64_w4_s3": pf.FlashConfig(128, 64, 4, 3),
    "q128_k128_w8_s3": pf.FlashConfig(128, 128, 8, 3),
    "q128_k64_w8_s3": pf.FlashConfig(128, 64, 8, 3),
    "q64_k64_w4_s3": pf.FlashConfig(64, 64, 4, 3),
    "q64_k128_w4_s2": pf.FlashConfig(64, 128, 4, 2),
}
BWD_CONFIGS = {  # only the backward fields matter (the forward uses the default tiling)
    "bwd_q32_k32_w4_s2": (32, 32, 4, 2),
    "bwd_q64_k64_w4_s2": (64, 64, 4, 2),
    "bwd_q64_k128_w8_s2": (64, 128, 8, 2),
    "bwd_q128_k64_w8_s2": (128, 64, 8, 2),
    "bwd_q64_k64_w8_s3": (64, 64, 8, 3),
}
DECODE_CONFIGS = {
    "bk64": pd.DecodeConfig(block_k=64),
    "bk256_w8": pd.DecodeConfig(block_k=256, num_warps=8),
    "bk128_s3": pd.DecodeConfig(block_k=128, num_stages=3),
    "bk128_2x_splits": None,  # filled per shape: twice the automatic split count
}


def _with_bwd(base: pf.FlashConfig, bwd: tuple[int, int, int, int]) -> pf.FlashConfig:
    import dataclasses

    bq, bk, w, s = bwd
    return dataclasses.replace(base, block_q_bwd=bq, block_k_bwd=bk, num_warps_bwd=w, num_stages_bwd=s)


def _chain(fn):
    """One jit running ``fn`` on each operand tuple (independent calls, returned so none is dead code)."""
    return jax.jit(lambda ops: [fn(*o) for o in ops])


def _time(cands: dict, ops_for: dict, *, repeats: int, gpu: bool, reps: int):
    """Seconds per single call of each candidate: (primary, wall, timing kind)."""
    calls = {n: (lambda f=f, o=ops_for[n]: jax.block_until_ready(f(o))) for n, f in cands.items()}
    wall = _timing.interleaved(calls, repeats=repeats, warmup=2)
    dev = None
    if gpu:
        from tests.bench.qmatmul_kernels import device_interleaved

        dev = device_interleaved(calls)
    prim = {n: (dev[n][0] if dev else wall[n]) / reps for n in calls}
    return prim, {n: wall[n] / reps for n in calls}, ("gpu_busy" if dev else "wall")


def _compile(name, f, ops, result):
    t0 = time.perf_counter()
    try:
        jax.block_until_ready(f(ops))
    except Exception as e:  # noqa: BLE001 - record configurations that fail to compile/run
        result["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
        return False
    result["compile_s"][name] = round(time.perf_counter() - t0, 2)
    return True


def _rel(a, b) -> float:
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


def bench_prefill(b, s, h, d, causal, *, sweep, interpret, gpu, reps, repeats, key, bwd=True):
    dt = jnp.bfloat16
    keys = jax.random.split(key, 3 * reps)
    ops = [tuple(jax.random.normal(keys[3 * r + i], (b, s, h, d), dt) for i in range(3)) for r in range(reps)]
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    result = {
        "B": b,
        "S": s,
        "H": h,
        "D": d,
        "causal": causal,
        "reps_per_call": reps,
        "fwd_flops": flops,
        "compile_s": {},
        "errors": {},
    }
    base = pf.default_config(d)
    ours = {"default": base, **(FWD_CONFIGS if sweep else {})}

    def mine(cfg):
        return lambda q, k, v: pf.flash_attention(q, k, v, causal=causal, config=cfg, interpret=interpret)

    fwd = {f"pallas_{n}": mine(c) for n, c in ours.items()}
    fwd["xla"] = functools.partial(jax.nn.dot_product_attention, is_causal=causal, implementation="xla")
    if gpu:
        fwd["cudnn"] = functools.partial(jax.nn.dot_product_attention, is_causal=causal, implementation="cudnn")
    cands, ops_for = {}, {}
    for n, f in fwd.items():
        c = _chain(f)
        if _compile(n, c, ops, result):
            cands[n], ops_for[n] = c, ops
    prim, wall, kind = _time(cands, ops_for, repeats=repeats, gpu=gpu, reps=reps)
    result["timing"] = kind
    result["fwd"] = {
        n: {"us": round(t * 1e6, 1), "TFLOPs": _timing.sig(flops / t / 1e12), "wall_us": round(wall[n] * 1e6, 1)}
        for n, t in prim.items()
    }
    mine_fwd = {n: t for n, t in prim.items() if n.startswith("pallas_")}
    if mine_fwd:
        best = min(mine_fwd, key=mine_fwd.get)
        result["fwd_best"] = best
        if "cudnn" in prim:
            result["fwd_best_vs_cudnn"] = _timing.sig(prim["cudnn"] / prim[best])
        q, k, v = ops[0]
        result["fwd_rel_err_vs_xla"] = _rel(fwd[best](q, k, v), fwd["xla"](q, k, v))
    if not bwd:
        return result

    def grad_of(f):
        return jax.grad(lambda q, k, v: f(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))

    best_name = result.get("fwd_best", "pallas_default")[len("pallas_") :]
    best_fwd_cfg = ours.get(best_name, base)
    bwd_cfgs = {"default": best_fwd_cfg}
    if sweep:
        bwd_cfgs.update({n: _with_bwd(best_fwd_cfg, t) for n, t in BWD_CONFIGS.items()})
    ref_name = "cudnn" if gpu else "xla"  # no cuDNN on CPU
    gcands = {f"pallas_{n}": grad_of(mine(c)) for n, c in bwd_cfgs.items()}
    gcands[ref_name] = grad_of(fwd[ref_name])
    cands, ops_for = {}, {}
    for n, f in gcands.items():
        c = _chain(f)
        if _compile("grad_" + n, c, ops, result):
            cands[n], ops_for[n] = c, ops
    gprim, gwall, _ = _time(cands, ops_for, repeats=repeats, gpu=gpu, reps=reps)
    result["fwd_bwd_reference"] = ref_name
    result["fwd_bwd"] = {}
    for n, t in gprim.items():
        tf = prim.get(ref_name if n == ref_name else f"pallas_{best_name}")
        entry = {
            "us": round(t * 1e6, 1),
            "TFLOPs": _timing.sig(3.5 * flops / t / 1e12),
            "wall_us": round(gwall[n] * 1e6, 1),
        }
        if tf and t > tf:  # the backward alone: fwd+bwd minus the same implementation's forward
            entry["bwd_only_us"] = round((t - tf) * 1e6, 1)
            entry["bwd_only_TFLOPs"] = _timing.sig(2.5 * flops / (t - tf) / 1e12)
        result["fwd_bwd"][n] = entry
    mine_bwd = {n: e for n, e in result["fwd_bwd"].items() if n.startswith("pallas_") and "bwd_only_us" in e}
    if mine_bwd and "bwd_only_us" in result["fwd_bwd"].get(ref_name, {}):
        best = min(mine_bwd, key=lambda n: mine_bwd[n]["bwd_only_us"])
        result["bwd_best"] = best
        result[f"bwd_best_vs_{ref_name}"] = round(
            result["fwd_bwd"][ref_name]["bwd_only_us"] / mine_bwd[best]["bwd_only_us"], 3
        )
    q, k, v = ops[0]
    g_mine = gcands["pallas_default"](q, k, v)
    g_ref = grad_of(fwd["xla"])(q, k, v)
    result["grad_rel_err_vs_xla"] = [round(_rel(a, c), 5) for a, c in zip(g_mine, g_ref)]
    return result


def copy_bandwidth(n_bytes: int) -> float:
    """GB/s of an elementwise ``x * 2`` (read + write), the card's practical HBM ceiling."""
    x = jnp.ones((n_bytes // 2,), jnp.bfloat16)
    f = jax.jit(lambda x: x * 2)
    jax.block_until_ready(f(x))
    t = _timing.interleaved({"copy": lambda: jax.block_until_ready(f(x))}, repeats=10, warmup=3)["copy"]
    return 2 * x.nbytes / t / 1e9


def bench_decode(b, t, hq, hkv, d, *, sweep, interpret, gpu, reps, repeats, key, copy_gbps):
    dt = jnp.bfloat16
    page = 128 if t >= 128 else 16
    keys = jax.random.split(key, 3 * reps)
    ops = []
    for r in range(reps):
        q = jax.random.normal(keys[3 * r], (b, 1, hq, d), dt)
        k = jax.random.normal(keys[3 * r + 1], (b, t, hkv, d), dt)
        v = jax.random.normal(keys[3 * r + 2], (b, t, hkv, d), dt)
        ops.append((q, k, v))
    lens = jnp.full((b,), t, jnp.int32)
    n_pages = t // page
    table = jnp.arange(b * n_pages, dtype=jnp.int32).reshape(b, n_pages)
    paged_ops = [(q, k.reshape(b * n_pages, page, hkv, d), v.reshape(b * n_pages, page, hkv, d)) for q, k, v in ops]
    nbytes = 2 * b * t * hkv * d * 2
    result = {
        "B": b,
        "T": t,
        "Hq": hq,
        "Hkv": hkv,
        "D": d,
        "page": page,
        "kv_bytes": nbytes,
        "reps_per_call": reps,
        "compile_s": {},
        "errors": {},
    }
    auto = pd._splits(pd.DecodeConfig(), b, hkv, t, min(128, t))
    cfgs = {"default": pd.DecodeConfig()}
    if sweep:
        cfgs.update({n: c or pd.DecodeConfig(num_splits=2 * auto) for n, c in DECODE_CONFIGS.items()})
    result["auto_splits"] = auto
    fns, fops = {}, {}
    for n, c in cfgs.items():
        fns[f"pallas_{n}"] = lambda q, k, v, c=c: pd.decode_attention(q, k, v, lens, config=c, interpret=interpret)
        fops[f"pallas_{n}"] = ops
    fns["pallas_paged"] = lambda q, k, v: pd.paged_decode_attention(q, k, v, table, lens, interpret=interpret)
    fops["pallas_paged"] = paged_ops
    # the multi-layer pool form maxfx's KV cache uses ([P, 2, layers, page, H, D], read in place; one layer here)
    fns["pallas_paged_pool"] = lambda q, pool: pd.paged_decode_attention_pool(
        q, pool, 0, table, lens, interpret=interpret
    )
    fops["pallas_paged_pool"] = [(q, jnp.stack([kp, vp], axis=1)[:, :, None]) for q, kp, vp in paged_ops]
    fns["xla"] = functools.partial(jax.nn.dot_product_attention, implementation="xla")
    fops["xla"] = ops
    if gpu:
        fns["cudnn"] = functools.partial(jax.nn.dot_product_attention, implementation="cudnn")
        fops["cudnn"] = ops
    cands, ops_for = {}, {}
    for n, f in fns.items():
        c = _chain(f)
        if _compile(n, c, fops[n], result):
            cands[n], ops_for[n] = c, fops[n]
    prim, wall, kind = _time(cands, ops_for, repeats=repeats, gpu=gpu, reps=reps)
    result["timing"] = kind
    result["impls"] = {}
    for n, tt in prim.items():
        gbps = nbytes / tt / 1e9
        result["impls"][n] = {
            "us": round(tt * 1e6, 2),
            "GBps": _timing.sig(gbps),
            "pct_of_copy": _timing.sig(100 * gbps / copy_gbps),
            "pct_of_hbm_spec": _timing.sig(100 * gbps / H100_HBM_GBPS),
            "wall_us": round(wall[n] * 1e6, 2),
        }
    mine = {n: tt for n, tt in prim.items() if n.startswith("pallas_")}
    if mine:
        best = min(mine, key=mine.get)
        result["best"] = best
        want = fns["xla"](*ops[0])
        result["rel_errs_vs_xla"] = {n: _rel(fns[n](*fops[n][0]), want) for n in mine}
        result["rel_err_vs_xla"] = result["rel_errs_vs_xla"][best]
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny shapes in Pallas interpret mode (CPU smoke run)")
    p.add_argument("--no-sweep", action="store_true", help="time only the default tilings")
    p.add_argument("--no-bwd", action="store_true")
    p.add_argument("--no-decode", action="store_true")
    p.add_argument("--with-qmatmul", action="store_true", help="also run tests.bench.qmatmul_kernels")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None, help="JSON path (default tests/bench/results/kernels.json)")
    a = p.parse_args(argv)
    gpu, quick = _timing.small_run(a.quick, "--quick")
    sweep = not a.no_sweep and not quick
    out = {**_timing.run_header(), "quick": quick, "prefill": [], "decode": []}
    path, save = _timing.results_file(a.out, "kernels", out)
    key = jax.random.key(0)
    t0 = time.perf_counter()
    if quick:
        prefill = [(1, 64, 2, 64, True)]
        decode = [(1, 256, 4, 2, 64)]
        reps, repeats = 1, 2
        copy_gbps = copy_bandwidth(1 << 20)
    else:
        prefill = [(4, 4096, 16, 128, True), (4, 4096, 16, 128, False)]
        decode = [(bb, 8192, 32, 8, 128) for bb in (1, 2, 4, 8)]
        reps, repeats = 2, a.repeats
        copy_gbps = copy_bandwidth(1 << 29)
    out["copy_GBps"] = round(copy_gbps, 1)
    for b, s, h, d, causal in prefill:
        r = bench_prefill(
            b,
            s,
            h,
            d,
            causal,
            sweep=sweep,
            interpret=quick,
            gpu=gpu,
            reps=reps,
            repeats=repeats,
            key=key,
            bwd=not a.no_bwd,
        )
        out["prefill"].append(r)
        save()
        best = r.get("fwd_best")
        line = f"prefill B{b} S{s} H{h} D{d}{' causal' if causal else ''} [{r.get('timing')}]: "
        line += ", ".join(f"{n} {e['TFLOPs']} TF/s" for n, e in r.get("fwd", {}).items())
        if best:
            line += f"; best {best} (x{r.get('fwd_best_vs_cudnn', '-')} cuDNN, err {r['fwd_rel_err_vs_xla']:.1e})"
        print(line, flush=True)
        if "fwd_bwd" in r:
            print(
                "  fwd+bwd: "
                + ", ".join(
                    f"{n} {e['TFLOPs']} TF/s (bwd {e.get('bwd_only_TFLOPs', '-')})" for n, e in r["fwd_bwd"].items()
                )
                + f"; bwd best {r.get('bwd_best')} x{r.get('bwd_best_vs_cudnn', '-')} cuDNN; "
                f"grad err {r['grad_rel_err_vs_xla']}",
                flush=True,
            )
        if r["errors"]:
            print(f"  errors: {r['errors']}", flush=True)
    if not a.no_decode:
        for b, t, hq, hkv, d in decode:
            r = bench_decode(
                b,
                t,
                hq,
                hkv,
                d,
                sweep=sweep,
                interpret=quick,
                gpu=gpu,
                reps=max(reps, 4 if gpu else 1),
                repeats=repeats,
                key=key,
                copy_gbps=copy_gbps,
            )
            out["decode"].append(r)
            save()
            print(
                f"decode B{b} T{t} Hq{hq} Hkv{hkv} D{d} [{r.get('timing')}]: "
                + ", ".join(
                    f"{n} {e['GBps']} GB/s ({e['pct_of_copy']}% copy, {e['pct_of_hbm_spec']}% spec)"
                    for n, e in r["impls"].items()
                )
                + f"; best {r.get('best')} err {r.get('rel_err_vs_xla', float('nan')):.1e}",
                flush=True,
            )
            if r["errors"]:
                print(f"  errors: {r['errors']}", flush=True)
    out["total_s"] = round(time.perf_counter() - t0, 1)
    save()
    print(f"wrote {path} ({out['total_s']} s)", flush=True)
    if a.with_qmatmul:
        from tests.bench import qmatmul_kernels

        out["qmatmul"] = qmatmul_kernels.main(["--smoke"] if quick else ["--budget-s", "240"])
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
