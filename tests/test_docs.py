"""The docs build strictly (broken links or nav entries fail) and every page's examples run."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import maxfx.graph.ops  # noqa: F401 - registers every op first, so the pages' scoped registrations only remove their own
from lowering.registry import scoped_registrations

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


PAGES = ROOT / "docs" / "pages"
# Pages whose examples take tens of seconds (they compile and train or load models).
SLOW_PAGES = {"models.md", "transforms.md"}
# What a page's examples print, where the text states it.
EXPECTED_OUTPUT = {
    "attention.md": ["(2, 64) [7, 5]"],
    "nn_quant_moe.md": ["block (4, 8) (1, 8)", "True", "(5, 8)", "(3, 4)", "2 True"],
    "models_graph.md": ["(2, 12, 256) True", "[(7, 256), (12, 256)]", "True True"],
    "weights.md": ["(2, 64) [2. 2. 2.]"],
}


def _python_blocks(page: str) -> list[str]:
    # ```python blocks are complete examples; fragments use ```py and are not run.
    return re.findall(r"```python\n(.*?)```", (PAGES / page).read_text(), re.S)


def _pages_with_examples() -> list:
    pages = sorted(p.name for p in PAGES.glob("*.md") if _python_blocks(p.name))
    return [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p for p in pages]


@pytest.mark.parametrize("page", _pages_with_examples())
def test_page_examples_run(page, capsys):
    """A page's examples run as written, in order, in one namespace, and print what the page says."""
    namespace: dict = {}
    with scoped_registrations():  # ops.md registers an example op: it must not outlive the page
        for block in _python_blocks(page):
            exec(compile(block, page, "exec"), namespace)  # noqa: S102 - our own docs
    if page in EXPECTED_OUTPUT:
        assert capsys.readouterr().out.splitlines() == EXPECTED_OUTPUT[page]


def test_readme_examples_run(monkeypatch):
    """The README's examples (the front door) run as written from the project root."""
    monkeypatch.chdir(ROOT)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 3
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})  # noqa: S102 - our own docs
