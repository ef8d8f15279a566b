"""Creation ops: ``range``, ``hann_window`` and ``constant_external``.

(``constant`` lives in `lowering.ops.core`.)

``range`` with Python numbers (or dims) has a length known while the graph is
built; with tensor bounds its length is the ``out_dim`` you name, checked
against the values when they are known (outside ``jax.jit``).
``constant_external`` records a ``weight`` node: a named value bound at load
time from ``weights_registry``.
"""

from __future__ import annotations

import builtins
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.context import GraphBuilder, bind, current_context
from lowering.dims import Dim, StaticDim, bind_symbols
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.ops._indexing_util import DataDim, dtype_of, is_value
from lowering.ops.core import weight_p
from lowering.registry import OpDef, front, register
from lowering.types import DeviceRef, TensorType

__all__ = ["range", "hann_window", "constant_external"]


def _default_device(device: Any) -> DeviceRef:
    if device is not None:
        return DeviceRef.from_device(device)
    return getattr(current_context(), "default_device", None) or DeviceRef.CPU()


# ─── range ────────────────────────────────────────────────────────────────


def _range_len(op: str, start: Any, stop: Any, step: Any) -> int:
    """Number of elements of ``range(start, stop, step)`` (MAX's restrictions checked)."""
    if step == 0:
        raise ValueError(f"{op}: step must be non-zero")
    if (stop - start) * step < 0:
        raise ValueError(f"{op}: stop - start ({stop} - {start}) must be zero or have the sign of step ({step})")
    if all(isinstance(v, (int, np.integer)) for v in (start, stop, step)):
        return int(-(-(stop - start) // step))
    return int(math.ceil((stop - start) / step))


def _dim_len(start: Dim, stop: Dim, step: int) -> Dim:
    span, k = (stop - start, step) if step > 0 else (start - stop, -step)
    return span if k == 1 else (span + (k - 1)) // k


def _range_rule(
    *vals, start: Any, stop: Any, step: Any, out_dim: DataDim, dtype: DType, device: DeviceRef
) -> TensorType:
    op = "range"
    ts = [R.require_tensor(op, v, name) for v, name in zip(vals, ("start", "stop", "step"))]
    for t, name in zip(ts, ("start", "stop", "step")):
        if t.rank != 0:
            # MAX's wording.
            raise R.OpError(f"range expected scalar values as inputs! {name} must be a scalar (rank 0), got {R.fmt(t)}")
        if t.device != DeviceRef.CPU():
            raise R.OpError(f"{op}: Range input values must be on CPU; {name} is {R.fmt(t)} on {t.device}")
    if len({t.dtype for t in ts}) > 1:
        raise R.OpError(f"{op}: start, stop and step must have the same dtype, got {R.fmt_all(ts)}")
    if not isinstance(dtype, DType):
        raise TypeError(f"{op}: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    if dtype is DType.bool:
        raise R.OpError(f"{op}: dtype must be numeric, got bool")
    _check_length(out_dim.dim)
    return TensorType(dtype, [out_dim.dim], device)


_INT64_MAX = 2**63 - 1


def _check_length(n: Any) -> None:
    """A static length must fit int64 (MAX's dims are int64)."""
    size = n.dim if isinstance(n, StaticDim) else n
    if isinstance(size, int) and size > _INT64_MAX:
        raise ValueError(f"range: the length {size} exceeds the int64 maximum {_INT64_MAX}")


def _acc_dtype(dtype: DType) -> Any:
    return jnp.float64 if dtype.is_float() else jnp.int64


def _range_apply(vals, params: dict[str, Any], env: dict[str, int]):
    op = "range"
    dtype: DType = params["dtype"]
    out_dim: DataDim = params["out_dim"]
    n = out_dim.evaluate(env)
    acc = _acc_dtype(dtype)
    if vals:
        start, stop, step = (jnp.reshape(v, ()) for v in vals)
        if not any(isinstance(v, jax.core.Tracer) for v in (start, stop, step)):
            actual = _range_len(op, *(v.item() for v in (start, stop, step)))
            if n is not None and n != actual:
                raise ValueError(
                    f"{op}: out_dim {out_dim} is {n} but range({start}, {stop}, {step}) has {actual} elements"
                )
            n = actual
        elif n is None:
            raise ValueError(
                f"{op}: out_dim {out_dim} is not bound by the graph's input shapes, and under jax.jit the range's "
                "length "
                "cannot be read from its tensor bounds; use a static int out_dim or a dim of an input shape"
            )
    else:
        start, stop, step = params["start"], params["stop"], params["step"]
        actual = _range_len(op, start, stop, step)
        if n is not None and n != actual:
            raise ValueError(f"{op}: out_dim {out_dim} is {n} but range({start}, {stop}, {step}) has {actual} elements")
        n = actual
    # start + i * step in a wide type, like np.arange, then one rounding to dtype.
    values = jnp.asarray(start).astype(acc) + jnp.asarray(step).astype(acc) * jnp.arange(n, dtype=acc)
    return values.astype(dtype.to_numpy())


def _range_impl(*vals, **params):
    return _range_apply(vals, params, {})


def _range_interpret(interp, node, ins, params, env):
    out = _range_apply(ins, params, interp.dims)
    t = node.outputs[0].type
    # Binds a new out_dim symbol for later ops (or reports a mismatch with a bound one).
    err = bind_symbols(t.shape, out.shape, interp.dims)
    if err:
        raise ValueError(f"range: the result has {out.shape[0]} elements but the graph expects {R.fmt(t)} ({err})")
    return out


range_p = register(OpDef("range", rule=_range_rule, impl=_range_impl, interpret=_range_interpret, differentiable=False))


def _static_arg(name: str, v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"range: {name} must be a number, a Dim or a scalar tensor, got bool")
    if isinstance(v, StaticDim):
        return v.dim
    if isinstance(v, Dim):
        return v
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, numbers.Real):
        return v
    raise TypeError(f"range: {name} must be a number, a Dim or a scalar tensor, got {type(v).__name__} {v!r}")


def _is_whole(v: Any) -> bool:
    """An integer value (without a float round trip, which loses digits past 2**53)."""
    return isinstance(v, (numbers.Integral, np.integer)) or float(v).is_integer()


def _as_out_dim(out_dim: Any) -> Dim:
    _check_length(out_dim)  # before Dim, which rejects sizes outside int64
    try:
        return Dim(out_dim)
    except TypeError:
        raise TypeError(
            f"range: out_dim must be an int, str or Dim, got {type(out_dim).__name__} {out_dim!r}"
        ) from None


@front(range_p)
def range(start, stop, step=1, out_dim=None, *, dtype=None, device=None):  # noqa: A001 - MAX's name
    """Evenly spaced values ``start, start + step, ...`` up to (excluding) ``stop``.

    ``step`` must be non-zero and ``stop - start`` zero or of the sign of
    ``step``. With Python numbers the length is known while building
    (``out_dim``, if given, must match); Dims give a symbolic length
    (``range(0, Dim("seq"))`` has ``seq`` elements). Tensor-valued
    ``start``/``stop``/``step`` (scalars of one dtype; Python numbers next to
    them take that dtype) need ``out_dim``: the length. It must be static or a
    dim of the graph's inputs when the graph is compiled as one program; it is
    checked against the values (and a new symbol bound to it) wherever they
    are concrete: eager use, and graphs that run op by op (with ``nonzero``).

    Args:
        start: the first value (a number, Dim or scalar tensor).
        stop: the end, excluded (a number, Dim or scalar tensor).
        step: the increment (a number, Dim or scalar tensor).
        out_dim: the length (required for tensor bounds).
        dtype: element type (MAX requires it; default: the tensors' dtype, or
            float32 for Python numbers as MAX documents).
        device: device of the result (default: the graph's device).

    Raises:
        ValueError: ``step == 0``, a sign mismatch, tensor bounds without
            ``out_dim``, an out_dim that differs from the length, values not
            representable in an integer dtype, or tensors of different dtypes.
        TypeError: arguments that are not numbers, Dims or tensors.

    Example:
        >>> from maxfx.graph import DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("g") as g:
        ...     pos = ops.range(0, 10, 2, dtype=DType.int64, device=DeviceRef.CPU())
        ...     print(pos.type)
        ...     g.output(pos)
        TensorType(dtype=int64, shape=[Dim(5)], device=cpu:0)
        >>> InferenceSession().load(g).execute()[0].to_numpy()
        array([0, 2, 4, 6, 8])
    """
    args = (start, stop, step)
    names = ("start", "stop", "step")
    if dtype is not None and not isinstance(dtype, DType):
        raise TypeError(f"range: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    od = None if out_dim is None else _as_out_dim(out_dim)
    tensors = [a for a in args if is_value(a)]
    if tensors:
        dtypes = {dtype_of(t) for t in tensors}
        if len(dtypes) > 1:
            raise ValueError(
                f"range: start, stop and step must have the same dtype, got {', '.join(sorted(d.name for d in dtypes))}"
            )
        tdt = dtypes.pop()
        vals = []
        for name, a in zip(names, args):
            if not is_value(a):
                v = _static_arg(name, a)
                if isinstance(v, Dim):
                    raise TypeError(
                        f"range: a symbolic {name} ({v}) cannot be mixed with tensor bounds; use ops.shape_to_tensor "
                        "for it"
                    )
                if tdt.is_integral() and not _is_whole(v):
                    raise ValueError(f"range: {name} {v} is not representable in the bounds' dtype {tdt.name}")
                a = np.asarray(v).astype(tdt.to_numpy())
            vals.append(a)
        if od is None:
            # MAX's wording.
            raise ValueError(
                "range: Dynamic ranges must provide an explicit out_dim: tensor-valued start/stop/step need out_dim "
                "(the length of the result)"
            )
        if device is None and not isinstance(tensors[0], (jax.Array, jax.core.Tracer)):
            device = getattr(tensors[0], "device", None)  # a graph value's DeviceRef (or an eager tensor's device)
        return bind(
            range_p,
            *vals,
            start=None,
            stop=None,
            step=None,
            out_dim=DataDim(od),
            dtype=dtype or tdt,
            device=_default_device(device),
        )
    s0, s1, s2 = (_static_arg(n, a) for n, a in zip(names, args))
    dtype = dtype or DType.float32
    if dtype is DType.bool:
        raise ValueError("range: dtype must be numeric, got bool")
    if isinstance(s2, Dim):
        raise TypeError(f"range: step must be a number, got symbolic dim {s2}")
    if s2 == 0:
        raise ValueError("range: step must be non-zero")
    if dtype.is_integral():
        for name, v in zip(names, (s0, s1, s2)):
            if not isinstance(v, Dim) and not _is_whole(v):
                raise ValueError(f"range: {name} {v} is not representable in {dtype.name}")
            if not isinstance(v, Dim) and not -_INT64_MAX - 1 <= int(v) <= _INT64_MAX:
                raise ValueError(f"range: {name} {v} is out of the int64 range")
        s0, s1, s2 = (v if isinstance(v, Dim) else int(v) for v in (s0, s1, s2))
    if isinstance(s0, Dim) or isinstance(s1, Dim):
        if not isinstance(s2, int):
            raise TypeError(f"range: with symbolic bounds the step must be an int, got {s2!r}")
        length = _dim_len(Dim(s0), Dim(s1), s2)
    else:
        n = _range_len("range", s0, s1, s2)
        _check_length(n)  # before StaticDim, which rejects sizes outside int64
        length = StaticDim(n)
        if dtype.is_integral() and length.dim:
            info = np.iinfo(dtype.to_numpy())
            last = s0 + (length.dim - 1) * s2
            if min(s0, last) < info.min or max(s0, last) > info.max:
                raise ValueError(
                    f"range: values from {s0} to {last} are out of range for {dtype.name} [{info.min}, {info.max}]"
                )
    if od is not None and isinstance(od, StaticDim) and isinstance(length, StaticDim) and od != length:
        raise ValueError(f"range: out_dim {od} differs from the length {length} of range({s0}, {s1}, {s2})")
    return bind(
        range_p,
        start=s0,
        stop=s1,
        step=s2,
        out_dim=DataDim(od if od is not None else length),
        dtype=dtype,
        device=_default_device(device),
    )


# ─── hann_window ──────────────────────────────────────────────────────────


def _hann_rule(*, window_length: int, periodic: bool, dtype: DType, device: DeviceRef) -> TensorType:
    if not dtype.is_float():
        raise R.OpError(f"hann_window: dtype must be a floating-point type, got {dtype.name}")
    return TensorType(dtype, [window_length], device)


def _hann_impl(*, window_length: int, periodic: bool, dtype: DType, device: DeviceRef):
    n = window_length
    if n <= 1:
        return jnp.ones((n,), dtype.to_numpy())  # torch: a 1-sample window is [1.0] either way
    denom = n if periodic else n - 1
    k = jnp.arange(n, dtype=jnp.float64)
    return (0.5 - 0.5 * jnp.cos(2 * math.pi * k / denom)).astype(dtype.to_numpy())


hann_window_p = register(OpDef("hann_window", rule=_hann_rule, impl=_hann_impl, differentiable=False))


@front(hann_window_p)
def hann_window(window_length, device=None, periodic=True, dtype=DType.float32):
    """A Hann window of ``window_length`` samples: ``H[n] = 1/2 (1 - cos(2 pi n / (N - 1)))``.

    With ``periodic=True`` (for ``stft``), ``N = window_length + 1`` and the
    last sample is dropped: ``hann_window(L) == hann_window(L + 1, periodic=False)[:-1]``.
    A length-1 window is ``[1.0]``.

    Args:
        window_length: number of samples (an int >= 0).
        device: device of the result (default: the context's default device;
            MAX's eager ``F.hann_window`` makes it optional).
        periodic: periodic (True) or symmetric (False) window.
        dtype: a floating-point element type.

    Raises:
        ValueError: ``window_length`` is negative, or ``dtype`` is not floating-point.
        TypeError: ``window_length`` is not an int.

    Example:
        >>> from maxfx.graph import DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("g") as g:
        ...     g.output(ops.hann_window(4, DeviceRef.CPU()), ops.hann_window(5, DeviceRef.CPU(), periodic=False))
        >>> periodic, symmetric = InferenceSession().load(g).execute()
        >>> periodic.to_numpy()
        array([0. , 0.5, 1. , 0.5], dtype=float32)
        >>> symmetric.to_numpy()
        array([0. , 0.5, 1. , 0.5, 0. ], dtype=float32)
    """
    if isinstance(window_length, (bool, np.bool_)) or not isinstance(
        window_length, (numbers.Integral, np.integer, StaticDim)
    ):
        raise TypeError(
            f"hann_window: window_length must be an integer, got {type(window_length).__name__} {window_length!r}"
        )
    if int(window_length) < 0:
        raise ValueError(f"hann_window: window_length must be non-negative, got {int(window_length)}")
    if not isinstance(dtype, DType):
        raise TypeError(f"hann_window: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return bind(
        hann_window_p,
        window_length=int(window_length),
        periodic=bool(periodic),
        dtype=dtype,
        device=_default_device(device),
    )


# ─── constant_external ───────────────────────────────────────────────────


@front()
def constant_external(name, type):  # noqa: A002 - MAX's name
    """A named external constant (a weight) of ``type``, bound at load time.

    Its value comes from ``InferenceSession.load(graph, weights_registry={name: array})``.
    Two external constants with the same name and type are the same value;
    the same name with a different type is an error.

    Args:
        name: the fully qualified weight name.
        type: its `TensorType`.

    Raises:
        ValueError: ``name`` is already used by a weight of another type.
        TypeError: ``name`` is not a str or ``type`` not a TensorType.
        RuntimeError: no active Graph.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("g", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
        ...     w = ops.constant_external("layer.weight", TensorType(DType.float32, [2], DeviceRef.CPU()))
        ...     g.output(g.inputs[0] * w)
        >>> weights = {"layer.weight": np.array([10.0, 100.0], np.float32)}
        >>> model = InferenceSession().load(g, weights_registry=weights)
        >>> model.execute(np.array([1.0, 2.0], np.float32))[0].to_numpy()
        array([ 10., 200.], dtype=float32)
    """
    op = "constant_external"
    if not isinstance(name, str):  # any str, "" included, as in MAX: it is the weights_registry key
        raise TypeError(f"{op}: name must be a str, got {name!r}")
    if not isinstance(type, TensorType):
        raise TypeError(f"{op}: type must be a TensorType, got {builtins.type(type).__name__} {type!r}")
    ctx = current_context()
    weights = getattr(ctx, "weights", None) if isinstance(ctx, GraphBuilder) else None
    if weights is None:
        raise RuntimeError(f"{op}: no active Graph; call it inside `with Graph(...)`")
    # One value per weight name per graph (the table is shared with Graph.add_weight and nested blocks).
    existing = weights.get(name)
    if existing is not None:
        if existing.type != type:
            raise ValueError(
                f"{op}: {name!r} is already a weight of type {existing.type}, not {type}; "
                "external constants with the same name must have the same type"
            )
        return existing
    value = bind(weight_p, name=name, type=type)
    weights[name] = value
    return value
