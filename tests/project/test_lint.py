"""The library and its tests pass ruff with the project's configuration (``[tool.ruff]`` in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_check_passes():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--output-format",
            "concise",
            "maxfx",
            "lowering",
            "custom_calls",
            "tests",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "No module named ruff" not in proc.stderr, (
        "ruff is missing: it comes with the dev extra (`make venv` installs it)"
    )
    assert proc.returncode == 0, (
        f"ruff found problems (fix them or run `.venv/bin/ruff check --fix`):\n{proc.stdout}{proc.stderr}"
    )
