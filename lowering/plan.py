"""Bind plans: what applying an op to inputs of given *kinds* does, worked out once.

Every context (graph building, eager recording, running on JAX arrays) binds an
op the same way: it describes each input by its *kind* and asks `bind_plan` for
the memoised `BindPlan` of ``(op, kinds, params)``. The plan says how each input
is converted (MAX dtype promotion, Python and numpy data made constants), what
the op's rule gives as output types (so shape and dtype errors are raised here,
at the call line), and a small integer signature naming the node for program
caches. The contexts differ only in what they do with the converted inputs:
record a node, record it to realize later, or run the implementation now.

A kind is the input's `Type` for typed values (graph values, eager tensors, JAX
arrays and tracers), the Python type for a Python scalar (the hot path:
``x * 2``), or a `WeakKind` for numpy scalars, numpy arrays and nested lists.

Example:
    >>> from lowering.registry import get_op
    >>> from lowering.types import TensorType
    >>> from lowering.dtypes import DType
    >>> import lowering.ops  # registers the ops
    >>> plan = bind_plan(get_op("add"), (TensorType(DType.int32, [3]), int), {})
    >>> plan.actions[1][0], plan.actions[1][1].name  # the 1 becomes an int32 constant
    ('weak', 'int32')
    >>> plan.out_types
    (TensorType(dtype=int32, shape=[Dim(3)], device=cpu:0),)
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.dims import Dim
from lowering.dtypes import DType, check_weak_array, promote_strong, promote_weak, result_dtype_for_python_scalar
from lowering.ir import holds_graph_values, param_key
from lowering.registry import OpDef, OpError
from lowering.types import DeviceRef, TensorType, Type

__all__ = [
    "BindPlan",
    "WeakKind",
    "bind_plan",
    "clear_plans",
    "coercion",
    "coercion_plan",
    "infer_types",
    "weak_kind",
    "weak_array",
    "is_weak",
    "signature",
    "check_devices",
    "converted_types",
    "first_device",
]

PYTHON_SCALARS = (bool, int, float)


@dataclass(frozen=True)
class WeakKind:
    """The kind of untyped data: numpy scalars and arrays, nested lists, `Dim`\\ s.

    Attributes:
        shape: the data's shape.
        dtype: the dtype it takes on its own (numpy keeps its dtype; Python
            lists give bool, int64 or float32, as MAX's constants do).
    """

    shape: tuple[int, ...]
    dtype: DType


def is_weak(x: Any) -> bool:
    """True for Python/numpy data that is not a typed graph/tensor value."""
    # The attribute test first: it settles every tensor and graph value cheaply (isinstance
    # against the numbers ABC is the slow part, and tensors are what every eager op sees).
    return not hasattr(x, "__lowering_context__") and isinstance(
        x, (numbers.Number, np.ndarray, np.generic, list, tuple, Dim)
    )


def weak_kind(x: Any) -> type | WeakKind:
    """The kind of untyped input ``x`` (see the module docstring)."""
    if x.__class__ in PYTHON_SCALARS:
        return x.__class__
    if isinstance(x, Dim):
        return int
    if isinstance(x, np.generic):
        return WeakKind((), DType.from_numpy(x.dtype))
    if isinstance(x, numbers.Number):
        return float if isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral) else int
    arr = np.asarray(x)
    if isinstance(x, np.ndarray):
        return WeakKind(arr.shape, DType.from_numpy(arr.dtype))
    if arr.dtype == np.bool_:
        dtype = DType.bool
    elif np.issubdtype(arr.dtype, np.integer):
        dtype = DType.int64
    elif np.issubdtype(arr.dtype, np.floating):
        dtype = DType.float32
    else:
        dtype = DType.from_numpy(arr.dtype)
    return WeakKind(arr.shape, dtype)


def _weak_type(kind: Any, dtype: DType, device: DeviceRef) -> TensorType:
    shape = () if isinstance(kind, type) else kind.shape
    return TensorType(dtype, shape, device)


def _default_dtype(kind: Any) -> DType:
    if isinstance(kind, type):
        return result_dtype_for_python_scalar(kind())
    return kind.dtype


def coercion_plan(op: OpDef, types: Sequence[Type | None]) -> tuple[Any, ...]:
    """How each input of ``op`` is converted, from the input types alone.

    ``types[i]`` is None for untyped Python/numpy data. Returns one action per
    input: None (use as is), ``("cast", dtype)`` (a typed input promoted to
    ``dtype``), ``("weak", dtype)`` (data that must fit ``dtype``) or
    ``("default", None)`` (data outside the promoted inputs: a constant of its
    own dtype).

    Raises:
        TypeError: no typed operand among the promoted inputs.
        OpError: typed operands whose dtypes MAX does not promote (int32 + float32).
    """
    actions: list[Any] = [None] * len(types)
    promote = [i for i in op.promote if i < len(types)]
    if promote:
        strong = [i for i in promote if types[i] is not None]
        if not strong:
            raise TypeError(f"{op.name}: Binary ops require at least one max object (a tensor or graph value)")
        target = types[strong[0]].dtype
        for i in strong[1:]:
            try:
                target = promote_strong(target, types[i].dtype)
            except ValueError as e:
                shapes = ", ".join(
                    f"{types[j].dtype.name}[{', '.join(str(d) for d in types[j].shape)}]" for j in strong
                )
                raise OpError(f"{op.name}: incompatible input dtypes ({shapes}): {e}") from None
        for i in promote:
            if types[i] is None:
                actions[i] = ("weak", target)
            elif types[i].dtype is not target:
                actions[i] = ("cast", target)
    for i, t in enumerate(types):
        if t is None and actions[i] is None:
            actions[i] = ("default", None)
    return tuple(actions)


# ─── Type inference ───────────────────────────────────────────────────────

_RULE_CACHE: dict[tuple, tuple[Type, ...]] = {}
_CACHE_LIMIT = 65536


def _run_rule(op: OpDef, types: Sequence[Type], params: dict[str, Any]) -> tuple[Type, ...]:
    out = op.rule(*types, **params)
    if out is None:
        return ()
    if isinstance(out, Type):
        if op.multiple_results:
            raise TypeError(f"rule of {op.name} must return a tuple of types")
        return (out,)
    return tuple(out)


def infer_types(op: OpDef, types: Sequence[Type], params: dict[str, Any]) -> tuple[Type, ...]:
    """Output types of ``op`` (memoised on op, input types and params).

    Params that can only be keyed by identity (callables, blocks holding
    closures) bypass the memo.
    """
    if holds_graph_values(params):
        return _run_rule(op, types, params)
    try:
        key = (op.name, tuple(t.key() for t in types), param_key(params))
        cached = _RULE_CACHE.get(key)
    except (TypeError, AttributeError):
        return _run_rule(op, types, params)
    if cached is None:
        cached = _run_rule(op, types, params)
        if len(_RULE_CACHE) > _CACHE_LIMIT:
            _RULE_CACHE.clear()
        _RULE_CACHE[key] = cached
    return cached


# ─── Signatures ───────────────────────────────────────────────────────────

_signatures: dict[tuple, int] = {}
_next_signature = itertools.count()


def signature(op: OpDef, params: dict[str, Any], out_types: Sequence[Type]) -> int:
    """A small int naming a node's (op, params, output types), for program cache keys.

    Numbers are never reused: when the table is trimmed, a signature seen again
    gets a fresh number (a program cache miss, never a false hit).
    """
    sig = (op.name, param_key(params), tuple(t.key() for t in out_types))
    n = _signatures.get(sig)
    if n is None:
        if len(_signatures) > _CACHE_LIMIT:
            _signatures.clear()
        n = _signatures[sig] = next(_next_signature)
    return n


# ─── Plans ────────────────────────────────────────────────────────────────


_HOST = DeviceRef.CPU()


def check_devices(op: OpDef, kinds: Sequence[Any]) -> None:
    """MAX's rule that an op's tensor inputs share one device (collectives and transfers exempt, host inputs may be on
    the CPU).
    """
    if op.cross_device:
        return
    types = [
        k
        for i, k in enumerate(kinds)
        if isinstance(k, Type) and not (i in op.host_inputs and getattr(k, "device", None) == _HOST)
    ]
    if len(types) < 2:
        return
    first = getattr(types[0], "device", None)
    for t in types[1:]:
        d = getattr(t, "device", first)
        if d != first:
            raise ValueError(
                f"{op.name}: inputs are on different devices ({first} and {d}); they must be on the same device: move "
                "one with `.to(device)` first"
            )


def first_device(types: Sequence[Type]) -> DeviceRef | None:
    """The device of the first typed input: where constants among the inputs go."""
    return next((t.device for t in types if hasattr(t, "device")), None)


def converted_types(kinds: Sequence[Any], actions: Sequence[Any], device: DeviceRef | None) -> tuple[Type, ...]:
    """The types of inputs of ``kinds`` once converted as ``actions`` say."""
    device = device or DeviceRef.CPU()
    out: list[Type] = []
    for k, act in zip(kinds, actions):
        if act is None:
            out.append(k)
        elif act[0] == "cast":
            out.append(TensorType(act[1], k.shape, k.device))
        elif act[0] == "weak":
            out.append(_weak_type(k, act[1], device))
        else:
            out.append(_weak_type(k, _default_dtype(k), device))
    return tuple(out)


def coercion(op: OpDef, kinds: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Type, ...], DeviceRef | None]:
    """(conversion actions, converted input types, device for constants) of inputs of ``kinds``."""
    types = [k if isinstance(k, Type) else None for k in kinds]
    actions = coercion_plan(op, types)
    device = first_device([t for t in types if t is not None])
    return actions, converted_types(kinds, actions, device), device


class BindPlan:
    """What binding an op to inputs of given kinds does.

    Attributes:
        actions: per input, None, ``("cast", dtype)``, ``("weak", dtype)`` or
            ``("default", None)`` (see `coercion_plan`).
        in_types: the input types after conversion.
        out_types: the op's output types (its rule has run).
        device: the device of the first typed input (constants go there), or None.
        converts: some input is converted (an action is not None).
        signature: see `signature`.
        immediate: an eager binding runs at once instead of recording (the op
            writes buffers, acts, has data-dependent shapes, or reads device state).
        single: exactly one output and not a multiple-results op.
        entry: set by eager execution once it has run this binding as a one-op
            program whose inputs the kinds pin (static shapes): that program's
            C++ entry, so the next call with the same kinds and params runs it
            without planning or cache keys (see `lowering.eager`). None until then.
    """

    __slots__ = ("actions", "converts", "in_types", "out_types", "device", "signature", "immediate", "single", "entry")

    def __init__(self, op: OpDef, kinds: Sequence[Any], params: dict[str, Any]):
        self.actions, self.in_types, self.device = coercion(op, kinds)
        self.converts = any(a is not None for a in self.actions)
        check_devices(op, kinds)
        self.out_types = infer_types(op, self.in_types, params)
        self.signature = signature(op, params, self.out_types)
        self.immediate = bool(op.immediate or op.mutates or op.effect or op.sizes_outputs_from_values(params))
        self.single = len(self.out_types) == 1 and not op.multiple_results
        self.entry: Any = None


_plans: dict[tuple, BindPlan] = {}


def clear_plans() -> None:
    """Forget every memoised `BindPlan` (and so every program entry eager execution kept on one)."""
    _plans.clear()


_PLAIN_PARAM_TYPES = frozenset({int, str, type(None), DType})


def _plain_params_key(params: dict[str, Any]) -> tuple | None:
    """``params``' items as a key when every value is an int, str, None or `DType` (``axis=-1``), else None.

    Such values hash and compare by value, and none equals a value of another of
    these types (unlike ``True == 1 == 1.0``), so the items themselves are a key:
    the common case skips `param_key`'s tagging walk. The result never equals a
    `param_key` result (those start with a tag string).
    """
    for v in params.values():
        if v.__class__ not in _PLAIN_PARAM_TYPES:
            return None
    return tuple(params.items())


def bind_plan(op: OpDef, kinds: Sequence[Any], params: dict[str, Any]) -> BindPlan:
    """The memoised `BindPlan` of ``op`` over inputs of ``kinds`` with ``params``.

    Params holding graph values (nested blocks, vars) or only hashable by
    identity are planned afresh each time.
    """
    params_key = _plain_params_key(params) if params else ()
    if params_key is None:
        if holds_graph_values(params):
            return BindPlan(op, kinds, params)
        params_key = param_key(params)
    try:
        key = (op, *kinds, params_key)
        plan = _plans.get(key)
    except TypeError:  # a param only hashable by identity
        return BindPlan(op, kinds, params)
    if plan is None:
        plan = BindPlan(op, kinds, params)
        if len(_plans) > _CACHE_LIMIT // 8:
            _plans.clear()
        _plans[key] = plan
    return plan


def weak_array(op_name: str, x: Any, dtype: DType, *, promoted: bool) -> np.ndarray:
    """Untyped input ``x`` as a numpy array of ``dtype`` (its converted type's dtype).

    ``promoted``: ``dtype`` comes from MAX promotion (a ``"weak"`` action), so
    the data must fit it: a scalar's *value* must be representable, an array
    must not be float data going into an integer dtype nor ints outside the
    dtype's range (`lowering.dtypes.check_weak_array`). Otherwise ``dtype`` is
    the data's own default dtype.

    Raises:
        OpError: a value that does not fit the promoted dtype (``int32`` op with 1.5,
            ``int8`` op with ``np.array([1000, 1])``).
    """
    if isinstance(x, Dim):
        x = int(x)
    if not promoted:
        return _cast(x, dtype)
    try:
        if isinstance(x, (numbers.Number, np.generic)):
            promote_weak(dtype, x)
            return _cast(x, dtype)
        arr = np.asarray(x)
        check_weak_array(dtype, arr)
        return _cast(arr, dtype)
    except ValueError as e:
        raise OpError(f"{op_name}: {e}") from None


def _cast(x: Any, dtype: DType) -> np.ndarray:
    # A float too large for a float dtype rounds to inf (f16 * 1e10), as in MAX: not a warning.
    with np.errstate(over="ignore"):
        return np.asarray(x).astype(dtype.to_numpy())
