"""Every notebook in notebooks/ executes without error."""

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _use_this_interpreter(tmp_path, monkeypatch):
    """Point the ``python3`` kernel at the interpreter running the tests.

    JUPYTER_PATH is searched before user and system dirs, so a ``python3``
    kernelspec elsewhere (another Python without maxfx's dependencies) cannot
    win, and a fresh venv needs no ``ipykernel install``.
    """
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter") + os.pathsep + os.environ.get("JUPYTER_PATH", ""))
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _execute(path: Path, cwd: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=600, resources={"metadata": {"path": str(cwd)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    """From the notebook's own folder, where Jupyter starts its kernel."""
    _use_this_interpreter(tmp_path, monkeypatch)
    _execute(path, path.parent)


def test_llm_notebook_runs_from_repo_root(tmp_path, monkeypatch):
    """The notebook that reads the repository's fixtures finds them from the root too (``nbclient`` / scripts run there)."""
    _use_this_interpreter(tmp_path, monkeypatch)
    _execute(ROOT / "notebooks" / "llm_inference.ipynb", ROOT)


def test_there_is_a_notebook():
    assert NOTEBOOKS, "notebooks/ should hold at least one notebook"
