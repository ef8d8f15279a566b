"""Tensor dimensions: static, symbolic and algebraic, with MAX's printing.

A dimension is a polynomial with integer coefficients over named symbols
(plus opaque ``//`` and ``%`` terms). Arithmetic canonicalises, so
``-Dim("x") - 4 == -(Dim("x") + 4)``; a constant result is a `StaticDim`, a bare
symbol a `SymbolicDim`, anything else an `AlgebraicDim`.

Symbolic dims stay symbolic while a graph is built and are bound to concrete
sizes when it runs (`Dim.evaluate`); `to_jax` maps them onto
``jax.export.symbolic_shape`` expressions for export.

Example:
    >>> from lowering.dims import Dim
    >>> print(Dim("batch") * 5)
    batch * 5
    >>> Dim(5) == 5
    True
"""

from __future__ import annotations

import ast
import numbers
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from lowering import mlir_interop

__all__ = [
    "Dim",
    "StaticDim",
    "SymbolicDim",
    "AlgebraicDim",
    "Shape",
    "DimLike",
    "ShapeLike",
    "UnboundDimError",
    "format_shape",
]

# A polynomial: tuple of (monomial, coeff) sorted; monomial = tuple of atoms (with repetition) sorted.
# An atom is a symbol name (str) or an opaque ("//" | "%", poly, poly) tuple.
_Poly = tuple


class UnboundDimError(ValueError):
    """A symbolic dimension has no value in the binding environment."""


def format_shape(shape: Iterable[Any]) -> str:
    """``[2, seq, 8]``: a shape as error messages show it (symbolic dims by name).

    Example:
        >>> format_shape([2, "seq", 8])
        '[2, seq, 8]'
    """
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _atom_key(atom) -> str:
    if isinstance(atom, str):
        return atom
    op, a, b = atom
    return f"({_operand(a)} {op} {_operand(b)})"


def _operand(p: _Poly) -> str:
    text = _format_poly(p)
    return f"({text})" if len(p) > 1 or (p and len(p[0][0]) > 0 and p[0][1] != 1) else text


def _make_poly(terms: Mapping[tuple, int]) -> _Poly:
    return tuple(
        sorted(
            ((m, c) for m, c in terms.items() if c != 0), key=lambda mc: (-len(mc[0]), [_atom_key(a) for a in mc[0]])
        )
    )


def _poly_add(a: _Poly, b: _Poly, sign: int = 1) -> _Poly:
    out = dict(a)
    for m, c in b:
        out[m] = out.get(m, 0) + sign * c
    return _make_poly(out)


def _poly_mul(a: _Poly, b: _Poly) -> _Poly:
    out: dict[tuple, int] = {}
    for ma, ca in a:
        for mb, cb in b:
            m = tuple(sorted(ma + mb, key=_atom_key))
            out[m] = out.get(m, 0) + ca * cb
    return _make_poly(out)


def _poly_const(p: _Poly) -> int | None:
    if not p:
        return 0
    if len(p) == 1 and p[0][0] == ():
        return p[0][1]
    return None


def _format_term(mono: tuple, coeff: int) -> str:
    names = [_atom_key(a) for a in mono]
    if not names:
        return str(coeff)
    body = " * ".join(names)
    if coeff == 1:
        return body
    if coeff == -1:
        return f"-{body}"
    return f"{body} * {coeff}"


def _format_poly(p: _Poly) -> str:
    if not p:
        return "0"
    parts: list[str] = []
    for i, (m, c) in enumerate(p):
        if i == 0:
            parts.append(_format_term(m, c))
        elif c < 0:
            parts.append(f"- {_format_term(m, -c)}")
        else:
            parts.append(f"+ {_format_term(m, c)}")
    return " ".join(parts)


def _eval_poly(p: _Poly, env: Mapping[str, Any]) -> Any:
    total: Any = 0
    for mono, coeff in p:
        term: Any = coeff
        for atom in mono:
            term = term * _eval_atom(atom, env)
        total = total + term
    return total


def _eval_atom(atom, env: Mapping[str, Any]) -> Any:
    if isinstance(atom, str):
        try:
            return env[atom]
        except KeyError:
            raise UnboundDimError(f"symbolic dimension {atom!r} has no value") from None
    op, a, b = atom
    va, vb = _eval_poly(a, env), _eval_poly(b, env)
    return va // vb if op == "//" else va % vb


def _atoms_symbols(p: _Poly, out: dict[str, None]) -> None:
    for mono, _ in p:
        for atom in mono:
            if isinstance(atom, str):
                out.setdefault(atom)
            else:
                _atoms_symbols(atom[1], out)
                _atoms_symbols(atom[2], out)


class Dim:
    """A tensor dimension. ``Dim(5)``, ``Dim("batch")`` or an expression of dims.

    ``Dim(value)`` returns a `StaticDim` for ints, a `SymbolicDim` for strings and
    the dim itself for dims.
    """

    __slots__ = ("_poly", "_hash")

    def __new__(cls, value: Any = None, *args, **kwargs):
        if cls is Dim:
            return _to_dim(value)
        if type(value) is cls:  # StaticDim(d), SymbolicDim(d), AlgebraicDim(d) of their own kind: d itself
            return value
        return object.__new__(cls)

    def _init_poly(self, poly: _Poly) -> None:
        self._poly = poly
        self._hash = None

    # -- arithmetic -------------------------------------------------------
    # An operand that is not dim-like (a tensor value...) gives NotImplemented, so
    # Python tries its reflected method: ``Dim(5) + x`` is ``x.__radd__(Dim(5))``.
    def __add__(self, other):
        o = _dim_operand(other)
        return NotImplemented if o is None else _from_poly(_poly_add(self._poly, o))

    __radd__ = __add__

    def __sub__(self, other):
        o = _dim_operand(other)
        return NotImplemented if o is None else _from_poly(_poly_add(self._poly, o, -1))

    def __rsub__(self, other):
        o = _dim_operand(other)
        return NotImplemented if o is None else _from_poly(_poly_add(o, self._poly, -1))

    def __mul__(self, other):
        o = _dim_operand(other)
        return NotImplemented if o is None else _from_poly(_poly_mul(self._poly, o))

    __rmul__ = __mul__

    def __neg__(self):
        return _from_poly(_poly_mul(self._poly, _const_poly(-1)))

    def __floordiv__(self, other):
        o = _dim_operand(other)
        return NotImplemented if o is None else _divmod_dim("//", self._poly, o)

    def __rfloordiv__(self, other):
        o = _dim_operand(other)
        return NotImplemented if o is None else _divmod_dim("//", o, self._poly)

    def __mod__(self, other):
        o = _dim_operand(other)
        return NotImplemented if o is None else _divmod_dim("%", self._poly, o)

    def __rmod__(self, other):
        o = _dim_operand(other)
        return NotImplemented if o is None else _divmod_dim("%", o, self._poly)

    # -- comparison -------------------------------------------------------
    def __eq__(self, other):
        try:
            return self._poly == _as_poly(other)
        except TypeError:
            return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        if self._hash is None:
            c = _poly_const(self._poly)
            self._hash = hash(c) if c is not None else hash(self._poly)
        return self._hash

    def __bool__(self):
        return self._poly != ()

    def __int__(self) -> int:
        raise TypeError(f"int({self!r}): conversions only supported for static dims")

    # -- queries ----------------------------------------------------------
    @property
    def parameters(self) -> Iterable[SymbolicDim]:
        """The symbolic dims this dim depends on."""
        names: dict[str, None] = {}
        _atoms_symbols(self._poly, names)
        return [SymbolicDim(n) for n in names]

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The concrete size once every symbol has a value in ``env``.

        Under ``jax.export`` the symbols are bound to JAX symbolic sizes, which
        stay symbolic (``int()`` of them would fail).
        """
        size = _eval_poly(self._poly, env)
        return size if _is_symbolic_size(size) else int(size)

    def to_jax(self, symbols: Mapping[str, Any]) -> Any:
        """This dim as a JAX shape-polymorphism expression over ``symbols``."""
        return _eval_poly(self._poly, symbols)

    def __str__(self) -> str:
        return _format_poly(self._poly)

    def __repr__(self) -> str:
        return f"Dim({str(self)!r})"

    def __reduce__(self):
        return (_from_poly, (self._poly,))

    def to_mlir(self):
        """This dim as an MLIR attribute: ``i64`` when static, else its text (``"batch * 2"``), which round-trips
        exactly.
        """
        return mlir_interop.int_attr(self.dim) if isinstance(self, StaticDim) else mlir_interop.string_attr(str(self))

    @staticmethod
    def from_mlir(attr) -> Dim:
        """Inverse of `to_mlir`."""
        value = mlir_interop.attr_value(attr)
        return StaticDim(value) if isinstance(value, int) else _dim_from_text(value)


_SYMBOL_NAME = re.compile(r"[a-zA-Z_]\w*")


class StaticDim(Dim):
    """A known size. ``int(StaticDim(3)) == 3``; compares equal to ints."""

    __slots__ = ()

    def __init__(self, dim: int | StaticDim):
        if dim is self:
            return
        if type(dim) is int and -(2**63) <= dim < 2**63:  # the common case, kept tight: shapes are built from ints
            self._init_poly(_const_poly(dim))
            return
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (numbers.Integral, StaticDim)):
            raise TypeError(
                f"StaticDim.__init__ only accepts int or StaticDim, got {type(dim).__name__} {dim!r}; use Dim(value) "
                "to convert any dim"
            )
        value = int(dim)
        # Negative static dims exist as intermediate algebra (x - 4 holds Dim(-4)); tensor types reject them.
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"StaticDim: {value} does not fit in a signed 64-bit dim")
        self._init_poly(_const_poly(value))

    @property
    def dim(self) -> int:
        """The size as an int."""
        return _poly_const(self._poly)  # type: ignore[return-value]

    def __int__(self) -> int:
        return self.dim

    def __index__(self) -> int:
        return self.dim

    def __lt__(self, other):
        return self.dim < int(other)

    def __le__(self, other):
        return self.dim <= int(other)

    def __gt__(self, other):
        return self.dim > int(other)

    def __ge__(self, other):
        return self.dim >= int(other)

    def __repr__(self) -> str:
        return f"Dim({self.dim})"


class SymbolicDim(Dim):
    """A named size known only at run time, e.g. ``SymbolicDim("batch")``."""

    __slots__ = ()

    def __init__(self, name: str | SymbolicDim):
        if name is self:
            return
        name = name.name if isinstance(name, SymbolicDim) else name
        if not isinstance(name, str):
            raise TypeError(
                f"SymbolicDim.__init__ only accepts str or SymbolicDim, got {type(name).__name__} {name!r}; use "
                "Dim(value) to convert any dim"
            )
        if not _SYMBOL_NAME.fullmatch(name):
            raise ValueError(
                f"SymbolicDim: Invalid name {name!r}: a symbolic dim's name must be an ASCII letter or '_' followed by "
                "word characters"
            )
        self._init_poly((((name,), 1),))

    @property
    def name(self) -> str:
        """The symbol's name."""
        return self._poly[0][0][0]


class AlgebraicDim(Dim):
    """An expression over symbolic dims, e.g. ``Dim("batch") * 5 + 1``."""

    __slots__ = ()

    def __init__(self, value: Any):
        if value is self:
            return
        if not isinstance(value, AlgebraicDim):
            raise TypeError(
                f"AlgebraicDim.__init__ only accepts AlgebraicDim, got {type(value).__name__} {value!r}; "
                "build expressions with dim arithmetic (Dim('x') * 2 + 1) or Dim(value)"
            )
        self._init_poly(value._poly)

    @classmethod
    def apply(cls, op: str, *operands: DimLike) -> Dim:
        """Combine ``operands`` with ``op`` (one of ``+ - * // %`` or ``add``,
        ``sub``, ``mul``, ``floordiv``, ``mod``, ``neg``)."""
        ops = {
            "+": lambda a, b: a + b, "add": lambda a, b: a + b,
            "-": lambda a, b: a - b, "sub": lambda a, b: a - b,
            "*": lambda a, b: a * b, "mul": lambda a, b: a * b,
            "//": lambda a, b: a // b, "floordiv": lambda a, b: a // b,
            "%": lambda a, b: a % b, "mod": lambda a, b: a % b,
        }  # fmt: skip
        dims = [Dim(o) for o in operands]
        if op in ("neg", "-") and len(dims) == 1:
            return -dims[0]
        if op not in ops or len(dims) < 2:
            raise ValueError(f"AlgebraicDim.apply: unsupported op {op!r} with {len(dims)} operands")
        out = dims[0]
        for d in dims[1:]:
            out = ops[op](out, d)
        return out

    @property
    def attr(self) -> Any:
        """The MLIR attribute of this expression (see `Dim.to_mlir`)."""
        return self.to_mlir()

    def __repr__(self) -> str:
        """MAX's form: each operand a ``Dim``, nested expressions in parentheses.

        Example:
            >>> Dim("n") // 4
            Dim('n') // Dim(4)
        """
        return _repr_dim_node(ast.parse(str(self), mode="eval").body)


_BINOP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%"}


def _repr_dim_node(node: ast.AST) -> str:
    def operand(n: ast.AST) -> str:
        text = _repr_dim_node(n)
        return f"({text})" if isinstance(n, ast.BinOp) else text

    if isinstance(node, ast.Name):
        return f"Dim({node.id!r})"
    if isinstance(node, ast.Constant):
        return f"Dim({node.value})"
    if isinstance(node, ast.UnaryOp):
        return f"-{operand(node.operand)}"
    assert isinstance(node, ast.BinOp), ast.dump(node)
    return f"{operand(node.left)} {_BINOP_TEXT[type(node.op)]} {operand(node.right)}"


_DIM_SYNTAX = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.FloorDiv,
    ast.Mod,
    ast.USub,
)


def _dim_from_text(text: str) -> Dim:
    """Evaluate dim text (``"batch * 2 + 1"``, as `str` prints it) with its symbols as `SymbolicDim`s."""
    tree = ast.parse(text, mode="eval")
    if not all(isinstance(node, _DIM_SYNTAX) for node in ast.walk(tree)):
        raise ValueError(f"Dim.from_mlir: {text!r} is not a dimension expression")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return Dim(eval(compile(tree, "<dim>", "eval"), {"__builtins__": {}}, {n: SymbolicDim(n) for n in names}))  # noqa: S307 - AST checked above


def _const_poly(v: int) -> _Poly:
    return (((), v),) if v else ()  # what _make_poly({(): v}) gives, without sorting one term


def _as_poly(value: Any) -> _Poly:
    if isinstance(value, Dim):
        return value._poly
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"expected a dimension, got bool {value!r}")
    if isinstance(value, (numbers.Integral, np.integer)):
        return _const_poly(int(value))
    if isinstance(value, str):
        return SymbolicDim(value)._poly
    raise TypeError(f"expected a dimension (int, str or Dim), got {type(value).__name__} {value!r}")


def _dim_operand(value: Any) -> _Poly | None:
    """``value`` as a polynomial if it is dim-like (int, str, Dim), else None."""
    if isinstance(value, (Dim, str)) or (
        isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))
    ):
        return _as_poly(value)
    return None


def _from_poly(poly: _Poly) -> Dim:
    c = _poly_const(poly)
    if c is not None:
        return StaticDim(c)
    if len(poly) == 1 and poly[0][1] == 1 and len(poly[0][0]) == 1 and isinstance(poly[0][0][0], str):
        return SymbolicDim(poly[0][0][0])
    d = object.__new__(AlgebraicDim)
    d._init_poly(poly)
    return d


def _divmod_dim(op: str, a: _Poly, b: _Poly) -> Dim:
    ca, cb = _poly_const(a), _poly_const(b)
    if cb == 0:
        raise ZeroDivisionError(f"dimension {op} by zero")
    if ca is not None and cb is not None:
        return StaticDim(ca // cb if op == "//" else ca % cb)
    if cb is not None and all(c % cb == 0 for _, c in a):
        # Exact division of every coefficient: (4*x + 8) // 4 == x + 2, and % is 0.
        return _from_poly(_make_poly({m: c // cb for m, c in a})) if op == "//" else StaticDim(0)
    return _from_poly(_make_poly({((op, a, b),): 1}))


def _to_dim(value: Any) -> Dim:
    if type(value) is int:
        return StaticDim(value)
    if isinstance(value, Dim):
        return value
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return StaticDim(int(value))
    if isinstance(value, str):
        return SymbolicDim(value)
    raise TypeError(f"Dim: expected int, str or Dim, got {type(value).__name__} {value!r}")


DimLike = int | str | Dim | np.integer


class Shape(list):
    """A list of `Dim`s. Compares equal to lists and tuples of ints/strings.

    Example:
        >>> s = Shape([2, "batch"])
        >>> s
        [Dim(2), Dim('batch')]
        >>> s == [2, "batch"] and s == (2, "batch")
        True
    """

    def __init__(self, dims: Iterable[DimLike] = ()):
        super().__init__(Dim(d) for d in dims)

    def __eq__(self, other):
        if isinstance(other, (list, tuple)):
            if len(self) != len(other):
                return False
            try:
                return all(a == Dim(b) for a, b in zip(self, other))
            except TypeError:
                return False
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]  # mutable, like list

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self)

    @property
    def static_dims(self) -> list[int]:
        """The sizes of the static dims, in order."""
        return [d.dim for d in self if isinstance(d, StaticDim)]

    @property
    def parameters(self) -> Iterable[SymbolicDim]:
        """Every symbolic dim used by this shape."""
        seen: dict[str, SymbolicDim] = {}
        for d in self:
            for p in d.parameters:
                seen.setdefault(p.name, p)
        return list(seen.values())

    @staticmethod
    def is_static(shape: Iterable[DimLike]) -> bool:
        """True if every dim is a `StaticDim`."""
        return all(isinstance(Dim(d), StaticDim) for d in shape)

    def to_mlir(self):
        """This shape as an MLIR array attribute of dims."""
        return mlir_interop.array_attr([Dim(d).to_mlir() for d in self])

    @classmethod
    def from_mlir(cls, attr) -> Shape:
        """Inverse of `to_mlir`."""
        return cls(Dim.from_mlir(a) for a in mlir_interop.array_items(attr))


ShapeLike = Iterable[DimLike]


def _is_symbolic_size(size: Any) -> bool:
    # Concrete sizes are numbers (int, numpy ints, Fractions); a jax.export
    # symbolic size (a _DimExpr) is not.
    return not isinstance(size, numbers.Number)


def evaluate_shape(shape: Iterable[Dim], env: Mapping[str, int]) -> tuple[int, ...]:
    """Concrete sizes of ``shape`` under the symbol binding ``env``."""
    return tuple(d.evaluate(env) if not isinstance(d, StaticDim) else d.dim for d in shape)


def bind_symbols(expected: Iterable[Dim], actual: Iterable[int], env: dict[str, int]) -> str | None:
    """Unify ``expected`` dims with the concrete ``actual`` sizes, filling ``env``.

    Returns an error message (naming the mismatching dim) or None on success.
    Bare symbols bind first; algebraic dims are then checked against the binding.
    """
    expected, actual = list(expected), list(actual)
    if len(expected) != len(actual):
        return f"expected rank {len(expected)}, got rank {len(actual)}"
    deferred = []
    for i, (d, n) in enumerate(zip(expected, actual)):
        if isinstance(d, StaticDim):
            if d.dim != n:
                return f"dim {i}: expected {d.dim}, got {n}"
        elif isinstance(d, SymbolicDim):
            bound = env.setdefault(d.name, n)
            if bound != n:
                return f"dim {i} ({d.name}): got {n}, but {d.name} is already {bound}"
        else:
            deferred.append((i, d, n))
    for i, d, n in deferred:
        try:
            want = d.evaluate(env)
        except UnboundDimError as e:
            return f"dim {i} ({d}): {e}"
        if want != n:
            return f"dim {i}: expected {d} = {want}, got {n}"
    return None
