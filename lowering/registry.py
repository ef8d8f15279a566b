"""The one op registry.

Every operation is an `OpDef`: its name, a shape/dtype *rule* (input types and
params → output types, raising MAX-style errors that name the op and the
offending shapes/dtypes) and a JAX *impl* (input arrays and params → output
arrays). Each op also has a *front*: the user-facing function with MAX's
signature, which parses arguments and calls `bind`. ``maxfx.graph.ops``,
``maxfx.functional``, and the ``Tensor``/``TensorValue`` operators are all built
from the fronts registered here; nothing else defines op math.

Example (the whole definition of an op)::

    relu_p = register(OpDef("relu", rule=rules.same_type(numeric=True),
                            impl=lambda x: jnp.maximum(x, 0)))

    @front(relu_p)
    def relu(x):
        '''Rectified linear unit, ``max(x, 0)``.'''
        return bind(relu_p, x)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpDef", "register", "get_op", "all_ops", "front", "fronts", "scoped_registrations", "OpError"]


@dataclass(eq=False)
class OpDef:
    """Definition of one op.

    Attributes:
        name: the op's MAX name (``"add"``, ``"conv2d"``...).
        rule: ``rule(*input_types, **params) -> Type | tuple[Type, ...]``.
        impl: ``impl(*arrays, **params) -> Array | tuple[Array, ...]`` using jnp/lax
            (or a custom_calls kernel). Dims in params are concrete ints by then.
        multiple_results: the rule/impl return tuples (e.g. ``split``, ``top_k``).
        promote: indices of inputs unified by MAX dtype promotion before the rule
            runs; Python scalars among them take the promoted dtype.
        mutates: indices of buffer inputs the op writes, or a function of the node
            giving them (ops whose number of written buffers varies per node);
            ``impl`` returns the new values of those buffers after its regular
            outputs, in input order.
        effect: the op has an observable side effect (printing): never dropped.
        differentiable: gradients are defined (used by the grad-check table).
        data_dependent: output dims depend on input *values* (``nonzero``), or a
            function of the node's params saying so per node; graphs containing
            such a node run op by op instead of as one jitted program.
        interpret: optional ``interpret(interp, node, args) -> outputs`` hook for ops
            that run nested blocks (``cond``, ``while_loop``, ``call``).
        immediate: on eager tensors the op runs at once instead of being recorded
            (its result depends on device state, or it acts: transfers, custom
            kernels). Ops that write buffers, have effects or data-dependent
            shapes are immediate too.
        cross_device: its inputs may live on different devices (collectives,
            transfers); other ops require one device, as MAX does.
        host_inputs: indices of inputs MAX reads on the host (a MoE kernel's
            usage stats): they may live on the CPU whatever device the op runs
            on; the op's program moves them to its device.
        check_values: optional ``check_values(*arrays, **params)`` run on the
            concrete input arrays before the op runs on realized eager tensors
            (``gather``'s index bounds); it raises on values the impl would
            silently accept. Never called under tracing (jit, graphs, ``lazy``).
    """

    name: str
    rule: Callable[..., Any]
    impl: Callable[..., Any] | None = None
    multiple_results: bool = False
    promote: Sequence[int] = ()
    mutates: Sequence[int] | Callable[[Any], Sequence[int]] = ()
    effect: bool = False
    differentiable: bool = True
    data_dependent: bool | Callable[[Any], bool] = False
    interpret: Callable[..., Any] | None = None
    immediate: bool = False
    cross_device: bool = False
    host_inputs: tuple[int, ...] = ()
    check_values: Callable[..., None] | None = None
    front: Callable[..., Any] | None = field(default=None, repr=False)

    def sizes_outputs_from_values(self, params: Any) -> bool:
        """True when this application's output dims depend on input values (see ``data_dependent``)."""
        return self.data_dependent(params) if callable(self.data_dependent) else self.data_dependent

    def written_inputs(self, node: Any) -> Sequence[int]:
        """Indices of the inputs of ``node`` (an IR node of this op) that it writes."""
        return self.mutates(node) if callable(self.mutates) else self.mutates

    def __repr__(self) -> str:
        return f"OpDef({self.name!r})"


class OpError(ValueError):
    """An op rejected its inputs (shape, dtype, rank or parameter error)."""


_REGISTRY: dict[str, OpDef] = {}
_FRONTS: dict[str, Callable[..., Any]] = {}


def register(op: OpDef) -> OpDef:
    """Add ``op`` to the registry (each name once)."""
    if op.name in _REGISTRY:
        raise ValueError(f"op {op.name!r} is already registered")
    _REGISTRY[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    """The registered op called ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op named {name!r} in the registry") from None


def all_ops() -> dict[str, OpDef]:
    """A copy of the registry: name → OpDef."""
    return dict(_REGISTRY)


def front(*ops: OpDef, name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as the user-facing function of ``ops`` (named ``name`` or ``fn.__name__``).

    A front may serve several ops (``max`` is both the elementwise and the
    reducing maximum) and an op may have no front of its own (``cast`` is
    reached through ``TensorValue.cast``).
    """

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        key = name or fn.__name__.rstrip("_")
        if key in _FRONTS:
            raise ValueError(f"front {key!r} is already registered")
        _FRONTS[key] = fn
        for op in ops:
            op.front = fn
        return fn

    return deco


def fronts() -> dict[str, Callable[..., Any]]:
    """User-facing op functions by MAX name (what ``maxfx.graph.ops`` exports)."""
    return dict(_FRONTS)


@contextlib.contextmanager
def scoped_registrations() -> Iterator[None]:
    """Ops and fronts registered inside the ``with`` block are removed when it ends.

    For trying out an op in a notebook or a test without leaving it in the
    process-wide registry (registering a name twice is an error).

    Example:
        >>> from lowering.ops import _rules as R
        >>> with scoped_registrations():
        ...     trial_p = register(OpDef("trial_identity", rule=R.unary("trial_identity"), impl=lambda x: x))
        ...     "trial_identity" in all_ops()
        True
        >>> "trial_identity" in all_ops()
        False
    """
    ops, fronts_ = set(_REGISTRY), set(_FRONTS)
    try:
        yield
    finally:
        for name in set(_REGISTRY) - ops:
            del _REGISTRY[name]
        for name in set(_FRONTS) - fronts_:
            del _FRONTS[name]
