"""The docs build strictly (broken links or nav entries fail)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mkdocs_strict_build(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "docs" / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()


import pytest


@pytest.mark.parametrize("page", ["graph.md", "eager.md", "modules.md"])
def test_page_examples_run(page):
    """A page's examples run as written, in order, in one namespace."""
    import re

    text = (ROOT / "docs" / "pages" / page).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, page, "exec"), namespace)  # noqa: S102 - our own docs
