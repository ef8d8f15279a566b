"""Re-execute notebooks in place so the committed files show their outputs (plots as PNG).

``make notebooks-refresh`` runs this on every notebook in this folder. Each notebook runs
from its own folder, where JupyterLab and ``jupyter execute`` start its kernel, with the
``python3`` kernel of the environment running this script. Per-cell timestamps are not
recorded, so a refresh changes only what a reader sees; a cell that raises stops the
refresh with an error naming the notebook and leaves that file untouched.

Example::

    .venv/bin/python notebooks/refresh.py                     # every notebook here
    .venv/bin/python notebooks/refresh.py notebooks/training.ipynb
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 600  # per cell: the slowest cell (200 training steps on a CPU) takes ~10 s


def refresh(path: Path) -> None:
    """Execute ``path`` from its own folder and overwrite it with the executed cells."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        record_timing=False,  # no per-cell timestamps: they would change on every refresh
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    nbformat.write(nb, path)


def main(argv: list[str]) -> None:
    paths = [Path(a).resolve() for a in argv] or sorted(HERE.glob("*.ipynb"))
    for path in paths:
        if path.suffix != ".ipynb" or not path.is_file():
            raise FileNotFoundError(f"refresh: {path} is not a notebook file (expected an existing *.ipynb)")
        print(f"executing {path.name}", flush=True)
        refresh(path)


if __name__ == "__main__":
    main(sys.argv[1:])
