"""The docs build strictly (broken links or nav entries fail) and every page's examples run.

Each ```python block of a page (and of the README) runs on its own, in a fresh namespace, unless
its first line is the marker ``# Continues the previous example.``: then it runs in the namespace
of the block before it. The marker is what the reader sees too, so a block never silently needs
names that only an earlier block defines.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import maxfx.graph.ops  # noqa: F401 - registers every op first, so the pages' scoped registrations only remove their own
from lowering.registry import scoped_registrations

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_strict_build(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-q",
            "-f",
            str(ROOT / "docs" / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
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
    "serve.md": ["200 4 length", "max_tokens"],
    "distributed.md": ["1 False (4, 2)"],
}


# The first line of a block that runs in the namespace of the block before it.
CONTINUES = "# Continues the previous example."


def _python_blocks(markdown: Path) -> list[str]:
    # ```python blocks are complete examples; fragments use ```py and are not run.
    return re.findall(r"```python\n(.*?)```", markdown.read_text(), re.S)


def _run_examples(blocks: list[str], source: str) -> None:
    """Run ``blocks`` in order: each in a fresh namespace, or, if its first line is ``CONTINUES``,
    in the namespace of the block before it (so chains 0 <- 1 <- 2 share one).

    A failing block raises an AssertionError naming ``source`` and the block's index, e.g.
    ``_run_examples(["a = 1", "print(a)"], "x.md")`` raises
    ``x.md block 1: NameError: name 'a' is not defined (...)``.
    """
    namespace: dict = {}
    for index, block in enumerate(blocks):
        continues = block.partition("\n")[0] == CONTINUES
        if continues and index == 0:
            raise AssertionError(f"{source} block 0 starts with {CONTINUES!r}, but no block comes before it")
        if not continues:
            namespace = {}
        try:
            exec(compile(block, f"{source} block {index}", "exec"), namespace)  # noqa: S102 - our own docs
        except Exception as err:
            hint = (
                f" (a block that needs an earlier block's names must start with {CONTINUES!r})"
                if isinstance(err, NameError)
                else ""
            )
            raise AssertionError(f"{source} block {index}: {type(err).__name__}: {err}{hint}") from err


def test_blocks_run_fresh_unless_marked():
    """A block that uses a name only an earlier block defines fails, naming the source and the block,
    unless it starts with the marker; marked blocks chain."""
    defines, uses = "answer = 42\n", "assert answer == 42\n"
    _run_examples([defines, f"{CONTINUES}\n{uses}", f"{CONTINUES}\n{uses}"], "chain.md")
    with pytest.raises(AssertionError, match=r"^fresh\.md block 2: NameError: name 'answer' is not defined"):
        _run_examples([defines, f"{CONTINUES}\n{uses}", uses], "fresh.md")
    with pytest.raises(AssertionError, match=r"^first\.md block 0 starts with"):
        _run_examples([f"{CONTINUES}\n{defines}"], "first.md")


def _pages_with_examples() -> list:
    pages = sorted(p.name for p in PAGES.glob("*.md") if _python_blocks(p))
    return [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p for p in pages]


@pytest.mark.parametrize("page", _pages_with_examples())
def test_page_examples_run(page, capsys):
    """A page's examples run as written and print what the page says.

    Each block runs alone, in a fresh namespace, unless its first line is exactly
    ``# Continues the previous example.`` (``CONTINUES``): then it runs in the namespace of the
    block before it. A failure names the page and the block's index (0 = the page's first block).
    """
    with scoped_registrations():  # ops.md registers an example op: it must not outlive the page
        _run_examples(_python_blocks(PAGES / page), page)
    if page in EXPECTED_OUTPUT:
        assert capsys.readouterr().out.splitlines() == EXPECTED_OUTPUT[page]


def test_readme_examples_run(monkeypatch):
    """The README's examples (the front door) run as written from the project root, each alone
    unless it starts with ``# Continues the previous example.`` (as on the docs pages)."""
    monkeypatch.chdir(ROOT)
    blocks = _python_blocks(ROOT / "README.md")
    assert len(blocks) >= 3
    _run_examples(blocks, "README.md")
