"""The graphs being built, innermost last: what ``Graph.current`` reads.

A `Weight` joins whichever graph is being built when it is used. It asks this
module rather than `Graph` itself, which imports `Weight` to create weights.

Example:
    >>> from maxfx.graph import Graph
    >>> current_graph() is None
    True
    >>> with Graph("g") as g:
    ...     current_graph() is g
    True
"""

from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["current_graph", "enter_graph", "exit_graph"]

_graph_stack: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar("maxfx_graphs", default=())


def current_graph() -> Any:
    """The innermost `Graph` being built (None outside every ``with Graph(...)``)."""
    stack = _graph_stack.get()
    return stack[-1] if stack else None


def enter_graph(graph: Any) -> contextvars.Token:
    """Make ``graph`` the current one; `exit_graph` with the token restores the previous one."""
    return _graph_stack.set(_graph_stack.get() + (graph,))


def exit_graph(token: contextvars.Token) -> None:
    """Undo the `enter_graph` that returned ``token``."""
    _graph_stack.reset(token)
