"""The docstring examples of every maxfx.interfaces module run and print what they show."""

import doctest
import importlib
import pkgutil

import pytest

import maxfx.interfaces

MODULES = sorted(m.name for m in pkgutil.iter_modules(maxfx.interfaces.__path__, "maxfx.interfaces."))


def test_every_module_has_examples():
    assert len(MODULES) >= 15
    assert all(doctest.DocTestFinder().find(importlib.import_module(m)) for m in MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {module}"
