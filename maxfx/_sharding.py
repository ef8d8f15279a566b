"""`make_mesh` and `shard`: place Tensors and Module parameters across devices with ``jax.sharding``.

A `jax.sharding.Mesh` arranges devices on named axes; a ``PartitionSpec``
says which mesh axis splits each dim of an array (``P("data", None)``: dim 0
split over ``data``, dim 1 whole). `shard` checks the spec against the mesh
and the shape (errors name the axis and the sizes), then ``jax.device_put``s
the values with a ``NamedSharding``. Code under ``jax.jit`` (or ``maxfx.jit``)
then runs SPMD across the mesh: XLA inserts the collectives.

Example:
    >>> import maxfx
    >>> from jax.sharding import PartitionSpec as P
    >>> from maxfx.experimental.tensor import Tensor
    >>> mesh = maxfx.make_mesh((1,), ("data",))
    >>> x = maxfx.shard(Tensor.ones([4, 2]), mesh, P("data", None))
    >>> x.shape
    [Dim(4), Dim(2)]
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lowering.devices import jax_device
from lowering.types import DeviceRef
from maxfx._global_arrays import check_same_on_every_process, global_shape, put_process_local, put_replicated
from maxfx.driver import Device
from maxfx.driver import Tensor as DriverTensor
from maxfx.driver._tensor import as_array
from maxfx.experimental._tensor import Tensor, _leaf
from maxfx.experimental.nn import Module
from maxfx.experimental.sharding import DeviceMesh

__all__ = ["make_mesh", "shard", "sharding_of"]

SpecLike = PartitionSpec | Sequence[Any] | None


# ─── meshes ──────────────────────────────────────────────────────────────


def _jax_device(d: Any) -> jax.Device:
    if isinstance(d, jax.Device):
        return d
    if isinstance(d, Device):
        return d.jax_device
    if isinstance(d, DeviceRef):
        return jax_device(d)
    raise TypeError(f"make_mesh: devices must be driver Devices, DeviceRefs or jax Devices, got {type(d).__name__}")


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str], *, devices: Sequence[Any] | None = None) -> Mesh:
    """A `jax.sharding.Mesh` of ``devices`` (default: ``jax.devices()``) shaped ``axis_shapes``.

    ``devices`` may be driver Devices (``Accelerator(i)`` is this process's GPU ``i``),
    graph ``DeviceRef``s (``DeviceRef.CPU(i)`` is this process's CPU device ``i``) or jax Devices.
    In a multi-process job (`maxfx.distributed`) the default spans every process's
    devices; driver Devices and DeviceRefs name only this process's.

    Raises:
        ValueError: the axes need more or fewer devices than given, or names repeat.

    Example:
        >>> make_mesh((1, 1), ("data", "model")).shape
        OrderedDict({'data': 1, 'model': 1})
    """
    shape = tuple(int(s) for s in axis_shapes)
    names = tuple(axis_names)
    if len(shape) != len(names):
        raise ValueError(f"make_mesh: {len(shape)} axis sizes {list(shape)} but {len(names)} axis names {list(names)}")
    if len(set(names)) != len(names):
        raise ValueError(f"make_mesh: axis names must be distinct, got {list(names)}")
    if any(s < 1 for s in shape):
        raise ValueError(f"make_mesh: axis sizes must be >= 1, got {dict(zip(names, shape))}")
    devs = [_jax_device(d) for d in devices] if devices is not None else jax.devices()
    need = math.prod(shape)
    if need != len(devs):
        raise ValueError(
            f"make_mesh: axes {dict(zip(names, shape))} need {need} devices, but {len(devs)} are given"
            + (
                ""
                if devices is not None
                else " (jax.devices(); on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts)"
            )
        )
    return Mesh(np.array(devs, dtype=object).reshape(shape), names)


# ─── specs ───────────────────────────────────────────────────────────────


def _spec(spec: SpecLike) -> PartitionSpec:
    if spec is None:
        return PartitionSpec()
    if isinstance(spec, PartitionSpec):
        return spec
    if isinstance(spec, (list, tuple)):
        return PartitionSpec(*spec)
    if isinstance(spec, str):
        return PartitionSpec(spec)
    raise TypeError(
        f"shard: a spec must be a PartitionSpec, a tuple of axis names/None, or None; got {type(spec).__name__}"
    )


def _check(spec: PartitionSpec, mesh: Mesh, shape: Sequence[int], what: str) -> None:
    """Raise naming the axis and sizes when ``spec`` cannot shard ``shape`` on ``mesh``."""
    sizes = dict(mesh.shape)
    if len(spec) > len(shape):
        raise ValueError(
            f"shard: {what} has rank {len(shape)} (shape {list(shape)}) but the spec {spec} names {len(spec)} dims"
        )
    used: set[str] = set()
    for dim, entry in enumerate(spec):
        if entry is None or entry is PartitionSpec.UNCONSTRAINED:
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        for axis in axes:
            if axis not in sizes:
                raise ValueError(f"shard: {what}: spec {spec} names mesh axis {axis!r}, but the mesh has axes {sizes}")
            if axis in used:
                raise ValueError(f"shard: {what}: spec {spec} uses mesh axis {axis!r} for more than one dim")
            used.add(axis)
        n = math.prod(sizes[a] for a in axes)
        if shape[dim] % n:
            names = " x ".join(f"{a!r} (size {sizes[a]})" for a in axes)
            raise ValueError(
                f"shard: {what}: dim {dim} of size {shape[dim]} (shape {list(shape)}) is not divisible by mesh axis "
                f"{names}"
            )


def sharding_of(x: Any) -> Any:
    """The ``jax.sharding.Sharding`` of a Tensor or jax array (None for a traced or graph value)."""
    array = x._array() if isinstance(x, Tensor) else x
    return (
        getattr(array, "sharding", None)
        if isinstance(array, jax.Array) and not isinstance(array, jax.core.Tracer)
        else None
    )


# ─── shard ────────────────────────────────────────────────────────────────


def _source(x: Any) -> Any:
    """The array behind ``x``: a Tensor's, a driver Tensor's, or ``x`` itself (lists and scalars become arrays)."""
    return (
        x._array()
        if isinstance(x, Tensor)
        else as_array(x)
        if isinstance(x, DriverTensor) or not hasattr(x, "shape")
        else x
    )


def _put(x: Any, mesh: Mesh, spec: PartitionSpec, what: str, process_local: bool) -> Any:
    array = _source(x)
    if isinstance(array, jax.core.Tracer):
        if process_local:
            raise TypeError(
                f"shard: {what} is traced (inside jit); process_local=True places concrete per-process data, outside "
                "jit"
            )
        _check(spec, mesh, np.shape(array), what)
        constrained = jax.lax.with_sharding_constraint(array, NamedSharding(mesh, spec))
        return _leaf(constrained, x.dtype) if isinstance(x, Tensor) else constrained
    if process_local:
        try:
            shape = global_shape(np.shape(array), mesh, spec) if len(spec) <= np.ndim(array) else np.shape(array)
        except ValueError as e:
            raise ValueError(f"shard(process_local=True): {what}: {e}") from None
        _check(spec, mesh, shape, what)  # before NamedSharding, whose own errors name neither sizes nor the value
        placed = put_process_local(array, NamedSharding(mesh, spec), shape)
    else:
        _check(spec, mesh, np.shape(array), what)
        placed = put_replicated(array, NamedSharding(mesh, spec))
    return _leaf(placed, x.dtype) if isinstance(x, Tensor) else placed


def _check_replicas(items: list[tuple[str, Any]], mesh: Mesh, process_local: bool) -> None:
    """On a mesh over several processes, every process must hold the same value of what is placed whole."""
    if process_local or not _spans_processes(mesh):
        return
    local = [
        (what, a)
        for what, a in ((w, _source(v)) for w, v in items)
        if not isinstance(a, jax.core.Tracer) and not (isinstance(a, jax.Array) and not a.is_fully_addressable)
    ]
    check_same_on_every_process(local, "shard")


def _spans_processes(mesh: Mesh) -> bool:
    # The same answer on every process (unlike "are all its devices mine"), so all of them take part in the check's
    # collective or none.
    return len({d.process_index for d in mesh.devices.flat}) > 1


def _module_rule(rule: Any, names: list[str]) -> Callable[[str], PartitionSpec]:
    """Parameter name → spec from a mapping of glob patterns (first match wins) or a callable."""
    if rule is None:
        return lambda name: PartitionSpec()
    if callable(rule) and not isinstance(rule, Mapping):
        return lambda name: _spec(rule(name))
    if not isinstance(rule, Mapping):
        raise TypeError(
            "shard: a Module takes a rule mapping parameter-name patterns to PartitionSpecs (or a callable name -> "
            f"spec), got {type(rule).__name__}"
        )
    patterns = [(str(k), _spec(v)) for k, v in rule.items()]
    unused = [p for p, _ in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unused:
        raise ValueError(f"shard: rule pattern(s) {unused} match no parameter; parameters are {names}")

    def lookup(name: str) -> PartitionSpec:
        for pattern, spec in patterns:
            if fnmatch.fnmatchcase(name, pattern):
                return spec
        return PartitionSpec()  # unmatched parameters are replicated

    return lookup


def shard(x: Any, mesh: Mesh, spec: Any = None, *, process_local: bool = False) -> Any:
    """Place ``x`` on ``mesh``, split as ``spec`` says.

    Args:
        x: a Tensor or array (returns a sharded one), a pytree of them (every leaf
            gets ``spec``), or an ``experimental.nn`` Module (sharded **in place**
            and returned).
        mesh: a `jax.sharding.Mesh` (see `make_mesh`), or a ``DeviceMesh`` of
            ``maxfx.experimental.sharding`` (its `jax_mesh`).
        spec: for arrays, a ``PartitionSpec`` (or a tuple of axis names / None;
            None replicates). For a Module, a mapping from parameter-name glob
            patterns to specs, first match wins, unmatched parameters replicated
            (``{"fc1.weight": P("model", None), "fc2.weight": P(None, "model")}``),
            or a callable ``name -> spec``.
        process_local: in a multi-process job (`maxfx.distributed`), ``x`` is this
            process's part of the value (its slice of the batch): the processes'
            parts together form the global array, split dims growing by the
            processes along them (``jax.make_array_from_process_local_data``).
            Without it ``x`` is the whole value and must be the same on every
            process (weights, a batch each loads whole): each process writes its
            own shards of it, and a value that differs between processes is an error.
            With one process the two are the same.

    Inside ``jax.jit`` a traced value gets a sharding constraint instead.

    Raises:
        ValueError: a spec names an axis the mesh lacks, a dim is not divisible by
            its axes' size, the spec is longer than the rank, or a Module rule
            pattern matches no parameter; the message names the axis and sizes.
            On a mesh over several processes: a value differs between processes
            (without ``process_local``), or a process's part does not divide into its shards.
    """
    if isinstance(mesh, DeviceMesh):  # MAX's mesh type: the same grid as a jax Mesh
        mesh = mesh.jax_mesh()
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"shard: mesh must be a jax.sharding.Mesh (see maxfx.make_mesh) or a DeviceMesh, got {type(mesh).__name__}"
        )
    if isinstance(x, Module):
        names = [n for n, _ in x.parameters]
        lookup = _module_rule(spec, names)
        _check_replicas([(f"parameter {n!r}", t) for n, t in x.parameters], mesh, process_local)
        placed = {
            n: _put(t, mesh, lookup(n), f"parameter {n!r}", process_local) for n, t in x.parameters
        }  # check all before changing any
        x.apply_to_parameters(lambda n, t: placed[n])
        return x
    pspec = _spec(spec)
    if isinstance(x, (Tensor, np.ndarray, jax.Array)) or hasattr(x, "__dlpack__"):
        _check_replicas([("the array", x)], mesh, process_local)
        return _put(x, mesh, pspec, "the array", process_local)
    leaves = jax.tree_util.tree_leaves_with_path(x, is_leaf=lambda v: isinstance(v, Tensor))
    if not leaves:
        raise TypeError(f"shard: expected a Tensor, array, Module or pytree of arrays, got {type(x).__name__}")
    named = [(f"leaf {jax.tree_util.keystr(p) or '<root>'}", v) for p, v in leaves]
    _check_replicas(named, mesh, process_local)
    placed = {id(v): _put(v, mesh, pspec, what, process_local) for what, v in named}
    return jax.tree.map(lambda v: placed[id(v)], x, is_leaf=lambda v: isinstance(v, Tensor))
