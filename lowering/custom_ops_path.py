"""Custom-op libraries on disk: ``CUSTOM_OPS_PATH`` and the paths graphs name as ``custom_extensions``.

MAX finds Mojo kernel libraries (a ``.mojopkg``, a ``.mojoc``, a folder of
``.mojo`` sources) through ``custom_extensions`` and its tests through the
``CUSTOM_OPS_PATH`` environment variable. maxfx cannot compile or run Mojo; its
custom ops are JAX functions registered with ``register_custom_op``. A library
path may therefore hold Python: a ``.py`` file, or a folder whose ``.py``
files are imported (in name order) and register their ops when imported.
`load_library` imports a path once; `load_environment` loads every path of
``CUSTOM_OPS_PATH`` (``os.pathsep``-separated). A path that holds only Mojo
kernels is remembered, so that a lookup of one of its ops fails naming it and
saying why (`mojo_note`).

Example:
    >>> import os, tempfile
    >>> from lowering.ops.custom import lookup_custom_op
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "ops.py"), "w") as f:
    ...     _ = f.write(
    ...         "from lowering.ops.custom import register_custom_op\\n"
    ...         "register_custom_op('doc_add_one', lambda x: x + 1)\\n"
    ...     )
    >>> load_library(folder)
    >>> lookup_custom_op("doc_add_one").name
    'doc_add_one'
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path

__all__ = ["MOJO_SUFFIXES", "load_environment", "load_library", "mojo_libraries", "mojo_note"]

MOJO_SUFFIXES = (".mojo", ".🔥", ".mojopkg", ".mojoc")
_loaded: set[Path] = set()
_mojo: dict[Path, int] = {}  # a library path holding Mojo kernels -> how many Mojo files
_lock = threading.RLock()


def _import_file(path: Path) -> None:
    name = f"_maxfx_custom_ops_{abs(hash(str(path)))}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"custom ops: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        sys.modules.pop(name, None)
        raise


def load_library(path: str | os.PathLike[str]) -> None:
    """Import the Python custom ops at ``path`` (a ``.py`` file or a folder of them), once per path.

    Mojo kernels found there (``.mojo``, ``.mojopkg``, ``.mojoc`` files) are not
    run; the path is remembered for `mojo_note`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ImportError (or what the file raises): a Python file failed to import.
    """
    p = Path(path).expanduser().resolve()
    with _lock:
        if p in _loaded:
            return
        if not p.exists():
            raise FileNotFoundError(f"custom ops library {p} does not exist")
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        python = [f for f in files if f.suffix == ".py" and f.is_file() and "__pycache__" not in f.parts]
        mojo = [f for f in files if f.suffix in MOJO_SUFFIXES or (f.is_dir() and f.suffix == ".mojopkg")]
        _loaded.add(p)
        if mojo:
            _mojo[p] = len(mojo)
        for f in python:
            _import_file(f)


def load_environment() -> None:
    """`load_library` every existing path of ``CUSTOM_OPS_PATH`` (a missing one is noted as such by `mojo_note`)."""
    for entry in os.environ.get("CUSTOM_OPS_PATH", "").split(os.pathsep):
        if entry and Path(entry).expanduser().exists():
            load_library(entry)


def mojo_libraries() -> dict[Path, int]:
    """Library paths seen so far that hold Mojo kernels -> their number of Mojo files."""
    with _lock:
        return dict(_mojo)


def mojo_note() -> str:
    """A sentence for an unknown custom op: which libraries hold Mojo kernels maxfx cannot run (empty if none)."""
    libs = mojo_libraries()
    if not libs:
        return ""
    names = ", ".join(f"{p} ({n} Mojo file{'s' if n != 1 else ''})" for p, n in libs.items())
    return (
        f" The custom-op libraries {names} hold Mojo kernels, which need Modular's Mojo compiler and MAX's native "
        "runtime;"
        " maxfx runs none of them. Put a Python file that registers a JAX implementation of each op"
        " (lowering.ops.custom.register_custom_op) in CUSTOM_OPS_PATH or in the graph's custom_extensions."
    )
