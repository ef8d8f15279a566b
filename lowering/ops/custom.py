"""Custom ops: a registry of Python/JAX kernels, invoked by name with ``custom``/``inplace_custom``.

MAX runs custom ops from Mojo kernel libraries (``@compiler.register``). maxfx
cannot run Mojo; instead a custom op is a JAX-traceable Python function
registered under the op name::

    register_custom_op("add_one", lambda x: x + 1)
    [y] = ops.custom("add_one", DeviceRef.CPU(), [x], [x.type])

The function gets one array per value (buffers as their current contents) and
the ``parameters`` mapping as keyword arguments; it may use jnp/lax or a Pallas
kernel. For ``inplace_custom`` it returns its regular outputs followed by the
new contents of each buffer argument.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from lowering.context import GraphBuilder, coerce_inputs, find_context, type_of
from lowering.custom_ops_path import load_environment, mojo_note
from lowering.dims import StaticDim
from lowering.dtypes import DType
from lowering.ir import Var
from lowering.ops._rules import OpError, fmt, fmt_all
from lowering.ops.control_flow import mutates_from
from lowering.registry import OpDef, front, register
from lowering.types import BufferType, DeviceRef, TensorType, Type
from lowering.x64 import traced

__all__ = [
    "register_custom_op",
    "lookup_custom_op",
    "custom_op_names",
    "custom_kernel",
    "CustomOp",
    "CustomOpNotFoundError",
    "custom",
    "inplace_custom",
]


@dataclass(frozen=True, eq=False)
class CustomOp:
    """A registered custom op.

    Attributes:
        name: the op name used by ``ops.custom``/``ops.inplace_custom``.
        fn: ``fn(*arrays, **parameters) -> array | tuple of arrays`` (JAX-traceable).
        out_types: default output types when a call passes none: a sequence of
            Types, or ``out_types(input_types, parameters) -> sequence of Types``.
        version: registration number; graphs keep calling the function that was
            registered when they were built, even if the name is re-registered.
    """

    name: str
    fn: Callable[..., Any]
    out_types: Sequence[Type] | Callable[..., Sequence[Type]] | None
    version: int


class CustomOpNotFoundError(ValueError, KeyError):
    """No custom op is registered under the requested name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


_lock = threading.Lock()
_versions = itertools.count(1)
_BY_NAME: dict[str, CustomOp] = {}
_BY_VERSION: dict[int, CustomOp] = {}


def register_custom_op(
    name: str,
    fn: Callable[..., Any] | None = None,
    *,
    out_types: Sequence[Type] | Callable[..., Sequence[Type]] | None = None,
) -> Any:
    """Register ``fn`` as the custom op ``name`` (re-registering replaces it for new graphs).

    Args:
        name: the name passed to ``ops.custom`` / ``ops.inplace_custom``.
        fn: ``fn(*arrays, **parameters)`` returning an array or a tuple of
            arrays, using jax.numpy/lax (or Pallas): it runs under ``jax.jit``.
            Omit it to use ``register_custom_op(name)`` as a decorator.
        out_types: optional default output types, used when a call passes
            ``out_types=None``: a list of Types, or a function
            ``(input_types, parameters) -> list of Types``.

    Returns:
        ``fn`` (so the function stays usable directly).

    Example:
        >>> import numpy as np
        >>> from lowering.ops.custom import register_custom_op
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> @register_custom_op("example.scale")
        ... def scale(x, *, factor):
        ...     return x * factor
        >>> t = TensorType(DType.float32, [3], DeviceRef.CPU())
        >>> with Graph("g", input_types=[t]) as g:
        ...     [y] = ops.custom("example.scale", DeviceRef.CPU(), [g.inputs[0]], [t], parameters={"factor": 3})
        ...     g.output(y)
        >>> InferenceSession().load(g).execute(np.array([1.0, 2.0, 3.0], np.float32))[0].to_numpy()
        array([3., 6., 9.], dtype=float32)
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_custom_op: name must be a non-empty str, got {name!r}")
    if fn is None:
        return lambda f: register_custom_op(name, f, out_types=out_types)
    if not callable(fn):
        raise TypeError(f"register_custom_op: fn for {name!r} must be callable, got {type(fn).__name__}")
    if out_types is not None and not callable(out_types):
        out_types = tuple(out_types)
        for i, t in enumerate(out_types):
            if not isinstance(t, Type):
                raise TypeError(
                    f"register_custom_op: out_types[{i}] for {name!r} must be a Type, got {type(t).__name__}"
                )
    with _lock:
        entry = CustomOp(name, fn, out_types, next(_versions))
        _BY_NAME[name] = entry
        _BY_VERSION[entry.version] = entry
    return fn


def custom_op_names() -> list[str]:
    """Names of the registered custom ops, sorted (MAX kernels that registry ops provide included)."""
    return sorted(set(_BY_NAME) | set(_KERNELS))


# MAX kernel-library ops that maxfx provides as registry ops of their own
# (``advanced_indexing_getitem``...): name -> (fn(values, out_types, parameters) -> outputs, inplace).
_KERNELS: dict[str, tuple[Callable[..., list[Any]], bool]] = {}


def custom_kernel(
    name: str, *, inplace: bool = False
) -> Callable[[Callable[..., list[Any]]], Callable[..., list[Any]]]:
    """Make ``ops.custom(name, ...)`` (``ops.inplace_custom`` if ``inplace``) call a registry op instead of a custom
    function.

    For MAX's own kernels that maxfx defines once in the op registry: the
    decorated ``fn(values, out_types, parameters)`` binds that op with MAX's
    argument conventions and returns the outputs. A function registered with
    `register_custom_op` under the same name takes precedence.

    Example:
        >>> from lowering.ops.custom import custom_op_names
        >>> "advanced_indexing_getitem" in custom_op_names()
        True
    """

    def deco(fn: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
        _KERNELS[name] = (fn, inplace)
        return fn

    return deco


def _kernel(name: str, inplace: bool) -> Callable[..., list[Any]] | None:
    """The registry-op kernel for ``name`` if no custom function overrides it."""
    entry = _KERNELS.get(name) if isinstance(name, str) and name not in _BY_NAME else None
    if entry is None:
        return None
    fn, is_inplace = entry
    if is_inplace != inplace:
        use = "ops.inplace_custom" if is_inplace else "ops.custom"
        raise TypeError(f"{'inplace_custom' if inplace else 'custom'}: MAX kernel {name!r} is called with {use}")
    return fn


def lookup_custom_op(name: str) -> CustomOp:
    """The custom op registered as ``name``.

    Raises:
        CustomOpNotFoundError: (a ValueError and KeyError) listing the known ops.
    """
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        pass
    load_environment()  # Python custom ops in CUSTOM_OPS_PATH register themselves when imported
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        known = ", ".join(repr(n) for n in custom_op_names()) or "none"
        raise CustomOpNotFoundError(
            f"custom op {name!r} is not registered (registered custom ops: {known}). "
            "maxfx cannot run Mojo kernels from MAX kernel libraries; register a JAX implementation with "
            f"lowering.ops.custom.register_custom_op({name!r}, fn)" + mojo_note()
        ) from None


# ─── shared checks ────────────────────────────────────────────────────────


def _freeze_parameters(op: str, parameters: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    if parameters is None:
        return ()
    if not isinstance(parameters, Mapping):
        raise TypeError(
            f"{op}: parameters must be a mapping of str to bool/int/str/DType, got {type(parameters).__name__}"
        )
    items = []
    for k, v in parameters.items():
        if not isinstance(k, str):
            raise TypeError(f"{op}: parameter names must be str, got {k!r}")
        if not isinstance(v, (bool, int, float, str, DType)):
            raise TypeError(f"{op}: parameter {k!r} must be a bool, int, float, str or DType, got {type(v).__name__}")
        items.append((k, v))
    return tuple(sorted(items))


def _resolve_out_types(
    op: str, entry: CustomOp, out_types: Any, in_types: list[Type], parameters: dict[str, Any], required: bool
) -> tuple[Type, ...]:
    if out_types is None:
        if callable(entry.out_types):
            out_types = entry.out_types(list(in_types), dict(parameters))
        elif entry.out_types is not None:
            out_types = entry.out_types
        elif required:
            raise TypeError(
                f"{op}: out_types is required for custom op {entry.name!r} (it was registered without default "
                "out_types)"
            )
        else:
            out_types = ()
    if isinstance(out_types, Type):
        out_types = [out_types]
    out = tuple(out_types)
    for i, t in enumerate(out):
        if not isinstance(t, (TensorType, BufferType)):
            raise TypeError(f"{op}: out_types[{i}] must be a TensorType, got {type(t).__name__} {t!r}")
    return out


def _static(t: Type) -> bool:
    return isinstance(t, (TensorType, BufferType)) and t.is_static()


def _check_abstract(
    op: str, entry: CustomOp, in_types: Sequence[Type], parameters: dict[str, Any], expected: Sequence[Type]
) -> None:
    """Trace ``fn`` on abstract inputs (when every shape is static) and compare with ``expected``."""
    if not all(_static(t) for t in (*in_types, *expected)):
        return
    args = [jax.ShapeDtypeStruct(tuple(int(d) for d in t.shape), t.dtype.to_numpy()) for t in in_types]
    try:
        res = traced(jax.eval_shape, lambda *a: _as_tuple(entry.fn(*a, **parameters)), *args)
    except Exception as e:  # the user's function failed: report it at the call site
        raise OpError(
            f"{op}: custom op {entry.name!r} failed on inputs ({fmt_all(in_types)}): {type(e).__name__}: {e}"
        ) from e
    _compare(op, entry.name, [(tuple(r.shape), DType.from_numpy(r.dtype)) for r in res], expected)


def _compare(op: str, name: str, got: list[tuple[tuple[int, ...], DType]], expected: Sequence[Type]) -> None:
    if len(got) != len(expected):
        raise OpError(
            f"{op}: custom op {name!r} returned {len(got)} value(s) but {len(expected)} were expected "
            f"({fmt_all(expected)})"
        )
    for i, ((shape, dtype), t) in enumerate(zip(got, expected)):
        # Symbolic dims of the expected type match any size here; they are bound when the graph runs.
        static_ok = len(shape) == t.rank and all(
            not isinstance(d, StaticDim) or d.dim == n for d, n in zip(t.shape, shape)
        )
        if dtype is not t.dtype or not static_ok:
            raise OpError(f"{op}: custom op {name!r} output {i} is {dtype.name}{list(shape)} but {fmt(t)} was expected")


def _as_tuple(res: Any) -> tuple[Any, ...]:
    if res is None:
        return ()
    if isinstance(res, (tuple, list)):
        return tuple(res)
    return (res,)


def _prepare(op: str, values: Sequence[Any]) -> tuple[Any, list[Any]]:
    values = list(values)
    ctx = find_context(op, values)
    return ctx, coerce_inputs(ctx, custom_p, values)


def _type(ctx: Any, x: Any) -> Type:
    return x.type if isinstance(x, Var) else type_of(ctx, x)


# ─── custom ───────────────────────────────────────────────────────────────


def _custom_rule(
    *types: Type, name: str, version: int, device: DeviceRef, out_types: tuple[Type, ...], parameters: tuple
) -> tuple[Type, ...]:
    for i, t in enumerate(types):
        if isinstance(t, BufferType):
            raise TypeError(
                f"custom: value {i} is a buffer ({fmt(t)}); custom ops that write buffers must use ops.inplace_custom"
            )
    return tuple(out_types)


def _run(entry: CustomOp, arrays: Sequence[Any], parameters: tuple, expected: Sequence[Type]) -> tuple[Any, ...]:
    res = _as_tuple(entry.fn(*arrays, **dict(parameters)))
    res = tuple(jnp.asarray(r) for r in res)
    _compare("custom", entry.name, [(tuple(r.shape), DType.from_numpy(r.dtype)) for r in res], expected)
    return res


def _custom_impl(*arrays, name: str, version: int, device: DeviceRef, out_types: tuple[Type, ...], parameters: tuple):
    return _run(_BY_VERSION[version], arrays, parameters, out_types)


custom_p = register(
    OpDef("custom", rule=_custom_rule, impl=_custom_impl, multiple_results=True, differentiable=False, immediate=True)
)


@front(custom_p)
def custom(
    name: str,
    device: Any,
    values: Sequence[Any],
    out_types: Sequence[Type] | None,
    parameters: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Apply the custom op registered as ``name`` (see `register_custom_op`) to ``values``.

    Args:
        name: the registered op name.
        device: the `DeviceRef` (or driver Device) the op runs on.
        values: the op's tensor arguments (buffers need `inplace_custom`).
        out_types: one `TensorType` per output (None: the defaults given at
            registration).
        parameters: extra keyword arguments for the function (bool/int/str/DType).

    Returns:
        One value per entry of ``out_types``.

    Raises:
        ValueError: ``name`` is not registered (maxfx cannot run Mojo kernels),
            or the function's outputs do not match ``out_types``.
        TypeError: a value is a buffer.

    Example:
        >>> import numpy as np
        >>> import jax.numpy as jnp
        >>> from lowering.ops.custom import register_custom_op
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> _ = register_custom_op("example.add_one", lambda x: x + 1)
        >>> _ = register_custom_op("example.min_max", lambda x: (jnp.min(x, axis=-1), jnp.max(x, axis=-1)))
        >>> with Graph("g", input_types=[TensorType(DType.float32, [2, 3], DeviceRef.CPU())]) as g:
        ...     x = g.inputs[0]
        ...     [y] = ops.custom("example.add_one", DeviceRef.CPU(), [x], [x.type])
        ...     row = TensorType(DType.float32, [2], DeviceRef.CPU())
        ...     lo, hi = ops.custom("example.min_max", DeviceRef.CPU(), [y], [row, row])
        ...     g.output(lo, hi)
        >>> [t.to_numpy().tolist() for t in InferenceSession().load(g).execute(np.array([[1.0, 5.0, 3.0], [0.0, -2.0,
        ...     4.0]], np.float32))]
        [[2.0, -1.0], [6.0, 5.0]]
    """
    kernel = _kernel(name, inplace=False)
    if kernel is not None:
        return list(kernel(list(values), out_types, dict(parameters or {})))
    entry = lookup_custom_op(name)
    for i, v in enumerate(values):
        if isinstance(getattr(v, "type", None), BufferType):
            raise TypeError(
                f"custom: value {i} is a buffer ({fmt(v.type)}); custom ops that take buffers to update in place must "
                "use ops.inplace_custom"
            )
    device = DeviceRef.from_device(device)
    params = _freeze_parameters("custom", parameters)
    ctx, vals = _prepare("custom", values)
    in_types = [_type(ctx, v) for v in vals]
    types = _resolve_out_types("custom", entry, out_types, in_types, dict(params), required=True)
    _check_abstract("custom", entry, in_types, dict(params), types)
    outs = ctx.bind(
        custom_p,
        vals,
        {"name": name, "version": entry.version, "device": device, "out_types": types, "parameters": params},
    )
    return list(outs)


# ─── inplace_custom ─────────────────────────────────────────────────────────


def _inplace_rule(
    *types: Type,
    name: str,
    version: int,
    device: DeviceRef,
    out_types: tuple[Type, ...],
    parameters: tuple,
    n_buffers: int,
) -> tuple[Type, ...]:
    if not any(isinstance(t, BufferType) for t in types[:n_buffers]):
        raise TypeError("inplace_custom: expected at least one BufferValue among the values")
    return tuple(out_types)


def _inplace_impl(
    *arrays, name: str, version: int, device: DeviceRef, out_types: tuple[Type, ...], parameters: tuple, n_buffers: int
):
    bufs = arrays[:n_buffers]
    buf_types = [TensorType(DType.from_numpy(b.dtype), b.shape) for b in bufs]
    res = _run(_BY_VERSION[version], arrays[n_buffers:], parameters, (*out_types, *buf_types))
    return res


inplace_custom_p = register(
    OpDef(
        "inplace_custom",
        rule=_inplace_rule,
        impl=_inplace_impl,
        multiple_results=True,
        mutates=mutates_from(0),
        differentiable=False,
        immediate=True,
    )
)


@front(inplace_custom_p)
def inplace_custom(
    name: str,
    device: Any,
    values: Sequence[Any],
    out_types: Sequence[Type] | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Apply the registered custom op ``name``, which updates its buffer arguments in place.

    The registered function receives every value (buffers as their current
    contents) and returns its ``out_types`` outputs followed by the new contents
    of each buffer argument, in order (just the new contents when there are no
    outputs; a bare array when there is one buffer).

    Args:
        name: the registered op name.
        device: the `DeviceRef` (or driver Device) the op runs on.
        values: the arguments; at least one must be a `BufferValue`.
        out_types: types of the regular outputs (None: none, or the defaults
            given at registration).
        parameters: extra keyword arguments for the function.

    Returns:
        The regular outputs (usually an empty list).

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from lowering.ops.custom import register_custom_op
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> _ = register_custom_op("example.increment", lambda b: b + 1)
        >>> with Graph("g", input_types=[BufferType(DType.int32, [2], DeviceRef.CPU())]) as g:
        ...     buf = g.inputs[0]
        ...     ops.inplace_custom("example.increment", device=buf.device, values=[buf])  # no regular outputs
        ...     g.output()
        []
        >>> counter = Tensor.from_numpy(np.array([0, 41], np.int32))
        >>> _ = InferenceSession().load(g).execute(counter)
        >>> counter.to_numpy()
        array([ 1, 42], dtype=int32)
    """
    kernel = _kernel(name, inplace=True)
    if kernel is not None:
        if out_types:  # MAX's in-place kernels only write their buffers
            raise TypeError(f"inplace_custom: kernel {name!r} has no outputs, got out_types {list(out_types)}")
        return list(kernel(list(values), out_types, dict(parameters or {})))
    entry = lookup_custom_op(name)
    values = list(values)
    if not any(isinstance(getattr(v, "type", None), BufferType) for v in values):
        raise TypeError(
            f"inplace_custom: expected at least one BufferValue among the values of {name!r}, got "
            f"({', '.join(type(v).__name__ for v in values)})"
        )
    device = DeviceRef.from_device(device)
    params = _freeze_parameters("inplace_custom", parameters)
    ctx, vals = _prepare("inplace_custom", values)
    if not isinstance(ctx, GraphBuilder):
        raise TypeError("inplace_custom: buffers exist only in a Graph being built")
    in_types = [_type(ctx, v) for v in vals]
    types = _resolve_out_types("inplace_custom", entry, out_types, in_types, dict(params), required=False)
    bufs = [v for v, t in zip(vals, in_types) if isinstance(t, BufferType)]
    buf_types = [t for t in in_types if isinstance(t, BufferType)]
    _check_abstract("inplace_custom", entry, in_types, dict(params), [*types, *buf_types])
    outs = ctx.bind(
        inplace_custom_p,
        [*bufs, *vals],
        {
            "name": name,
            "version": entry.version,
            "device": device,
            "out_types": types,
            "parameters": params,
            "n_buffers": len(bufs),
        },
    )
    return list(outs)
