"""Public op names are assigned explicitly, so grep, IDEs and ``help()`` see them.

``maxfx.graph.ops`` imports each registry front by name and
``maxfx.experimental.functional`` wraps each one in its own assignment; these
tests keep both in step with the registry and keep ``globals().update`` out of
maxfx's public modules.
"""

import ast
import pydoc
import tomllib
from pathlib import Path

import pytest

import maxfx
import maxfx.functional
from lowering.registry import fronts
from maxfx.experimental import functional as F
from maxfx.graph import ops

ROOT = Path(__file__).resolve().parents[2]
# Names maxfx.graph.ops re-exports beside the op fronts (MAX documents them there).
OPS_REEXPORTS = {"Callable", "DeviceRef", "InterpolationMode", "TensorType"}
# MAX's submodules of ops (ops.random.uniform, ops.elementwise.max...), exported beside the fronts.
OPS_SUBMODULES = {"allreduce", "complex", "elementwise", "random", "reduction"}


def _public(module) -> set[str]:
    return {n for n in vars(module) if not n.startswith("_")}


def library_fronts() -> dict:
    """The registry's fronts defined by the library (not ones a user, a test or a docs page registers)."""
    return {name: fn for name, fn in fronts().items() if (fn.__module__ or "").split(".")[0] in ("lowering", "maxfx")}


def test_graph_ops_exports_exactly_the_registry_fronts():
    table = library_fronts()
    assert set(ops.__all__) == set(table) | OPS_REEXPORTS | OPS_SUBMODULES
    assert len(ops.__all__) == len(set(ops.__all__)), "duplicate names in ops.__all__"
    assert _public(ops) == set(ops.__all__), "ops has public names outside __all__ (or __all__ names it lacks)"
    wrong = [n for n, fn in table.items() if getattr(ops, n) is not fn]
    assert not wrong, f"ops.X is not the registry front for {wrong}"


def test_functional_wraps_each_front_under_its_own_module():
    table = library_fronts()
    names = [n for n in F.__all__ if n not in ("functional", "constant", "lazy")] + ["flash_attention"]
    for name in names:
        fn = getattr(F, name)
        assert fn.__wrapped__ is table[name], name
        assert fn.__module__ == "maxfx.experimental.functional", name
        assert fn.__doc__ == table[name].__doc__, name
    assert F.constant.__module__ == "maxfx.experimental.functional"
    assert "constant" in F.__all__ and "flash_attention" not in F.__all__


def test_functional_lists_the_89_documented_names():
    documented = [n for n in F.__all__ if n not in ("functional", "lazy")]  # lazy: MAX's context manager, not an op
    assert len(documented) == len(set(documented)) == 89
    assert _public(F) >= set(F.__all__)


def test_maxfx_functional_is_the_same_module():
    assert maxfx.functional is F
    assert maxfx.functional.softmax is F.softmax


def test_help_names_the_maxfx_module_and_shows_an_example():
    text = pydoc.render_doc(maxfx.functional.softmax, renderer=pydoc.plaintext)
    assert "in module maxfx.experimental.functional" in text
    assert "softmax(value, axis=-1)" in text
    assert ">>> " in text and "ops.softmax(" in text and "TensorType(" in text


def test_artifact_error_is_a_public_name_load_exported_raises(tmp_path):
    from maxfx._artifact import ArtifactError

    assert maxfx.ArtifactError is ArtifactError and "ArtifactError" in maxfx.__all__ and "ArtifactError" in dir(maxfx)
    path = tmp_path / "not_an_artifact.maxfx"
    path.write_bytes(b"not a zip file")
    with pytest.raises(maxfx.ArtifactError, match="not_an_artifact.maxfx"):
        maxfx.load_exported(path)


def test_op_errors_are_top_level_names():
    """Issue 35 item 2e: the errors ops raise are importable from ``maxfx`` (and listed in ``__all__``)."""
    import jax
    import numpy as np

    from maxfx import AxisError, DataDependentShapeError, IndexOpError, OpError
    from maxfx.experimental.tensor import Tensor
    from maxfx.graph import ops

    names = ("OpError", "AxisError", "IndexOpError", "DataDependentShapeError")
    assert all(n in maxfx.__all__ and n in dir(maxfx) for n in names)
    assert issubclass(OpError, ValueError) and issubclass(AxisError, OpError) and issubclass(AxisError, IndexError)
    assert issubclass(IndexOpError, OpError) and issubclass(DataDependentShapeError, IndexOpError)
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(AxisError, match="axis"):
        ops.softmax(x, axis=5)
    with pytest.raises(OpError, match="matmul"):
        ops.matmul(x, x)
    with pytest.raises(IndexOpError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(DataDependentShapeError):
        jax.jit(lambda t: t[t > 3.0])(x)


# ─── no dynamically filled public namespace ───────────────────────────────


def _fills_globals(tree: ast.AST) -> list[int]:
    """Lines that write the module namespace through ``globals()`` / ``vars()``."""

    def is_namespace_call(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("globals", "vars")
            and not node.args
        )

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("update", "setdefault", "__setitem__") and is_namespace_call(node.func.value):
                hits.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            hits += [node.lineno for t in targets if isinstance(t, ast.Subscript) and is_namespace_call(t.value)]
    return hits


def _public_modules() -> list[Path]:
    """maxfx modules a user imports: no path component after ``maxfx/`` starts with ``_`` (``__init__`` aside)."""
    paths = []
    for path in sorted((ROOT / "maxfx").rglob("*.py")):
        parts = path.relative_to(ROOT / "maxfx").parts
        if all(not p.startswith("_") or p == "__init__.py" for p in parts):
            paths.append(path)
    return paths


def test_no_public_namespace_is_filled_with_globals_update():
    modules = _public_modules()
    assert ROOT / "maxfx" / "graph" / "ops" / "__init__.py" in modules
    assert ROOT / "maxfx" / "experimental" / "functional.py" in modules
    bad = []
    for path in modules:
        lines = _fills_globals(ast.parse(path.read_text(), filename=str(path)))
        bad += [f"{path.relative_to(ROOT)}:{line}" for line in lines]
    assert not bad, "public names assigned through globals(); write them out instead:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("globals().update(table)", True),
        ("globals()['add'] = add", True),
        ("vars().setdefault('x', 1)", True),
        ("names = sorted(globals())", False),
        ("add = _f.add", False),
    ],
)
def test_the_checker_sees_namespace_writes(source, found):
    assert bool(_fills_globals(ast.parse(source))) is found


def test_package_is_typed():
    # PEP 561: type checkers read maxfx's annotations only when py.typed ships with it.
    assert (ROOT / "maxfx" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["maxfx"]
