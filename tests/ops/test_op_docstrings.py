"""Every op docstring example runs, as written, under doctest.

One test per docstring of ``lowering.ops.*``, ``maxfx.graph.ops`` and
``maxfx.experimental.functional``. Examples start from empty globals, so each
one imports what it uses and can be pasted into a shell as shown by ``help()``.
"""

import doctest
import importlib
import pkgutil
import re

import pytest

import lowering.ops
from lowering.registry import fronts
from tests.ops.test_public_names import library_fronts

MODULES = [
    *(f"lowering.ops.{m.name}" for m in pkgutil.iter_modules(lowering.ops.__path__)),
    "lowering.ops",
    "maxfx.graph.ops",
    "maxfx.experimental.functional",
]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _is_front_copy(module, test: doctest.DocTest) -> bool:
    # maxfx.experimental.functional's wrappers carry their front's docstring
    # (tests/ops/test_public_names.py checks it); that example already runs under the front's module.
    obj = getattr(module, test.name.rsplit(".", 1)[-1], None)
    return getattr(obj, "__wrapped__", None) in fronts().values() and obj.__doc__ == obj.__wrapped__.__doc__


def _collect() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = []
    for name in MODULES:
        module = importlib.import_module(name)
        found = finder.find(module, globs={"__name__": "__doctest__"})
        tests += [t for t in found if t.examples and not _is_front_copy(module, t)]
    return sorted(tests, key=lambda t: t.name)


DOCTESTS = _collect()


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_docstring_example(test):
    report = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    try:
        result = runner.run(test, out=report.append, clear_globs=True)
    finally:
        test.globs.clear()
    assert result.failed == 0, "".join(report)


def test_every_front_has_an_example():
    missing = sorted(name for name, fn in library_fronts().items() if ">>>" not in (fn.__doc__ or ""))
    assert not missing, f"fronts without a docstring example: {missing}"


def test_examples_are_collected():
    names = {t.name for t in DOCTESTS}
    assert "lowering.ops.elementwise.add" in names
    assert "maxfx.graph.ops" in names  # the module docstring
    assert "maxfx.experimental.functional.functional" in names
    assert not any(n.startswith("maxfx.experimental.functional.") and n.endswith(".softmax") for n in names)


def test_no_skipped_example_without_a_bug_note():
    # An example may be skipped only to document a known bug in the op: "# doctest: +SKIP  # BUG: ...".
    bad = []
    for name in MODULES:
        path = importlib.import_module(name).__file__
        for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
            if re.search(r"doctest:.*\+SKIP", line) and "# BUG:" not in line:
                bad.append(f"{path}:{lineno}: {line.strip()}")
    assert not bad, "skipped docstring examples:\n" + "\n".join(bad)
