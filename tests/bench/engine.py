"""The generation engine's aggregate decode speed with 1, 4 and 16 concurrent sequences, beside today's ``generate``.

On the SmolLM2-135M-shaped Q8_0 GGUF that `tests.bench.llm_cpu` writes (random
weights, tied embeddings; made here if missing), in one process:

- ``generate``: ``model.generate(ids [1, 128], max_new_tokens=N)``, greedy, the
  static-batch path; its decode tokens/s (``last_stats``, execution only).
- engine, c = 1, 4, 16: c requests of 128 random prompt tokens, N greedy new
  tokens each with ``ignore_eos``, submitted at once to a `Scheduler` over a
  `ModelRunner` (``max_batch_size=16``, ``max_length=512``, 16-token pages). The
  timed window starts when every request has finished its prefill and ends when
  the first one finishes (all c decode throughout); aggregate decode tokens/s =
  tokens generated in it / its length.

Every bucket is compiled first (`ModelRunner.warmup`), then the candidates run
interleaved, ``--repeats`` times (default 3), and the medians are reported with
the ratios the issue asks for (c=1 vs generate, c=16 vs c=1) and the programs
compiled during the timed runs (must be 0).

Run: ``.venv/bin/python -m tests.bench.engine [--repeats 3] [--new-tokens 64]
[--kv-cache-dtype float16]``; results in tests/bench/results/engine.json
(engine-kv-float16.json with a float16 KV cache).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from tests.bench._timing import RESULTS, machine, save

PROMPT = 128


def model_file() -> Path:
    from tests.bench.llm_cpu import make_gguf  # noqa: PLC0415

    path = RESULTS / "gguf" / "smollm2-135m-shape-q8_0.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        make_gguf(path, "Q8_0")
    return path


def engine_decode(sched, runner, concurrency: int, new_tokens: int, rng) -> float:
    """Aggregate decode tokens/s while ``concurrency`` requests submitted together all decode.

    The window opens when every prompt is prefilled and closes when the first
    request finishes: the rows prefilled first have a head start, so after that
    fewer than ``concurrency`` rows would be running.
    """
    from maxfx.generation import TextContext  # noqa: PLC0415
    from maxfx.interfaces import SamplingParams  # noqa: PLC0415

    params = SamplingParams(top_k=1, max_new_tokens=new_tokens, ignore_eos=True)
    streams = [
        sched.submit(
            TextContext(
                max_length=runner.max_length, tokens=rng.integers(0, runner.vocab_size, PROMPT), sampling_params=params
            )
        )
        for _ in range(concurrency)
    ]
    while sched.num_waiting or any(r.ctx.needs_ce for r in sched._running):
        sched.step()
    before, start = sched.stats.generated_tokens, time.perf_counter()
    while sched.num_running == concurrency:
        sched.step()
    elapsed = time.perf_counter() - start
    generated = sched.stats.generated_tokens - before
    sched.run_until_idle()
    for s in streams:
        assert len(s.result().tokens) == new_tokens
    return generated / elapsed


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument(
        "--kv-cache-dtype",
        default=None,
        help="the engine's KV pages' dtype (default: the model's, float32); e.g. float16",
    )
    args = ap.parse_args(argv)

    from maxfx.generation import ModelRunner, Scheduler, compile_counts  # noqa: PLC0415
    from maxfx.models import load_pretrained  # noqa: PLC0415

    path = model_file()
    model = load_pretrained(str(path))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (1, PROMPT))
    model.generate(ids, max_new_tokens=args.new_tokens)  # compile
    runner = ModelRunner(
        model,
        max_batch_size=16,
        max_length=512,
        page_size=16,
        prefill_chunk_size=512,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    start = time.perf_counter()
    compiled = runner.warmup()
    warmup_s = time.perf_counter() - start
    sched = Scheduler(runner)
    engine_decode(sched, runner, 1, 4, rng)  # first runs touch every path once

    runs: dict[str, list[float]] = {"generate": [], "engine c=1": [], "engine c=4": [], "engine c=16": []}
    before = compile_counts()["compiles"]
    for _ in range(args.repeats):
        model.generate(ids, max_new_tokens=args.new_tokens)
        runs["generate"].append(model.last_stats.decode_tokens_per_s)
        for c in (1, 4, 16):
            runs[f"engine c={c}"].append(engine_decode(sched, runner, c, args.new_tokens, rng))
    compiles_in_window = compile_counts()["compiles"] - before
    med = {k: statistics.median(v) for k, v in runs.items()}
    out = {
        "machine": machine(),
        "model": path.name,
        "kv_cache_dtype": str(runner._pools[0][0].dtype),
        "prompt_tokens": PROMPT,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "warmup_programs": compiled,
        "warmup_s": round(warmup_s, 1),
        "decode_tokens_per_s": {k: round(v, 1) for k, v in med.items()},
        "runs": runs,
        "ratio_c1_vs_generate": round(med["engine c=1"] / med["generate"], 3),
        "ratio_c16_vs_c1": round(med["engine c=16"] / med["engine c=1"], 2),
        "ratio_c4_vs_c1": round(med["engine c=4"] / med["engine c=1"], 2),
        "compiles_in_timed_window": compiles_in_window,
    }
    print(f"warm-up: {compiled} programs in {warmup_s:.1f} s")
    print(f"{'candidate':<14}{'decode tok/s (median)':>24}")
    for k, v in med.items():
        print(f"{k:<14}{v:>24.1f}")
    print(f"engine c=1 / generate: {out['ratio_c1_vs_generate']:.3f} (target >= 0.95)")
    print(f"engine c=16 / c=1: {out['ratio_c16_vs_c1']:.2f} (target >= 4); c=4 / c=1: {out['ratio_c4_vs_c1']:.2f}")
    print(f"programs compiled in the timed window: {compiles_in_window} (target 0)")
    print(f"saved {save('engine' if args.kv_cache_dtype is None else f'engine-kv-{args.kv_cache_dtype}', out)}")
    return out


if __name__ == "__main__":
    main()
