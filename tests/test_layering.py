"""Dependencies point one way: maxfx → lowering → custom_calls → jax.

Parsed statically (ast), so a violating import fails here even if it is only
reached lazily inside a function.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "lowering": {"maxfx"},
    "custom_calls": {"maxfx", "lowering"},
    "maxfx": {"custom_calls"},
}


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.add(node.args[0].value.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        hits = _imported_packages(path) & FORBIDDEN[package]
        if hits:
            bad.append(f"{path.relative_to(ROOT)} imports {sorted(hits)}")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_the_checker_sees_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import maxfx.graph\nfrom lowering import ir\ndef f():\n    importlib.import_module('custom_calls.x')\n    __import__('numpy')\n")
    assert _imported_packages(f) == {"maxfx", "lowering", "custom_calls", "numpy"}
