"""Serving benchmark: ``maxfx serve`` against llama.cpp's ``llama-server``, same GGUF, same client.

Both servers load the SmolLM2-135M-shaped random GGUF with a real byte-level BPE
tokenizer that `tests.bench._bpe_gguf` writes (Q8_0 by default; ``--quant F32|Q4_0``)
and run as subprocesses on 127.0.0.1:

- maxfx: ``python -m maxfx serve --model GGUF --max-batch-size 16 --max-length 512
  --kv-cache-format float16`` (llama-server's default KV precision; ``--maxfx-args``
  replaces the last two);
- llama-server: ``-t 2 --parallel 16 -c 8192`` (16 slots of 512 tokens), built
  outside the project by ``tests/bench/build_llama_server.sh`` (found at
  ``--llama-server``, ``$LLAMA_SERVER`` or that script's default place; without
  it, its column says "missing" and only maxfx runs).

The client is this file's own (asyncio + httpx, server-sent events): ``POST
/v1/completions`` with ``stream``, ``temperature 0``, ``ignore_eos``, ``max_tokens
128`` and a text prompt of exactly 128 tokens for both tokenizers (checked: the
local maxfx tokenizer, llama-server's ``/tokenize``, and every response's
``usage.prompt_tokens``; ``--token-ids`` sends the ids instead). Every prompt is
unique (no prefix-cache reuse). ``rounds x c`` requests run with at most ``c`` in
flight, for c = 1, 4, 16.

Metrics follow vLLM's ``benchmark_serving``: request throughput and output
tokens/s over the run's wall time; TTFT = time to the first chunk with text; ITL =
gaps between successive chunks with text; TPOT = (E2E - TTFT) / (output tokens - 1)
per request, output tokens from the streamed ``usage``. Mean / median / p99 in ms.
(llama-server holds back tokens that end inside a UTF-8 character and sends them
with the next one; such a chunk carries two tokens, so ITL counts one long gap.)

Schedule: one warm-up pass (every concurrency, both servers), then ``--repeats``
passes (default 3); in each, every concurrency runs on both servers back to back,
the order alternating pass by pass; the idle server is paused (SIGSTOP) so its
threads take no CPU (``--no-pause`` keeps it running).

Every run also reports the CPU other processes took meanwhile ("others' cores":
/proc/stat's busy time less the servers' and this client's; other containers on
the machine count, though ``ps`` cannot see them), because a neighbour using one of
two cores slows llama-server's spinning ``-t 2`` threads up to ten-fold, maxfx about
two-fold. Before each timed run the client waits (``--quiet-wait``) for others' CPU
to fall to ``--quiet`` cores; a run above it is run again with fresh prompts, up to
``--retries`` times. Each figure is the median over the passes' clean runs (over all
of them when none was clean; the table says which).

In-process ``load_pretrained(GGUF).generate`` (128 prompt ids, 128 new tokens) runs
once per pass, both servers paused, for the "server c=1 decode rate >= 0.9x
generate" target; ``maxfx_engine_compiles_total`` from ``/metrics``
before and after the timed passes gives "no compile in the timed window".

Run: ``.venv/bin/python -m tests.bench.serve [--quick] [--quant Q8_0]``
(``--report FILE`` prints a saved result again);
results in tests/bench/results/serve-<quant>.json, server logs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.bench._timing import RESULTS, save

PROMPT, OUTPUT = 128, 128
CONCURRENCY = (1, 4, 16)
BENCH_DIR = Path(os.environ.get("MAXFX_BENCH_DIR", Path.home() / ".cache" / "maxfx-bench"))
BUILD_HINT = "build with tests/bench/build_llama_server.sh"
MAXFX, LLAMA = "maxfx", "llama-server"


# ─── servers ─────────────────────────────────────────────────────────────


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_server(given: str | None) -> Path | None:
    """``--llama-server``, ``$LLAMA_SERVER``, or the newest build of build_llama_server.sh under $MAXFX_BENCH_DIR."""
    for p in (given, os.environ.get("LLAMA_SERVER")):
        if p:
            return Path(p) if Path(p).is_file() else None
    found = sorted(
        BENCH_DIR.glob("llama-cpp-python-*/vendor/llama.cpp/build/bin/llama-server"), key=lambda p: p.stat().st_mtime
    )
    return found[-1] if found else None


@dataclass
class Server:
    """One server subprocess (its own process group, so it can be paused and stopped whole)."""

    name: str
    cmd: list[str]
    port: int
    log: Path
    proc: subprocess.Popen | None = None
    model: str | None = None  # the id requests name, from /v1/models

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                self.cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )

    def wait_ready(self, timeout: float) -> None:
        """Poll ``/health`` until 200 (llama-server answers 503 while it loads; maxfx compiles its buckets first)."""
        import httpx  # noqa: PLC0415

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before it was ready; log: "
                    f"{self.log}\n{self.tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s; log: {self.log}\n{self.tail()}")

    def tail(self, n: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()


def maxfx_server(path: Path, logs: Path, extra: list[str]) -> Server:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "maxfx",
        "serve",
        "--model",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-batch-size",
        "16",
        "--max-length",
        "512",
        *extra,
    ]
    return Server(MAXFX, cmd, port, logs / "maxfx.log")


def llama_server(binary: Path, path: Path, logs: Path, extra: list[str]) -> Server:
    port = free_port()
    # -c is the whole context, split evenly over the --parallel slots: 16 x 512, maxfx's --max-length.
    # --no-webui: nothing but the API is needed.
    cmd = [
        str(binary),
        "-m",
        str(path),
        "-t",
        "2",
        "--parallel",
        "16",
        "-c",
        "8192",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-webui",
        *extra,
    ]
    return Server(LLAMA, cmd, port, logs / "llama-server.log")


def served_model(server: Server) -> str | None:
    """The first model id of ``/v1/models`` (maxfx checks ``model``; llama-server ignores it)."""
    import httpx  # noqa: PLC0415

    with contextlib.suppress(httpx.HTTPError, KeyError, IndexError, ValueError):
        return httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    return None


def compiles(server: Server) -> float | None:
    """``maxfx_engine_compiles_total`` from the server's /metrics, or None when it is not there."""
    import httpx  # noqa: PLC0415

    try:
        text = httpx.get(server.url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("maxfx_engine_compiles_total"):
            return float(line.split()[-1])
    return None


def cpu_ticks(pids: list[int]) -> tuple[int, int, float]:
    """``(machine busy ticks, ticks of pids, this process's CPU seconds)``, to tell how much CPU others took during a
    run.

    /proc/stat counts every process on the machine, including other containers'
    that ``ps`` cannot see; a server's own ticks (all its threads) are subtracted.
    """
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq
    own = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            own += int(fields[11]) + int(fields[12])  # utime stime
    t = os.times()
    return busy, own, t.user + t.system


def background_cores(before: tuple[int, int, float], after: tuple[int, int, float], wall: float) -> float:
    """Cores' worth of CPU that neither the servers nor this client used between two `cpu_ticks`."""
    hz = os.sysconf("SC_CLK_TCK")
    return ((after[0] - before[0]) - (after[1] - before[1])) / hz / wall - (after[2] - before[2]) / wall


def wait_quiet(pids: list[int], threshold: float, budget: float) -> float:
    """Sample others' CPU in 1 s windows until it is at most ``threshold`` cores or ``budget`` seconds have passed; the
    last sample.
    """
    deadline = time.monotonic() + budget
    while True:
        before, start = cpu_ticks(pids), time.perf_counter()
        time.sleep(1.0)
        bg = background_cores(before, cpu_ticks(pids), time.perf_counter() - start)
        if bg <= threshold or time.monotonic() >= deadline:
            return bg


# ─── the client ──────────────────────────────────────────────────────────


@dataclass
class Result:
    """One request: times in seconds from its send; ``itl``: gaps between chunks with text."""

    ok: bool = False
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    chunks: int = 0
    error: str = ""
    server_prompt_ms: float | None = None  # llama-server's own prefill time (its final chunk's "timings")


async def request(client, url: str, body: dict) -> Result:
    """Send one streaming completion and time its chunks (vLLM's ``async_request_openai_completions``)."""
    r = Result()
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                r.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:  # a server that fails mid-stream says so in an event
                    r.error = f"error event: {str(chunk['error'])[:300]}"
                    return r
                choices = chunk.get("choices") or []
                if choices and choices[0].get("text"):
                    if r.chunks == 0:
                        r.ttft = now - start
                    else:
                        r.itl.append(now - last)
                    last = now
                    r.chunks += 1
                if timings := chunk.get("timings"):
                    r.server_prompt_ms = timings.get("prompt_ms")
                if usage := chunk.get("usage"):
                    r.output_tokens = int(usage.get("completion_tokens") or 0)
                    r.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        r.e2e = time.perf_counter() - start
        r.ok = r.chunks > 0
        if not r.output_tokens:  # no usage streamed: count the chunks, as vLLM does
            r.output_tokens = r.chunks
        if not r.ok:
            r.error = "no chunk with text"
    except Exception as e:  # noqa: BLE001 - a failed request is reported, not fatal
        r.error = f"{type(e).__name__}: {e}"
    return r


def body(prompt: str | list[int], model: str | None) -> dict:
    # llama-server reads max_tokens as n_predict and honours ignore_eos; both stream usage on request.
    return {
        **({"model": model} if model else {}),
        "prompt": prompt,
        "max_tokens": OUTPUT,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }


async def run_load(server: Server, prompts: list, concurrency: int) -> tuple[list[Result], float]:
    """All ``prompts`` with at most ``concurrency`` in flight; the results and the run's wall time."""
    import httpx  # noqa: PLC0415

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:

        async def one(p):
            async with sem:
                return await request(client, server.url, body(p, server.model))

        start = time.perf_counter()
        results = await asyncio.gather(*(one(p) for p in prompts))
        return list(results), time.perf_counter() - start


def summarize(results: list[Result], duration: float) -> dict:
    """vLLM's figures of one run (ms; throughputs per second of wall time)."""
    ok = [r for r in results if r.ok]
    out: dict = {"completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration}
    if not ok:
        out["errors"] = sorted({r.error for r in results})[:3]
        return out
    out["request_throughput"] = len(ok) / duration
    out["output_throughput"] = sum(r.output_tokens for r in ok) / duration
    out["output_tokens_mean"] = statistics.mean(r.output_tokens for r in ok)
    out["chunks_mean"] = statistics.mean(
        r.chunks for r in ok
    )  # < output tokens: some chunks carried two (held-back UTF-8)
    out["prompt_tokens"] = sorted({r.prompt_tokens for r in ok})
    series = {
        "ttft": [r.ttft for r in ok],
        "tpot": [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
        "itl": [g for r in ok for g in r.itl],
        "e2el": [r.e2e for r in ok],
    }
    for k, v in series.items():
        a = np.asarray(v or [0.0]) * 1e3
        out[f"{k}_mean"], out[f"{k}_p50"], out[f"{k}_p99"] = (
            float(a.mean()),
            float(np.median(a)),
            float(np.percentile(a, 99)),
        )
    if served := [r.server_prompt_ms for r in ok if r.server_prompt_ms is not None]:
        out["server_prompt_ms_p50"] = float(np.median(served))
    if len(ok) < len(results):
        out["errors"] = sorted({r.error for r in results if not r.ok})[:3]
    return out


# ─── prompts and tokenizers ──────────────────────────────────────────────


def check_llama_tokenizer(server: Server, sample: list[tuple[str, list[int]]]) -> int:
    """How many of ``sample``'s texts llama-server's /tokenize splits differently from maxfx's tokenizer."""
    import httpx  # noqa: PLC0415

    bad = 0
    for text, ids in sample:
        got = httpx.post(server.url + "/tokenize", json={"content": text, "add_special": False}, timeout=30).json()[
            "tokens"
        ]
        if got != ids:
            bad += 1
            if bad == 1:
                first = next(
                    (i for i, (a, b) in enumerate(zip(got, ids, strict=False)) if a != b), min(len(got), len(ids))
                )
                print(
                    f"  tokenizers differ on a prompt: llama-server {len(got)} ids, maxfx {len(ids)}; first difference "
                    f"at {first}: {got[first : first + 4]} vs {ids[first : first + 4]}"
                )
    return bad


def in_process_generate(path: Path):
    """``run() -> decode tokens/s`` of ``load_pretrained(path).generate`` on 128 prompt ids, 128 new tokens (as
    tests.bench.engine).
    """
    from maxfx.models import load_pretrained  # noqa: PLC0415

    model = load_pretrained(str(path))
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, (1, PROMPT))

    def run() -> float:
        model.generate(ids, max_new_tokens=OUTPUT)
        return model.last_stats.decode_tokens_per_s

    return run


# ─── the report ──────────────────────────────────────────────────────────

ROWS = [
    ("output tok/s", "output_throughput", "{:.1f}"),
    ("requests/s", "request_throughput", "{:.3f}"),
    ("TTFT mean ms", "ttft_mean", "{:.1f}"),
    ("TTFT p50 ms", "ttft_p50", "{:.1f}"),
    ("TTFT p99 ms", "ttft_p99", "{:.1f}"),
    (
        "  srv prefill",
        "server_prompt_ms_p50",
        "{:.1f}",
    ),  # llama-server's own timings.prompt_ms: TTFT less queueing and HTTP
    ("TPOT mean ms", "tpot_mean", "{:.2f}"),
    ("TPOT p50 ms", "tpot_p50", "{:.2f}"),
    ("TPOT p99 ms", "tpot_p99", "{:.2f}"),
    ("ITL mean ms", "itl_mean", "{:.2f}"),
    ("ITL p50 ms", "itl_p50", "{:.2f}"),
    ("ITL p99 ms", "itl_p99", "{:.2f}"),
    ("E2E p50 ms", "e2el_p50", "{:.0f}"),
    ("others' cores", "background_cores", "{:.2f}"),
]


def medians(runs: list[dict], quiet: float) -> dict:
    """Each figure's median over the clean runs (others' CPU at most ``quiet``), over all when none was clean;
    ``runs_used`` says which.
    """
    clean = [r for r in runs if r.get("background_cores", 0.0) <= quiet]
    use = clean or runs
    keys = [k for _, k, _ in ROWS]
    out = {k: statistics.median(r[k] for r in use) for k in keys if use and all(k in r for r in use)}
    if out:
        out["runs_used"] = f"{len(clean)} clean of {len(runs)}" if clean else f"all {len(runs)} (none clean)"
    return out


def targets(
    med: dict[str, dict[int, dict]], generate_tok_s: float | None, compiled: float | None, have_llama: bool
) -> list[tuple[str, float | None, str, bool | None]]:
    """``(name, value, bound, passed)`` of the issue's targets (value None: not measurable here)."""
    mx, ll = med.get(MAXFX, {}), med.get(LLAMA, {})
    out: list[tuple[str, float | None, str, bool | None]] = []

    def ratio(c: int, key: str) -> float | None:
        if not have_llama or key not in mx.get(c, {}) or key not in ll.get(c, {}) or not ll[c][key]:
            return None
        return mx[c][key] / ll[c][key]

    for c in sorted(mx):
        for name, key, op, bound in (
            ("output tok/s", "output_throughput", ">=", 1.0),
            ("TTFT p50", "ttft_p50", "<=", 1.0),
            ("TTFT p99", "ttft_p99", "<=", 1.5),
            ("TPOT p50", "tpot_p50", "<=", 1.0),
        ):
            v = ratio(c, key)
            out.append(
                (
                    f"c={c} {name} maxfx / llama-server",
                    v,
                    f"{op} {bound}",
                    None if v is None else (v >= bound if op == ">=" else v <= bound),
                )
            )
        if c == 16:
            v = ratio(c, "output_throughput")
            out.append(("c=16 output tok/s maxfx / llama-server (goal)", v, ">= 1.2", None if v is None else v >= 1.2))
    if 1 in mx and 16 in mx:
        v = mx[16]["output_throughput"] / mx[1]["output_throughput"]
        out.append(("maxfx c=16 / c=1 output tok/s", v, ">= 3", v >= 3))
    for c in sorted(mx):
        if mx[c].get("itl_p50"):
            v = mx[c]["itl_p99"] / mx[c]["itl_p50"]
            out.append((f"maxfx c={c} ITL p99 / p50", v, "<= 3", v <= 3))
    if 1 in mx and generate_tok_s:
        v = (1e3 / mx[1]["tpot_p50"]) / generate_tok_s
        out.append(("maxfx c=1 decode rate (1/TPOT p50) / in-process generate", v, ">= 0.9", v >= 0.9))
    out.append(
        ("maxfx programs compiled in the timed window", compiled, "== 0", None if compiled is None else compiled == 0)
    )
    return out


def print_report(med: dict[str, dict[int, dict]], have_llama: bool, checks: list) -> None:
    for c in CONCURRENCY:
        if c not in med.get(MAXFX, {}) and c not in med.get(LLAMA, {}):
            continue
        print(f"\nconcurrency {c}")
        print(f"  {'metric':<14}{MAXFX:>12}{LLAMA:>14}{'ratio':>9}")
        for label, key, fmt in ROWS:
            a = med.get(MAXFX, {}).get(c, {}).get(key)
            b = med.get(LLAMA, {}).get(c, {}).get(key) if have_llama else None
            sa = fmt.format(a) if a is not None else "-"
            sb = fmt.format(b) if b is not None else ("missing" if not have_llama else "-")
            sr = f"{a / b:.2f}x" if a is not None and b and key != "background_cores" else "-"
            print(f"  {label:<14}{sa:>12}{sb:>14}{sr:>9}")
        used = [med.get(n, {}).get(c, {}).get("runs_used", "-") for n in (MAXFX, LLAMA)]
        print(f"  medians of: {MAXFX} {used[0]}; {LLAMA} {used[1] if have_llama else 'missing'}")
    print("\ntargets")
    for name, v, bound, ok in checks:
        verdict = "unknown" if ok is None else ("PASS" if ok else "FAIL")
        value = "unknown" if v is None else f"{v:.3g}"
        print(f"  {verdict:<8}{name}: {value} (target {bound})")


# ─── main ────────────────────────────────────────────────────────────────


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quant", default="Q8_0", choices=["Q8_0", "F32", "Q4_0"])
    ap.add_argument(
        "--quick", action="store_true", help="one wave of c requests per concurrency (rounds 1) instead of 3"
    )
    ap.add_argument(
        "--rounds", type=int, default=None, help="requests per run = rounds x concurrency (default 3, --quick 1)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    ap.add_argument(
        "--llama-server", default=None, help="llama-server binary (default: $LLAMA_SERVER or build_llama_server.sh's)"
    )
    ap.add_argument("--llama-args", default="", help="extra llama-server flags (e.g. '--poll 0')")
    # llama-server keeps its KV cache in float16 (-ctk/-ctv f16) unless told otherwise: the same here.
    ap.add_argument(
        "--maxfx-args",
        default="--kv-cache-format float16",
        help="extra maxfx serve flags (default '--kv-cache-format float16', llama-server's KV precision)",
    )
    ap.add_argument("--only", choices=[MAXFX, LLAMA], default=None, help="run one server only")
    ap.add_argument("--token-ids", action="store_true", help="send prompts as token ids instead of text")
    ap.add_argument(
        "--no-pause",
        action="store_true",
        help="leave the idle server running (not SIGSTOPped) while the other is timed",
    )
    ap.add_argument("--no-generate", action="store_true", help="skip the in-process generate comparison")
    ap.add_argument(
        "--quiet",
        type=float,
        default=0.25,
        help="others' CPU (cores) above which a timed run is not clean (default 0.25)",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds to wait for others' CPU to fall to --quiet before each timed run (default 60)",
    )
    ap.add_argument(
        "--retries",
        type=int,
        default=2,
        help="times a run that was not clean is run again, with fresh prompts (default 2)",
    )
    ap.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds to wait for each server's /health")
    ap.add_argument(
        "--report", metavar="FILE", default=None, help="print the table and targets of a saved result and exit"
    )
    args = ap.parse_args(argv)
    if args.report:
        out = json.loads(Path(args.report).read_text())
        report(out)
        return out
    rounds = args.rounds or (1 if args.quick else 3)
    conc = [int(c) for c in args.concurrency.split(",")]

    from tests.bench._bpe_gguf import PromptSource, model_file  # noqa: PLC0415

    path = model_file(args.quant)
    logs = RESULTS / "serve-logs" / args.quant.lower()
    from maxfx.models._tokenizer import load_tokenizer  # noqa: PLC0415

    tok, why = load_tokenizer(path)
    assert tok is not None, why
    source = PromptSource(tok, PROMPT, seed=0)

    def fresh(n: int) -> list:
        return [ids if args.token_ids else text for text, ids in source.take(n)]

    # One distinct prompt set per (pass, concurrency); pass 0 is the warm-up. Both servers get the same sets.
    sets = {(p, c): fresh(rounds * c) for p in range(args.repeats + 1) for c in conc}
    sample = source.take(32)  # for the tokenizer check

    servers: list[Server] = []
    binary = find_llama_server(args.llama_server)
    info: dict = {
        "model": path.name,
        "quant": args.quant,
        "prompt_tokens": PROMPT,
        "output_tokens": OUTPUT,
        "rounds": rounds,
        "repeats": args.repeats,
        "concurrency": conc,
        "prompts": "token ids" if args.token_ids else "text",
        "cpus": os.cpu_count(),
        "pause_idle": not args.no_pause,
        "quiet_cores": args.quiet,
        "llama_args": args.llama_args,
        "maxfx_args": args.maxfx_args,
    }
    if args.only != LLAMA:
        servers.append(maxfx_server(path, logs, args.maxfx_args.split()))
    if args.only != MAXFX:
        if binary is None:
            print(f"llama-server: missing ({BUILD_HINT})")
            info["llama_server"] = f"missing ({BUILD_HINT})"
        else:
            servers.append(llama_server(binary, path, logs, args.llama_args.split()))
            info["llama_server"] = str(binary)
    print(
        f"model {path.name}; prompts: {PROMPT} tokens as {info['prompts']}, unique; {OUTPUT} output tokens; {rounds} x "
        f"c requests per run; {args.repeats} repeats"
    )

    gen = None
    gen_runs: list[dict] = []
    pause = not args.no_pause and len(servers) > 1
    try:
        for s in servers:
            print(f"starting {s.name}: {' '.join(s.cmd)}", flush=True)
            s.start()
        for s in servers:
            start = time.perf_counter()
            s.wait_ready(args.ready_timeout)
            s.model = served_model(s)
            print(f"{s.name} ready in {time.perf_counter() - start:.0f} s (log {s.log})", flush=True)
        for s in servers:
            if s.name == LLAMA:
                bad = check_llama_tokenizer(s, sample)
                info["tokenizer_mismatches_of_32"] = bad
                print(
                    f"tokenizers: llama-server /tokenize and maxfx's tokenizer give the same ids on {32 - bad} of 32 "
                    "prompts"
                )
        if not args.no_generate and any(s.name == MAXFX for s in servers):
            gen = in_process_generate(path)

        def only(active: Server | None) -> None:
            # SIGSTOP the servers not being timed; SIGCONT the one that is.
            if pause:
                for s in servers:
                    s.signal(signal.SIGCONT if s is active else signal.SIGSTOP)

        pids = [s.proc.pid for s in servers]

        def measure(s: Server, c: int, prompts: list, label: str, retries: int) -> dict:
            """One run of ``prompts`` at concurrency ``c`` on ``s``; again (fresh prompts) while others took CPU."""
            attempt = 0
            while True:
                if retries:
                    wait_quiet(pids, args.quiet, args.quiet_wait)
                only(s)
                ticks = cpu_ticks(pids)
                results, duration = asyncio.run(run_load(s, prompts, c))
                summary = summarize(results, duration)
                summary["background_cores"] = bg = background_cores(ticks, cpu_ticks(pids), duration)
                summary["attempt"] = attempt
                if summary.get("errors"):
                    print(f"  {s.name} c={c}: {summary['failed']} failed: {summary['errors']}")
                again = bg > args.quiet and attempt < retries
                print(
                    f"  {label} {s.name:>12} c={c:<2} {duration:6.1f} s  {summary.get('output_throughput', 0):7.1f} "
                    "out tok/s  "
                    f"TTFT p50 {summary.get('ttft_p50', 0):7.1f} ms  TPOT p50 {summary.get('tpot_p50', 0):6.2f} ms  "
                    f"prompt tokens {summary.get('prompt_tokens')}  "
                    f"others' CPU {bg:.2f} cores{'  (not clean: again)' if again else ''}",
                    flush=True,
                )
                if not again:
                    return summary
                attempt += 1
                prompts = fresh(len(prompts))  # the first ones are in the server's prefix cache now

        runs: dict[str, dict[int, list[dict]]] = {s.name: {c: [] for c in conc} for s in servers}
        compiled_before = None
        for p in range(args.repeats + 1):
            label = "warm-up" if p == 0 else f"pass {p}/{args.repeats}"
            order = servers if p % 2 == 0 else servers[::-1]
            if p == 1:
                mx = next((s for s in servers if s.name == MAXFX), None)
                only(mx)
                compiled_before = compiles(mx) if mx else None
            for c in conc:
                for s in order:
                    summary = measure(s, c, sets[p, c], label, retries=args.retries if p > 0 else 0)
                    if p > 0:
                        runs[s.name][c].append(summary)
            if gen is not None:
                only(None)
                if p > 0:
                    wait_quiet(pids, args.quiet, args.quiet_wait)
                ticks = cpu_ticks(pids)
                start = time.perf_counter()
                rate = gen()
                bg = background_cores(ticks, cpu_ticks(pids), time.perf_counter() - start)
                if p > 0:
                    gen_runs.append({"decode_tok_s": rate, "background_cores": bg})
                print(f"  {label} in-process generate: {rate:.1f} decode tok/s  others' CPU {bg:.2f} cores", flush=True)
        mx = next((s for s in servers if s.name == MAXFX), None)
        if mx:
            only(mx)
        compiled_after = compiles(mx) if mx else None
    finally:
        for s in servers:
            s.stop()

    compiled = None if compiled_before is None or compiled_after is None else compiled_after - compiled_before
    out = {
        **info,
        "runs": runs,
        "generate_runs": gen_runs,
        "compiles_in_timed_window": compiled if compiled is not None else "unknown",
    }
    report(out)
    print(f"saved {save(f'serve-{args.quant.lower()}', out)}")
    return out


def report(out: dict) -> None:
    """Medians, ratios and targets of a result (``runs``, ``generate_runs``, ...) into ``out``, and the table on
    stdout.
    """
    quiet = out.get("quiet_cores", 0.25)
    runs = {name: {int(c): rs for c, rs in by_c.items()} for name, by_c in out["runs"].items()}
    have_llama = LLAMA in runs
    med = {name: {c: m for c, rs in by_c.items() if (m := medians(rs, quiet))} for name, by_c in runs.items()}
    gens = [
        g if isinstance(g, dict) else {"decode_tok_s": g, "background_cores": None}
        for g in out.get("generate_runs", [])
    ]  # older results: no CPU record
    clean_gens = [
        g["decode_tok_s"] for g in gens if g["background_cores"] is not None and g["background_cores"] <= quiet
    ] or [g["decode_tok_s"] for g in gens]
    gen_med = statistics.median(clean_gens) if clean_gens else None
    compiled = out.get("compiles_in_timed_window")
    checks = targets(med, gen_med, compiled if isinstance(compiled, (int, float)) else None, have_llama)
    print(
        f"\n{out.get('model')}: {out.get('prompt_tokens')} prompt tokens ({out.get('prompts')}), "
        f"{out.get('output_tokens')} output tokens, {out.get('rounds')} x c requests per run, {out.get('repeats')} "
        "passes"
    )
    if not have_llama:
        print(f"llama-server: {out.get('llama_server', f'missing ({BUILD_HINT})')}")
    print_report(med, have_llama, checks)
    if gen_med:
        print(f"\nin-process generate: {gen_med:.1f} decode tok/s (median of {len(clean_gens)})")
    timed = [r for by_c in runs.values() for rs in by_c.values() for r in rs]
    dirty = sum(r.get("background_cores", 0.0) > quiet for r in timed)
    print(f"timed runs in which other processes took more than {quiet} cores: {dirty} of {len(timed)}")
    out.update(
        {
            "medians": med,
            "generate_decode_tok_s": gen_med,
            "not_clean_runs": dirty,
            "targets": [{"name": n, "value": v, "target": b, "pass": ok} for n, v, b, ok in checks],
        }
    )


if __name__ == "__main__":
    main()
