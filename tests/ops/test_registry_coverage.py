"""Every registered op must appear in some test module's COVERED_OPS."""

import importlib
import pkgutil

import lowering.ops  # noqa: F401  (registers every op)
import tests.ops as ops_tests
from lowering.registry import all_ops


def test_every_registered_op_has_a_test_row():
    covered: set[str] = set()
    for info in pkgutil.iter_modules(ops_tests.__path__):
        if info.name.startswith("test_"):
            mod = importlib.import_module(f"tests.ops.{info.name}")
            covered |= set(getattr(mod, "COVERED_OPS", ()))
    missing = sorted(set(all_ops()) - covered)
    assert not missing, f"registered ops without a test row: {missing}"
