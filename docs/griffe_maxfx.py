"""griffe extensions for the API pages (listed in ``docs/mkdocs.yml``).

- `ExampleSections`: maxfx's docstrings (like MAX's) title their doctest
  section ``Example:``; griffe's Google parser knows only ``Examples:`` as a
  section and renders the singular as an admonition of plain text, so ``>>>``
  lines lost their code formatting and outputs such as ``['0', '1']`` were read
  as Markdown links. The title is renamed before parsing; the docstrings stay
  as they are.
- `FunctionalFronts`: ``maxfx.experimental.functional`` makes each function at
  import time (``abs = _eager_front(_ops.abs)``), which static analysis sees as
  a bare attribute. Each such name becomes an alias of the ``maxfx.graph.ops``
  function it wraps, whose signature and docstring the wrapper carries at run
  time (``functools.wraps``), so the page shows what ``help()`` shows.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_TITLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)
_FRONT = re.compile(r"^_eager_front\(_ops\.(\w+)\)$")


class ExampleSections(griffe.Extension):
    """Rename ``Example:`` to ``Examples:`` in each docstring before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE_TITLE.sub(r"\1Examples:", obj.docstring.value)


class FunctionalFronts(griffe.Extension):
    """Document ``functional.X = _eager_front(_ops.X)`` as the op ``maxfx.graph.ops.X``."""

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        if mod.path != "maxfx.experimental.functional":
            return
        for name, member in list(mod.members.items()):
            match = _FRONT.match(str(member.value)) if isinstance(member, griffe.Attribute) else None
            if match:
                target = f"maxfx.graph.ops.{match.group(1)}"
                alias = griffe.Alias(name, target, lineno=member.lineno, endlineno=member.endlineno, parent=mod)
                mod.set_member(name, alias)
