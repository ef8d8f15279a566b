"""Dependencies point one way: maxfx → lowering → custom_calls → jax.

Parsed statically (ast), so a violating import fails here even if it is only
reached lazily inside a function.
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
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
    f.write_text(
        "import maxfx.graph\nfrom lowering import ir\ndef f():\n    importlib.import_module('custom_calls.x')\n    "
        "__import__('numpy')\n"
    )
    assert _imported_packages(f) == {"maxfx", "lowering", "custom_calls", "numpy"}


# ─── import cycles ────────────────────────────────────────────────────────────
# Nodes are modules (``pkg/__init__.py`` is ``pkg``); every ``import`` anywhere in a file,
# inside functions too, is an edge, so a cycle cannot hide behind a deferred import.

PROJECT = ("maxfx", "lowering", "custom_calls")


def _module_files(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Module name → (file, is a package ``__init__``)."""
    found = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imported_names(node: ast.AST, module: str, is_package: bool, modules: dict) -> list[str]:
    """The dotted names an import statement reaches: ``from a.b import c`` is ``a.b.c`` when that is a module, else
    ``a.b``.
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names]


def import_graph(
    root: Path, packages: tuple[str, ...] = PROJECT, package_inits: bool = False
) -> dict[str, dict[str, list[int]]]:
    """module → {imported project module: line numbers}.

    With ``package_inits``, importing ``p.q.m`` from outside ``p.q`` is also an edge
    to ``p.q`` (and ``p``): Python runs those ``__init__`` files first, so a cycle
    through one is a circular import whenever that module happens to load first.
    """
    modules = _module_files(root, packages)
    graph: dict[str, dict[str, list[int]]] = {m: {} for m in modules}
    for module, (path, is_package) in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for name in _imported_names(node, module, is_package, modules):
                while name and name not in modules:  # ``import a.b.c`` of an attribute: its longest module prefix
                    name = name.rpartition(".")[0]
                parents = [name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)] if package_inits else []
                for target in [name, *parents]:
                    inside = module == target or module.startswith(target + ".")
                    if target and not inside and (target == name or target in modules):
                        graph[module].setdefault(target, []).append(node.lineno)
    return graph


def import_cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return sorted(cycles)


def _describe(cycle: list[str], graph: dict[str, dict[str, list[int]]]) -> str:
    members = set(cycle)
    edges = [
        f"    {a} -> {b} (line {', '.join(map(str, graph[a][b]))})"
        for a in cycle
        for b in sorted(graph[a])
        if b in members
    ]
    return " / ".join(cycle) + "\n" + "\n".join(edges)


def test_no_import_cycles():
    graph = import_graph(ROOT)
    cycles = import_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s), counting imports inside functions:\n" + "\n".join(
        _describe(c, graph) for c in cycles
    )


def test_no_import_cycles_through_package_inits():
    graph = import_graph(ROOT, package_inits=True)
    cycles = import_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s) through package __init__ files:\n" + "\n".join(
        _describe(c, graph) for c in cycles
    )


# The engine runs any op from its registry entry: it never imports an op family.
ENGINE = (
    "lowering.ir",
    "lowering.registry",
    "lowering.plan",
    "lowering.context",
    "lowering.interpret",
    "lowering.eager",
    "lowering.executables",
    "lowering.compile",
)


def _reachable(graph: dict[str, dict[str, list[int]]], start: str) -> dict[str, str]:
    """Every module ``start`` imports, directly or not → the module that imports it."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        module = todo.pop()
        for target in graph[module]:
            if target not in via and target != start:
                via[target] = module
                todo.append(target)
    return via


def test_the_engine_imports_no_op_definitions():
    graph = import_graph(ROOT)
    assert {"lowering.ir", "lowering.registry", "lowering.context", "lowering.interpret", "lowering.compile"} <= set(
        graph
    )
    bad = []
    for module in (m for m in ENGINE if m in graph):
        via = _reachable(graph, module)
        bad += [
            f"{module} reaches {op} (imported by {via[op]})"
            for op in sorted(via)
            if op == "lowering.ops" or op.startswith("lowering.ops.")
        ]
    assert not bad, "the engine imports op definitions:\n" + "\n".join(bad)


def test_the_cycle_checker_finds_a_planted_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.sub import b\n")  # the package imports b: not a cycle by itself
    (pkg / "a.py").write_text("import numpy\n\ndef f():\n    from .sub import b\n")  # deferred, relative
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import c\n")  # relative, and ``c`` is the module pkg.c
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg.sub.b import something\n")  # into the cycle, not part of it
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.sub.b": [4]}
    assert graph["pkg.sub.b"] == {"pkg.c": [1]}
    assert import_cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert _reachable(graph, "pkg.d") == {"pkg.sub.b": "pkg.d", "pkg.c": "pkg.sub.b", "pkg.a": "pkg.c"}
    (pkg / "c.py").write_text("import numpy\n")
    assert import_cycles(import_graph(tmp_path, ("pkg",))) == []
    # A cycle only through a package __init__: pkg.e importing pkg.sub.b first runs
    # pkg/sub/__init__.py, which imports pkg.e back (a circular import if pkg.e loads first).
    (pkg / "e.py").write_text("from pkg.sub.b import x\n")
    (pkg / "sub" / "__init__.py").write_text("from pkg import e\n")
    (pkg / "sub" / "b.py").write_text("x = 1\n")
    assert import_cycles(import_graph(tmp_path, ("pkg",))) == []
    assert import_cycles(import_graph(tmp_path, ("pkg",), package_inits=True)) == [["pkg.e", "pkg.sub"]]
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "e.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from pkg import e\n")  # b and e form a cycle; pkg.sub is outside it
    assert import_cycles(import_graph(tmp_path, ("pkg",), package_inits=True)) == [["pkg.e", "pkg.sub.b"]]


# ─── no patching at import time ───────────────────────────────────────────────
# A module may not change another project package's objects when it is imported
# (``EAGER.wrap = ...``, ``set_device_resolver(...)``): what a module does must not
# depend on which other modules happen to be loaded.

_INSTALLERS = ("set_", "register", "install", "patch")


def _import_time_statements(body: list[ast.stmt]):
    """Statements that run on import: the module body and its if/try/for/with blocks, not def or class bodies."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield node
        for block in ("body", "orelse", "finalbody"):
            yield from _import_time_statements(getattr(node, block, []))
        for handler in getattr(node, "handlers", []):
            yield from _import_time_statements(handler.body)


def import_time_patches(path: Path, package: str) -> list[str]:
    """Import-time writes into names imported from another project package (``pkg.attr = x``, ``setattr``,
    ``set_*()``).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    foreign = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] in set(PROJECT) - {package}
        ):
            foreign.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            foreign.update(
                (a.asname or a.name).split(".")[0]
                for a in node.names
                if a.name.split(".")[0] in set(PROJECT) - {package}
            )

    def root(expr: ast.expr) -> str | None:
        while isinstance(expr, (ast.Attribute, ast.Subscript)):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    found = []
    for stmt in _import_time_statements(tree.body):
        targets = (
            stmt.targets
            if isinstance(stmt, ast.Assign)
            else [stmt.target]
            if isinstance(stmt, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        found += [
            f"{path.name}:{stmt.lineno}: {ast.unparse(t)} = ..."
            for t in targets
            if isinstance(t, (ast.Attribute, ast.Subscript)) and root(t) in foreign
        ]
        if isinstance(stmt, (ast.Expr, ast.Assign)):
            for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
                name = ast.unparse(call.func)
                if name == "setattr" and call.args and root(call.args[0]) in foreign:
                    found.append(f"{path.name}:{stmt.lineno}: {ast.unparse(call)}")
                elif root(call.func) in foreign and name.rpartition(".")[2].startswith(_INSTALLERS):
                    found.append(f"{path.name}:{stmt.lineno}: {name}(...)")
    return found


@pytest.mark.parametrize("package", PROJECT)
def test_no_import_time_patching(package):
    found = [
        f"{path.relative_to(ROOT).parent}/{hit}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for hit in import_time_patches(path, package)
    ]
    assert not found, "modules that change another package's objects when imported:\n" + "\n".join(found)


def test_the_patch_check_sees_patches(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from lowering.eager import EAGER\n"
        "from lowering.types import set_device_resolver\n"
        "import lowering.registry as registry\n"
        "from maxfx.graph import Graph\n"
        "EAGER.wrap = len\n"
        "set_device_resolver(len)\n"
        "if True:\n"
        "    registry.TABLE['x'] = 1\n"
        "setattr(Graph, 'y', 2)\n"  # same package: allowed
        "EAGER.run(1)\n"  # a plain call: allowed
        "def f():\n"
        "    EAGER.wrap = None\n"  # at call time, not import time
    )
    assert [hit.split(":")[1] for hit in import_time_patches(f, "maxfx")] == ["5", "6", "8"]


# ─── deferred imports ─────────────────────────────────────────────────────────
# A function-level import is allowed only for a dependency outside the project that is
# optional or slow to load, and says why: ``import torch  # noqa: PLC0415 - optional dependency``.

MAX_DEFERRED_IMPORTS = 20
_SUPPRESSION = "noqa: PLC0415"


def deferred_import_problems(path: Path, project: tuple[str, ...] = PROJECT) -> tuple[int, list[str]]:
    """(number of PLC0415 suppressions in ``path``, what is wrong with them)."""
    lines = path.read_text().splitlines()
    marked = {i + 1 for i, line in enumerate(lines) if _SUPPRESSION in line}
    problems = []
    seen = set()
    for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        line = next((n for n in range(node.lineno, node.end_lineno + 1) if n in marked), None)
        if line is None:
            continue
        seen.add(line)
        names = (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [("." * node.level) + (node.module or "")]
        )
        where = f"{path.name}:{line}"
        tops = [name.split(".")[0] for name in names]
        if any(not top or top in project for top in tops):
            problems.append(
                f"{where}: defers a project import ({', '.join(names)}); import it at module level (break the cycle "
                "instead)"
            )
        elif any(top in sys.stdlib_module_names for top in tops):
            problems.append(
                f"{where}: defers the standard-library module {', '.join(names)}; import it at module level"
            )
        elif not lines[line - 1].split(_SUPPRESSION, 1)[1].strip(" -–:()"):
            problems.append(
                f"{where}: say why {', '.join(names)} is imported late, e.g. '# {_SUPPRESSION} - optional dependency'"
            )
    problems += [f"{path.name}:{n}: {_SUPPRESSION} on a line without an import" for n in sorted(marked - seen)]
    return len(marked), problems


def test_deferred_imports_are_few_and_optional():
    count, problems = 0, []
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            n, bad = deferred_import_problems(path)
            count += n
            problems += [f"{path.relative_to(ROOT).parent}/{p}" for p in bad]
    assert count <= MAX_DEFERRED_IMPORTS and not problems, (
        f"{count} deferred imports (at most {MAX_DEFERRED_IMPORTS}):\n" + "\n".join(problems)
    )


def test_the_deferred_import_check_sees_bad_ones(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "def f():\n"
        "    import torch  # noqa: PLC0415 - optional dependency\n"
        "    import safetensors.torch  # noqa: PLC0415\n"
        "    from maxfx.graph import (  # noqa: PLC0415 - cycle\n"
        "        Graph,\n"
        "    )\n"
        "    import os  # noqa: PLC0415 - cheap\n"
        "    from . import sibling  # noqa: PLC0415 - relative\n"
        "x = 1  # noqa: PLC0415\n"
    )
    count, problems = deferred_import_problems(f)
    assert count == 6
    assert [p.split(":")[1] for p in problems] == ["3", "4", "7", "8", "9"], problems
    assert (
        "say why" in problems[0]
        and "maxfx.graph" in problems[1]
        and "standard-library" in problems[2]
        and "without an import" in problems[4]
    )


def test_a_cpu_program_does_not_import_pallas():
    """Pallas and its Triton/Mosaic lowerings (~0.25 s) load when a kernel is first traced, not with maxfx."""
    code = (
        "import sys\n"
        "from maxfx import functional as F\n"
        "from maxfx.tensor import Tensor\n"
        "x = Tensor([[1.0, -2.0], [3.0, 4.0]])\n"
        "F.relu(x @ x).to_numpy()\n"
        "assert 'jax.experimental.pallas' not in sys.modules, 'pallas was imported'\n"
        "from custom_calls._pallas import pl\n"
        "assert pl.cdiv(10, 4) == 3 and 'jax.experimental.pallas' in sys.modules\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
