"""Offline H100 (sm_90a) compile report for every Pallas kernel, on a machine without a GPU.

What a GPU run would reject first — a tile that needs more shared memory than an
H100 block may have (227 KiB), register spills, a ``dot`` that does not become a
tensor-core instruction — is decided at compile time, and compiling needs no GPU.
This script:

1. (project venv) exports each benchmark-shaped kernel for CUDA from the CPU
   against an abstract H100, captures the Triton module Pallas emits for every
   ``pallas_call`` (``lower_jaxpr_to_triton_module``) with its launch
   parameters, and writes them as ``.ttir`` files;
2. (a venv with the ``triton`` wheel; ``make sm90-report`` builds
   ``.venv-triton``) compiles each module with Triton for ``sm_90a``
   (TTIR → TTGIR → LLVM → PTX) and assembles the PTX with Triton's bundled
   ``ptxas -v``, then reports shared memory, registers, spills and the MMA
   instructions used.

Caveat: on a real GPU XLA compiles the module with the Triton bundled in
jaxlib, not this wheel, so the figures approximate what XLA would build (the
same TTIR, a close Triton version). They say whether a tiling fits H100 and
uses wgmma; only ``tests/bench/kernels.py`` on a GPU says how fast it is.

Usage::

    make sm90-report                                   # both phases, writes tests/bench/results/sm90_report.json
    .venv/bin/python -m tests.bench.sm90_report --capture-only DIR   # phase 1 (tested by tests/custom_calls)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

H100_SMEM_PER_BLOCK = 232448  # 227 KiB: the opt-in maximum dynamic shared memory of one H100 block
H100_SMEM_PER_SM = 233472  # 228 KiB of shared memory per SM
H100_REGS_PER_SM = 65536

# ─── phase 1: capture (project venv: jax + custom_calls) ──────────────────


def _cases():
    """``{tag: (fn, args)}``: benchmark-shaped calls of every kernel (abstract shapes)."""
    import jax
    import jax.numpy as jnp

    from custom_calls.attention import pallas_decode as pd
    from custom_calls.attention import pallas_flash as pf
    from tests.bench import qmatmul_kernels as qb

    S, bf = jax.ShapeDtypeStruct, jnp.bfloat16

    def flash(causal):
        return lambda q, k, v: pf.flash_attention(q, k, v, causal=causal)

    def flash_grad(causal):
        loss = lambda q, k, v: flash(causal)(q, k, v).astype(jnp.float32).sum()  # noqa: E731
        return jax.grad(loss, argnums=(0, 1, 2))

    q128, q64, q256 = S((4, 4096, 16, 128), bf), S((4, 4096, 32, 64), bf), S((1, 16384, 8, 256), bf)
    qd, kc, lens = S((8, 1, 32, 128), bf), S((8, 8192, 8, 128), bf), S((8,), jnp.int32)
    pages, table = S((8 * 64, 128, 8, 128), bf), S((8, 64), jnp.int32)
    pool, layer = S((8 * 64, 2, 16, 128, 8, 128), bf), S((), jnp.int32)  # 16 layers, K and V
    cases = {
        "flash_fwd_d128_causal": (flash(True), (q128,) * 3),
        "flash_fwd_d128": (flash(False), (q128,) * 3),
        "flash_fwd_d64_causal": (flash(True), (q64,) * 3),
        "flash_fwd_d256": (flash(False), (q256,) * 3),
        "flash_bwd_d128_causal": (flash_grad(True), (q128,) * 3),
        "flash_bwd_d64_causal": (flash_grad(True), (q64,) * 3),
        "decode_b8_t8192": (lambda q, k, v, n: pd.decode_attention(q, k, v, n), (qd, kc, kc, lens)),
        "paged_decode_b8_t8192": (
            lambda q, k, v, t, n: pd.paged_decode_attention(q, k, v, t, n),
            (qd, pages, pages, table, lens),
        ),
        "paged_decode_pool_b8_t8192": (
            lambda q, p, i, t, n: pd.paged_decode_attention_pool(q, p, i, t, n),
            (qd, pool, layer, table, lens),
        ),
    }
    cases.update(_anchor_cases(q128, qd, kc))
    cases["maxfx_export_cuda_attn_q4"] = (_maxfx_cuda_export, None)
    key = jax.random.key(0)
    for fmt in qb.FORMATS:
        w = jax.eval_shape(lambda: qb.make_weight(fmt, key, 4096, 4096))  # noqa: B023
        for m in (1, 16, 512):
            cases[f"qmatmul_{fmt}_m{m}"] = (qb.kernel_fn(fmt, None, False), (S((m, 4096), bf), w))
    return cases


def _maxfx_cuda_export():
    """``maxfx.export(..., platforms=["cuda"])`` of a graph (causal attention over 16 heads of 128 and a Q4_0
    projection), traced the maxfx way (x64 on): the Triton modules a CUDA artifact built on this CPU carries."""
    import numpy as np

    import maxfx
    from maxfx.dtype import DType
    from maxfx.graph import DeviceRef, Graph, TensorType, ops
    from maxfx.graph.quantization import QuantizationEncoding
    from maxfx.nn import kernels
    from maxfx.nn.attention import MHAMaskVariant

    b, s, h, d, n = 4, 1024, 16, 128, 4096
    cpu, bf = DeviceRef.CPU(), DType.bfloat16
    w = np.zeros((n, h * d // 32 * 18), np.uint8)
    with Graph("cuda_block", input_types=[TensorType(bf, [b, s, h, d], cpu)] * 3) as g:
        q, k, v = (x.tensor for x in g.inputs)
        o = kernels.flash_attention_gpu(q, k, v, MHAMaskVariant.CAUSAL_MASK, d**-0.5)
        g.output(
            ops.qmatmul(
                QuantizationEncoding.Q4_0, None, ops.reshape(o, [b * s, h * d]), ops.constant(w, DType.uint8, cpu)
            )
        )
    maxfx.export(g, platforms=["cuda"])


def _anchor_cases(q, qd, kc):
    """JAX's own Pallas-Triton kernels on the same shapes: their H100 throughput was measured
    (PALLAS_NOTES §6.0: ``mha`` 333 TFLOP/s causal forward, 100 fwd+bwd; ``gqa`` decode 885 GB/s),
    so their resource usage is the yardstick for ours."""
    import warnings

    import jax
    import jax.numpy as jnp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas.ops.gpu import attention as jax_mha
        from jax.experimental.pallas.ops.gpu import decode_attention as jax_decode

    d = q.shape[-1]

    def mha(q, k, v):
        return jax_mha.mha(q, k, v, None, sm_scale=d**-0.5, causal=True)

    def gqa(q, k, v, n):  # jax's layout: q [B, Hq, D], k/v [B, T, Hkv, D]
        return jax_decode.gqa(q[:, 0], k, v, kv_seq_len=n)

    grad = jax.grad(lambda q, k, v: mha(q, k, v).astype(jnp.float32).sum(), argnums=(0, 1, 2))
    lens = jax.ShapeDtypeStruct(qd.shape[:1], jnp.int32)
    return {
        "anchor_jax_mha_fwd_d128_causal": (mha, (q,) * 3),
        "anchor_jax_mha_bwd_d128_causal": (grad, (q,) * 3),
        "anchor_jax_gqa_decode_b8_t8192": (gqa, (qd, kc, kc, lens)),
    }


def capture(out: str, only: list[str] | None = None, cases: dict | None = None) -> list[dict]:
    """Write ``<tag>_<i>_<kernel>.ttir`` (+ ``.json`` launch parameters) for every case; returns the records.

    ``cases``: ``{tag: (fn, abstract args)}``, or ``(fn, None)`` for a ``fn()`` that lowers for CUDA
    itself (default: the benchmark shapes of `_cases`).
    """
    import warnings

    import jax
    from jax._src.pallas.triton import pallas_call_registration as reg

    from tests.custom_calls._util import cuda_module

    modules: list[tuple[str, str]] = []
    launches: list[dict] = []
    lower, custom_call = reg.lowering.lower_jaxpr_to_triton_module, reg.mlir.custom_call

    def spy_lower(jaxpr, *args, **kwargs):
        res = lower(jaxpr, *args, **kwargs)
        modules.append((jaxpr.debug_info.func_name, res.module.operation.get_asm()))
        return res

    def spy_call(*args, backend_config=None, **kwargs):
        if backend_config and "num_warps" in backend_config:
            launches.append(
                {
                    n: int(str(backend_config[n]).split(":")[0])
                    for n in ("num_warps", "num_stages", "grid_x", "grid_y", "grid_z")
                }
            )
        return custom_call(*args, backend_config=backend_config, **kwargs)

    records = []
    os.makedirs(out, exist_ok=True)
    reg.lowering.lower_jaxpr_to_triton_module, reg.mlir.custom_call = spy_lower, spy_call
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Triton backend is deprecated.*")
            for tag, (fn, args) in (cases or _cases()).items():
                if only and not any(tag == o or tag.startswith(o + "_") for o in only):
                    continue
                n0 = len(modules)
                if args is None:  # the case lowers for CUDA itself
                    fn()
                else:
                    cuda_module(jax.jit(fn), *args)
                for i, ((kernel, asm), launch) in enumerate(zip(modules[n0:], launches[n0:], strict=True)):
                    rec = {"case": tag, "kernel": kernel, **launch, "file": f"{tag}_{i}_{kernel}.ttir"}
                    with open(os.path.join(out, rec["file"]), "w") as f:
                        f.write(asm)
                    with open(os.path.join(out, rec["file"] + ".json"), "w") as f:
                        json.dump(rec, f)
                    records.append(rec)
    finally:
        reg.lowering.lower_jaxpr_to_triton_module, reg.mlir.custom_call = lower, custom_call
    return records


# ─── phase 2: compile (a venv with the triton wheel; imports no jax) ──────


def _ptxas_usage(ptxas: str, ptx: str) -> dict:
    """Registers and spill bytes reported by ``ptxas -v`` for ``ptx`` (sm_90a)."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "spill_store_bytes": int(spills.group(1)) if spills else 0,
        "spill_load_bytes": int(spills.group(2)) if spills else 0,
    }


def _occupancy(warps: int, registers: int | None, shared: int) -> int | None:
    """Resident blocks per H100 SM allowed by registers and shared memory (None without a register count)."""
    if not registers:
        return None
    by_regs = H100_REGS_PER_SM // (32 * warps * registers)
    return min(by_regs, H100_SMEM_PER_SM // shared) if shared else by_regs


def compile_dir(d: str) -> list[dict]:
    """Compile every captured module for sm_90a; one result record per module."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    results = []
    for path in sorted(glob.glob(os.path.join(d, "*.ttir"))):
        with open(path + ".json") as f:
            rec = json.load(f)
        try:
            k = triton.compile(
                path,
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": rec["num_warps"], "num_stages": rec["num_stages"]},
            )
            ptx = k.asm["ptx"]
            mma = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "none"
            rec.update(ok=True, shared_bytes=k.metadata.shared, mma=mma, **_ptxas_usage(ptxas, ptx))
            rec["fits_smem"] = rec["shared_bytes"] <= H100_SMEM_PER_BLOCK
            rec["blocks_per_sm"] = _occupancy(rec["num_warps"], rec["registers"], rec["shared_bytes"])
        except Exception as e:  # a module Triton cannot compile is a finding, not a crash of the report
            rec.update(ok=False, error=str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__)
        rec["triton"] = triton.__version__
        results.append(rec)
    return results


# ─── report ───────────────────────────────────────────────────────────────


def table(results: list[dict]) -> str:
    head = (
        f"{'case':31} {'kernel':24} {'warps':>5} {'stg':>3} {'smem KiB':>8} {'regs':>4} {'spill B':>7} "
        f"{'blk/SM':>6} {'mma':>8}  ok"
    )
    rows = [head, "-" * len(head)]
    for r in results:
        if not r.get("ok"):
            rows.append(
                f"{r['case']:31} {r['kernel']:24} {r['num_warps']:5} {r['num_stages']:3}  FAILED: {r.get('error')}"
            )
            continue
        fit = (
            "yes" if r["fits_smem"] and not r["spill_store_bytes"] else ("SPILLS" if r["fits_smem"] else "SMEM>227KiB")
        )
        rows.append(
            f"{r['case']:31} {r['kernel']:24} {r['num_warps']:5} {r['num_stages']:3} {r['shared_bytes'] / 1024:8.1f} "
            f"{r['registers']:4} {r['spill_store_bytes']:7} {r['blocks_per_sm']:6} {r['mma']:>8}  {fit}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--capture-only", metavar="DIR", help="phase 1 only: write the Triton modules to DIR")
    g.add_argument(
        "--compile", metavar="DIR", help="phase 2 only (run with the triton venv's python): print JSON results"
    )
    p.add_argument(
        "--triton-python", default=".venv-triton/bin/python", help="a Python with the triton wheel (phase 2)"
    )
    p.add_argument(
        "--only", action="append", help="only this case, or the cases whose tag starts with this plus '_' (repeatable)"
    )
    a = p.parse_args(argv)
    if a.compile:
        results = compile_dir(a.compile)
        print(json.dumps(results))
        return results
    if a.capture_only:
        records = capture(a.capture_only, a.only)
        print(f"{len(records)} Triton modules written to {a.capture_only}")
        return records
    if not os.path.exists(a.triton_python):
        print(
            f"sm90_report: skipped, {a.triton_python} does not exist (`make sm90-report` creates it: a venv with the "
            "triton wheel, ~1 GB)"
        )
        return []
    with tempfile.TemporaryDirectory() as d:
        capture(d, a.only)
        out = subprocess.run(
            [a.triton_python, os.path.abspath(__file__), "--compile", d], capture_output=True, text=True
        )
        if out.returncode:
            sys.exit(f"sm90_report: the compile phase failed ({a.triton_python}):\n{out.stderr[-3000:]}")
        results = json.loads(out.stdout.strip().splitlines()[-1])
    print(table(results))
    from tests.bench import _timing

    print(f"wrote {_timing.save('sm90_report', {'machine': _timing.machine(), 'results': results})}")
    return results


if __name__ == "__main__":
    main()
