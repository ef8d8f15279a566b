"""CPU generation from GGUF files: maxfx vs llama.cpp, side by side in one process.

Makes random-weight GGUF files with the exact shape of SmolLM2-135M (Llama
architecture: hidden 576, 30 layers, 9 query / 3 KV heads, head_dim 64, FFN 1536,
vocab 49152, tied embeddings) in F32, Q8_0 and Q4_0 with the ``gguf`` writer, then
for each file times a 64-token prompt and 32 greedy new tokens:

- maxfx: ``load_pretrained(file)`` then ``model.generate(ids, max_new_tokens=n)``;
- llama.cpp (``llama_cpp``, when importable): ``Llama(file, n_threads=<cores>)``,
  ``eval(prompt)`` then one ``eval([token])`` per new token, greedy argmax of the
  logits (so both sides pick tokens the same way).

Both sides run 1 new token (prefill) and n new tokens, interleaved, medians;
prefill tokens/s = T / time(1), decode tokens/s = (n - 1) / (time(n) - time(1)).
Compile time (maxfx) and load time are outside the tokens/s. Decode GB/s is the
bytes of weights a token reads (the file's tensor bytes, the tied embedding once)
times decode tokens/s, also given as a fraction of this machine's read bandwidth
(a large numpy reduction, measured here).

llama.cpp is not a dependency of maxfx; without it (``pip install llama-cpp-python``,
built from source) its columns say so and only maxfx is timed.

Run: ``.venv/bin/python -m tests.bench.llm_cpu [--quick] [--formats F32,Q8_0,Q4_0]``.
Results: stdout and tests/bench/results/llm_cpu.json; the GGUF files are cached
in tests/bench/results/gguf/.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from tests.bench._timing import RESULTS, interleaved, machine, save

SMOLLM2_135M = {
    "vocab": 49152, "hidden": 576, "layers": 30, "heads": 9, "kv_heads": 3, "head_dim": 64, "ffn": 1536,
    "context": 2048, "eps": 1e-5, "theta": 10000.0,
}  # fmt: skip
PROMPT, NEW_TOKENS = 64, 32


def _tensors(shape: dict, seed: int = 0):
    """``(gguf name, float32 array)`` of a random Llama in llama.cpp's names (tied embeddings: no output.weight)."""
    rng = np.random.default_rng(seed)
    h, f, d = shape["hidden"], shape["ffn"], shape["head_dim"]

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), np.float32) / np.float32(np.sqrt(cols))).astype(np.float32)

    yield "token_embd.weight", mat(shape["vocab"], h)
    yield "output_norm.weight", np.ones(h, np.float32)
    for i in range(shape["layers"]):
        g = f"blk.{i}."
        yield g + "attn_norm.weight", np.ones(h, np.float32)
        yield g + "attn_q.weight", mat(shape["heads"] * d, h)
        yield g + "attn_k.weight", mat(shape["kv_heads"] * d, h)
        yield g + "attn_v.weight", mat(shape["kv_heads"] * d, h)
        yield g + "attn_output.weight", mat(h, shape["heads"] * d)
        yield g + "ffn_norm.weight", np.ones(h, np.float32)
        yield g + "ffn_gate.weight", mat(f, h)
        yield g + "ffn_up.weight", mat(f, h)
        yield g + "ffn_down.weight", mat(h, f)


def make_gguf(path: Path, qname: str, shape: dict = SMOLLM2_135M, vocab: dict | None = None) -> Path:
    """Write a random Llama GGUF file with 2-D weights in ``qname`` (F32, Q8_0, Q4_0); norms stay F32.

    ``vocab``: a real byte-level BPE tokenizer for the metadata (``tokens``, ``merges``, ``types``,
    ``bos``, ``eos``, ``pre``; see `tests.bench._bpe_gguf`), else a dummy one.
    """
    import gguf  # noqa: PLC0415

    qtype = getattr(gguf.GGMLQuantizationType, qname)
    tmp = path.with_suffix(".tmp")
    wr = gguf.GGUFWriter(str(tmp), "llama")
    wr.add_name(f"random-smollm2-135m-shape-{qname.lower()}")
    wr.add_context_length(shape["context"])
    wr.add_embedding_length(shape["hidden"])
    wr.add_block_count(shape["layers"])
    wr.add_feed_forward_length(shape["ffn"])
    wr.add_rope_dimension_count(shape["head_dim"])
    wr.add_head_count(shape["heads"])
    wr.add_head_count_kv(shape["kv_heads"])
    wr.add_layer_norm_rms_eps(shape["eps"])
    wr.add_rope_freq_base(shape["theta"])
    wr.add_vocab_size(shape["vocab"])
    wr.add_file_type(
        {
            "F32": gguf.LlamaFileType.ALL_F32,
            "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
            "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
        }[qname]
    )
    wr.add_tokenizer_model("gpt2")
    if vocab is not None:
        assert len(vocab["tokens"]) == shape["vocab"], "the tokenizer must fill the model's vocabulary"
        wr.add_tokenizer_pre(vocab["pre"])
        wr.add_token_list(vocab["tokens"])
        wr.add_token_types(vocab["types"])
        wr.add_token_merges(vocab["merges"])
        wr.add_bos_token_id(vocab["bos"])
        wr.add_eos_token_id(vocab["eos"])
        wr.add_add_bos_token(False)  # said explicitly: llama.cpp's and maxfx's defaults differ between pre-tokenizers
    else:
        # A vocabulary without merges: llama.cpp needs one to load the file; token ids are fed directly.
        wr.add_tokenizer_pre("default")
        tokens = [f"<t{i}>" for i in range(shape["vocab"])]
        tokens[4] = "<t2><t3>"  # the one merge's result
        wr.add_token_list(tokens)
        wr.add_token_types([gguf.TokenType.NORMAL] * shape["vocab"])
        wr.add_token_merges(["<t2> <t3>"])
        wr.add_bos_token_id(0)
        wr.add_eos_token_id(1)
    for name, a in _tensors(shape):
        if a.ndim == 2 and qname != "F32":
            wr.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            wr.add_tensor(name, a)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, path)
    return path


def weight_bytes(path: Path) -> int:
    """Bytes of all tensors in the file (what a decode step reads: the tied embedding serves once, as the head)."""
    import gguf  # noqa: PLC0415

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


def read_bandwidth() -> float:
    """This machine's read bandwidth (bytes/s): the best of a few sums over 512 MiB of float32, all cores."""
    a = np.ones(1 << 27, np.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a.sum()
        best = min(best, time.perf_counter() - start)
    return a.nbytes / best


# ─── the two sides ───────────────────────────────────────────────────────


def maxfx_side(path: Path, ids: np.ndarray):
    from maxfx.models import load_pretrained  # noqa: PLC0415

    start = time.perf_counter()
    model = load_pretrained(str(path))
    load_s = time.perf_counter() - start

    def run(n: int) -> np.ndarray:
        return np.asarray(model.generate(ids[None], max_new_tokens=n))[0]

    return run, load_s


def llama_cpp_side(path: Path, ids: np.ndarray, threads: int):
    try:
        import llama_cpp  # noqa: PLC0415
        from llama_cpp import Llama  # noqa: PLC0415
    except ImportError:
        return None, "llama_cpp is not importable (pip install llama-cpp-python to compare)"
    start = time.perf_counter()
    llm = Llama(
        model_path=str(path),
        n_ctx=256,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=PROMPT,
        logits_all=False,
        verbose=False,
    )
    load_s = time.perf_counter() - start

    vocab = llm.n_vocab()

    def last_logits() -> np.ndarray:  # the last evaluated token's logits (the only row llama.cpp computes)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))

    def run(n: int) -> np.ndarray:
        llm.reset()
        llm.eval(ids.tolist())
        out = []
        for i in range(n):
            tok = int(np.argmax(last_logits()))
            out.append(tok)
            if i + 1 < n:
                llm.eval([tok])
        return np.asarray(out)

    return run, load_s


def bench_file(path: Path, repeats: int, threads: int, bandwidth: float) -> dict:
    ids = np.random.default_rng(0).integers(2, SMOLLM2_135M["vocab"], PROMPT)
    nbytes = weight_bytes(path)
    out: dict = {"file": path.name, "file_mb": path.stat().st_size / 1e6, "weight_bytes": nbytes}
    runs = {}
    mx, out["maxfx_load_s"] = maxfx_side(path, ids)
    runs["maxfx"] = mx
    cpp, info = llama_cpp_side(path, ids, threads)
    if cpp is None:
        out["llama_cpp"] = info
    else:
        out["llama_cpp_load_s"] = info
        runs["llama.cpp"] = cpp
    tokens = {name: fn(NEW_TOKENS) for name, fn in runs.items()}  # warm-up / compile
    candidates = {}
    for name, fn in runs.items():
        candidates[f"{name}|1"] = lambda fn=fn: fn(1)
        candidates[f"{name}|n"] = lambda fn=fn: fn(NEW_TOKENS)
    med = interleaved(candidates, repeats=repeats, warmup=1)
    for name in runs:
        pre, full = med[f"{name}|1"], med[f"{name}|n"]
        dec = max(full - pre, 1e-9) / (NEW_TOKENS - 1)
        out[name] = {
            "prefill_tok_s": PROMPT / pre,
            "decode_tok_s": 1 / dec,
            "decode_gb_s": nbytes / dec / 1e9,
            "bandwidth_fraction": nbytes / dec / bandwidth,
        }
    if "llama.cpp" in runs:
        out["prefill_ratio"] = out["maxfx"]["prefill_tok_s"] / out["llama.cpp"]["prefill_tok_s"]
        out["decode_ratio"] = out["maxfx"]["decode_tok_s"] / out["llama.cpp"]["decode_tok_s"]
        out["same_first_tokens"] = (
            int(np.argmax(tokens["maxfx"] != tokens["llama.cpp"]))
            if (tokens["maxfx"] != tokens["llama.cpp"]).any()
            else NEW_TOKENS
        )
    return out


def _print(r: dict) -> None:
    print(f"\n{r['file']} ({r['file_mb']:.0f} MB, {r['weight_bytes'] / 1e6:.0f} MB of weights)")
    for name in ("maxfx", "llama.cpp"):
        if name in r:
            m = r[name]
            print(f"  {name:9s} prefill {m['prefill_tok_s']:7.1f} tok/s  decode {m['decode_tok_s']:6.1f} tok/s  "
                  f"{m['decode_gb_s']:5.2f} GB/s ({100 * m['bandwidth_fraction']:.0f}% of read bandwidth)")  # fmt: skip
    if "decode_ratio" in r:
        print(
            f"  maxfx / llama.cpp: prefill {r['prefill_ratio']:.2f}x, decode {r['decode_ratio']:.2f}x (target >= 0.8x "
            "decode, >= 1.0x prefill); "
            f"greedy tokens agree for the first {r['same_first_tokens']} of {NEW_TOKENS}"
        )
    elif "llama_cpp" in r:
        print(f"  llama.cpp: {r['llama_cpp']}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--formats", default="F32,Q8_0,Q4_0", help="comma-separated GGUF weight types")
    args = parser.parse_args(argv)
    threads = os.cpu_count() or 1
    folder = RESULTS / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    bandwidth = read_bandwidth()
    results: dict = {"machine": machine(), "threads": threads, "read_bandwidth_gb_s": bandwidth / 1e9, "runs": []}
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s, {threads} threads")
    for qname in args.formats.split(","):
        path = folder / f"smollm2-135m-shape-{qname.lower()}.gguf"
        if not path.exists():
            start = time.perf_counter()
            make_gguf(path, qname)
            print(f"wrote {path} in {time.perf_counter() - start:.0f} s")
        r = bench_file(path, 3 if args.quick else 7, threads, bandwidth)
        _print(r)
        results["runs"].append(r)
    print(f"\nwritten {save('llm_cpu', results)}")
    return results


if __name__ == "__main__":
    main()
