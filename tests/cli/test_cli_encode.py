"""``maxfx encode`` (MAX's ``max encode``): prints the embedding of a prompt for a folder or a GGUF file; bad input is
one line and exit 2.

Runs that load a model start JAX in a subprocess, so they are few; flag parsing
and errors are checked in-process through `maxfx._cli.main`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from maxfx import _cli

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "models"
TINY_LLAMA = MODELS / "tiny_llama"
TIMING = re.compile(
    r"^load \d+\.\d\d s, encode \d+\.\d{3} s, \d+ tokens, (pooling (mean|last_token|cls)(, normalized)?|per-token)$"
)


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MAXFX_DEFAULT_DEVICE": "cpu", "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, "-m", "maxfx", "encode", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )


def _printed(stdout: str) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(the Encoding line's text, the printed shape, the printed values) of ``maxfx encode``'s stdout."""
    encoding = re.search(r"^Encoding: (.*)$", stdout, re.M).group(1)
    shape = tuple(
        int(d)
        for d in re.search(r"^Embeddings shape: \(([\d, ]*)\)$", stdout, re.M).group(1).replace(" ", "").split(",")
        if d
    )
    body = stdout[stdout.index("Embeddings: ") + len("Embeddings: ") :]
    values = np.array([float(v) for v in re.findall(r"-?\d+\.\d*(?:e[+-]\d+)?", body)], np.float32)
    return encoding, shape, values


def _embedding(path: Path, ids, **kwargs) -> np.ndarray:
    """The same embedding computed in-process."""
    from maxfx.interfaces import EmbeddingsGenerationInputs
    from maxfx.pipelines import PipelineConfig
    from maxfx.pipelines.lib.embeddings_pipeline import EmbeddingsPipeline, EmbeddingsRequestContext

    pool = kwargs.pop("pool_embeddings", True)
    pipeline = EmbeddingsPipeline(
        PipelineConfig(model_path=str(path), pool_embeddings=pool), None, None, {}, None, **kwargs
    )
    ctx = EmbeddingsRequestContext(ids)
    return pipeline.execute(EmbeddingsGenerationInputs([{ctx.request_id: ctx}]))[ctx.request_id].embeddings


def test_encode_prints_the_pooled_embedding_of_a_text_prompt():
    """A folder with a tokenizer: 'Encoding:', 'Embeddings shape: (64,)', then the vector (as numpy prints it), equal to
    the pipeline's.
    """
    proc = _run("--model", str(TINY_LLAMA), "--prompt", "hello world")
    assert proc.returncode == 0, proc.stderr[-3000:]
    encoding, shape, values = _printed(proc.stdout)
    assert (encoding, shape) == ("hello world", (64,))
    from maxfx.pipelines.lib.tokenizer import TextTokenizer

    ids = TextTokenizer(str(TINY_LLAMA)).delegate.encode("hello world", add_special_tokens=True)
    np.testing.assert_allclose(values, _embedding(TINY_LLAMA, ids), rtol=1e-6, atol=1e-7)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and TIMING.match(lines[0]) and lines[0].endswith("pooling mean"), proc.stderr


def test_encode_no_pool_prints_per_token_states():
    """--no-pool (MAX: --no-pool-embeddings) with token ids on a model without a tokenizer: [tokens, hidden]."""
    proc = _run("--model-path", str(MODELS / "tiny_qwen3"), "--prompt-ids", "1,2,3", "--no-pool")
    assert proc.returncode == 0, proc.stderr[-3000:]
    encoding, shape, values = _printed(proc.stdout)
    assert (encoding, shape) == ("1,2,3", (3, 64))
    np.testing.assert_allclose(
        values.reshape(3, 64), _embedding(MODELS / "tiny_qwen3", [1, 2, 3], pool_embeddings=False), rtol=1e-6, atol=1e-7
    )
    assert proc.stderr.strip().endswith("per-token")


def test_encode_a_gguf_file_with_a_chosen_pooling():
    proc = _run(
        "--model",
        str(TINY_LLAMA / "tiny_llama-q8_0.gguf"),
        "--prompt-ids",
        "5,6,7,8",
        "--pooling",
        "last_token",
        "--normalize",
        "--pool-embeddings",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, shape, values = _printed(proc.stdout)
    assert shape == (64,) and abs(np.linalg.norm(values) - 1) < 1e-5
    assert proc.stderr.strip().endswith("pooling last_token, normalized")


# ─── in-process: flags and one-line errors ───────────────────────────────────


def test_encode_flags_follow_max():
    parse = _cli.build_parser().parse_args
    args = parse(["encode", "--model", "m"])
    assert (args.model, args.prompt, args.pool, args.pooling, args.normalize, args.num_warmups) == (
        "m",
        None,
        True,
        None,
        None,
        0,
    )
    assert parse(["encode", "--model-path", "m", "--no-pool-embeddings"]).pool is False
    assert parse(["encode", "--model", "m", "--no-pool"]).pool is False
    assert (
        parse(["encode", "--model", "m", "--pooling", "cls", "--no-normalize", "--num-warmups", "2"]).pooling == "cls"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "m", "--pooling", "max"], "invalid choice: 'max'"),
        (["--model", "m", "--num-warmups", "-1"], "expected an integer >= 0"),
        (["--model", "m", "--prompt-ids", "a,b"], "expected comma-separated token ids"),
        (["--prompt", "hi"], "the following arguments are required: --model"),
    ],
)
def test_bad_flags_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _cli.main(["encode", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--model", str(MODELS / "tiny_qwen3"), "--prompt", "hi"],
            "a text prompt needs a tokenizer: pass token ids with --prompt-ids",
        ),
        (
            ["--model", str(MODELS / "tiny_gpt2"), "--prompt-ids", "1,999"],
            "request 'prompt': token ids must be in [0, 256)",
        ),
        (
            ["--model", str(MODELS / "tiny_gpt2"), "--prompt-ids", ",".join(["1"] * 129)],
            "request 'prompt' has 129 tokens, more than max_length 128",
        ),
        (["--model", str(MODELS / "missing"), "--prompt", "hi"], "missing"),
        (
            ["--model", str(TINY_LLAMA), "--prompt", "hi", "--prompt-ids", "1"],
            "give --prompt or --prompt-ids, not both",
        ),
        (["--model", str(TINY_LLAMA), "--prompt", ""], "the prompt is empty"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert _cli.main(["encode", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("maxfx encode: error: ") and message in err, err
