"""Every notebook in notebooks/ runs with ``jupyter execute`` and is committed with its outputs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
REFRESH_HINT = "run `make notebooks-refresh` and commit the notebooks"


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


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_with_jupyter_execute(path, tmp_path, monkeypatch):
    """``jupyter execute notebooks/X.ipynb`` from the repository root: the kernel starts in notebooks/, as in
    JupyterLab.
    """
    _use_this_interpreter(tmp_path, monkeypatch)
    out = tmp_path / "executed"
    cmd = [sys.executable, "-m", "jupyter", "execute", "--timeout=600", f"--output={out}", str(path)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{' '.join(cmd)} failed:\n{run.stderr[-4000:]}"
    executed = nbformat.read(out.with_suffix(".ipynb"), as_version=4)
    outputs = [o for c in _code_cells(executed) for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # Warnings (e.g. tqdm's "IProgress not found" without ipywidgets) would show on the page.
    assert not [o.text for o in outputs if o.get("name") == "stderr"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_notebook_carries_its_outputs(path):
    """Every code cell was executed, top to bottom in one run, without errors (``notebooks/refresh.py``)."""
    cells = _code_cells(nbformat.read(path, as_version=4))
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: execution counts {counts}; {REFRESH_HINT}"
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"], f"{path.name}: {REFRESH_HINT}"
    assert not [c for c in cells if "execution" in c.metadata], f"{path.name}: per-cell timestamps; {REFRESH_HINT}"


def test_training_notebook_shows_its_plot():
    nb = nbformat.read(ROOT / "notebooks" / "training.ipynb", as_version=4)
    images = [o for c in _code_cells(nb) for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1, f"training.ipynb should carry its loss plot as one PNG output; {REFRESH_HINT}"


def test_there_is_a_notebook():
    assert NOTEBOOKS, "notebooks/ should hold at least one notebook"
