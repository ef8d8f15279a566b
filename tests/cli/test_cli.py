"""The ``maxfx`` command line: ``python -m maxfx generate`` reproduces transformers' completion; bad input is one line
and exit 2.

Runs that load a model start JAX in a subprocess (seconds each), so they are
few; flag parsing is checked in-process through `maxfx._cli.main`.
"""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from maxfx import _cli

ROOT = Path(__file__).resolve().parents[2]
TINY_LLAMA = ROOT / "tests" / "data" / "models" / "tiny_llama"
TIMING = re.compile(r"^load \d+\.\d\d s, compile \d+\.\d\d s, prefill \d+\.\d tok/s, decode \d+\.\d tok/s$")


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MAXFX_DEFAULT_DEVICE": "cpu", "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, "-m", "maxfx", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
    )


def _golden() -> dict:
    return json.loads((TINY_LLAMA / "golden_text.json").read_text())


def test_generate_streams_the_golden_completion():
    """Greedy text from the CLI equals Hugging Face transformers' 16-token completion; stderr is one timing line."""
    case = _golden()["cases"][0]
    proc = _run(
        "generate",
        "--model",
        str(TINY_LLAMA),
        "--prompt",
        case["prompt"],
        "--max-new-tokens",
        str(_golden()["greedy_new_tokens"]),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == case["completion"] + "\n"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and TIMING.match(lines[0]), proc.stderr


def test_generate_reads_the_prompt_from_stdin():
    """No --prompt: the prompt is stdin without its trailing newline (the second golden case, so both are covered)."""
    case = _golden()["cases"][1]
    proc = _run(
        "generate",
        "--model",
        str(TINY_LLAMA),
        "--max-new-tokens",
        str(_golden()["greedy_new_tokens"]),
        stdin=case["prompt"] + "\n",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == case["completion"] + "\n"


def test_bad_model_path_is_one_line_and_exit_2(tmp_path):
    proc = _run("generate", "--model", str(tmp_path / "missing"), "--prompt", "hi")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("maxfx generate: error: "), proc.stderr
    assert "missing" in proc.stderr and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_no_command_prints_usage():
    proc = _run()
    assert proc.returncode == 2
    assert "usage: maxfx" in proc.stderr and "generate" in proc.stderr


def test_the_console_script_is_declared():
    """`pip install` makes a `maxfx` command that runs the same `main` as `python -m maxfx`."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"maxfx": "maxfx._cli:main"}


# ─── in-process: token ids and models without a tokenizer ────────────────────


def test_prompt_ids_print_the_golden_greedy_ids(capsys):
    golden = _golden()
    case = golden["cases"][0]
    ids = ",".join(map(str, case["prompt_ids"]))
    assert (
        _cli.main(
            [
                "generate",
                "--model",
                str(TINY_LLAMA),
                "--prompt-ids",
                ids,
                "--max-new-tokens",
                str(golden["greedy_new_tokens"]),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out == " ".join(map(str, case["new_ids"])) + "\n"
    assert TIMING.match(err.strip()), err


def test_text_prompt_without_a_tokenizer_is_one_line(capsys):
    """tiny_gpt2 has no tokenizer.json: a text prompt cannot be encoded, and the error says what to do instead."""
    assert _cli.main(["generate", "--model", str(ROOT / "tests/data/models/tiny_gpt2"), "--prompt", "hi"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "has no tokenizer" in err and "--prompt-ids" in err, err


def test_prompt_ids_outside_the_vocabulary_are_one_line(capsys):
    assert _cli.main(["generate", "--model", str(TINY_LLAMA), "--prompt-ids", "1,99999", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("maxfx generate: error: ") and "outside [0, 256)" in err, err


# ─── in-process: flags are checked before JAX or the model load ──────────────


@pytest.mark.parametrize(
    "argv, says",
    [
        (["generate", "--model", "m", "--bogus"], "unrecognized arguments: --bogus"),
        (["generate", "--prompt", "hi"], "required: --model"),
        (
            ["generate", "--model", "m", "--max-new-tokens", "0"],
            "--max-new-tokens: expected a positive integer, got '0'",
        ),
        (["generate", "--model", "m", "--temperature", "-1"], "--temperature: expected a number >= 0"),
        (["generate", "--model", "m", "--top-p", "1.5"], "--top-p: expected a number in (0, 1]"),
        (["generate", "--model", "m", "--dtype", "int8"], "--dtype: invalid choice: 'int8'"),
        (["generate", "--model", "m", "--prompt-ids", "1,x"], "--prompt-ids: expected comma-separated token ids"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as info:
        _cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize(
    "argv, stdin, says",
    [
        (["generate", "--model", "m", "--prompt", ""], "", "the prompt is empty"),
        (["generate", "--model", "m"], "\n", "the prompt on stdin is empty"),
        (
            ["generate", "--model", "m", "--prompt", "a", "--prompt-ids", "1"],
            "",
            "give --prompt or --prompt-ids, not both",
        ),
    ],
)
def test_bad_prompts_are_one_line_and_exit_2(argv, stdin, says, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", _Stdin(stdin))
    assert _cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"maxfx generate: error: {says}\n"


class _Stdin:
    """A piped (not a terminal) stdin holding ``text``."""

    def __init__(self, text: str):
        self._text = text

    def isatty(self) -> bool:
        return False

    def read(self) -> str:
        return self._text
