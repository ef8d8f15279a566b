"""`DeviceMesh`: devices arranged on a grid of named axes (``max.experimental.sharding``).

A mesh is a flat tuple of driver devices in row-major order, the grid's shape
and one name per axis (``("dp", "tp")``). `DeviceMesh.jax_mesh` is the same
grid as a ``jax.sharding.Mesh``, the backend of `NamedMapping.named_sharding`.

`mesh_context` publishes a mesh for the block it wraps and `get_active_mesh`
reads it: a `NamedMapping` built there without a mesh (``NamedMapping.from_spec
(spec)``, ``NamedMapping(spec=spec)``) resolves its spec against that mesh, as
in MAX. Nothing else reads it (tensor creation defaults, ``distribute`` and
``Module.to`` take their device or mapping explicitly, in MAX too).

Example:
    >>> from maxfx.driver import CPU
    >>> mesh = DeviceMesh((CPU(),), (1,), ("tp",))
    >>> mesh.num_devices, mesh.axis_size("tp"), mesh
    (1, 1, DeviceMesh(tp=1))
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from maxfx.driver import CPU

__all__ = ["DeviceMesh", "get_active_mesh", "mesh_context"]


@dataclass(frozen=True)
class DeviceMesh:
    """An N-dimensional logical grid of devices.

    Args:
        devices: flat tuple of driver devices, row-major over ``mesh_shape``; or
            of ``jax.Device``s, which in a multi-process job (`maxfx.distributed`)
            may be other processes' devices (see `DeviceMesh.from_jax`).
        mesh_shape: the grid's shape, e.g. ``(2, 4)`` for DP=2 x TP=4.
        axis_names: one distinct name per grid axis, e.g. ``("dp", "tp")``.

    Either every device is distinct (real multi-device) or all slots hold the
    same device (a mesh simulated on one device); mixtures are rejected.

    Raises:
        ValueError: no devices, a device count that does not match the shape,
            a name count that does not match the rank, or repeated names.

    Example:
        >>> from maxfx.driver import CPU
        >>> DeviceMesh.single(CPU()).is_single
        True
    """

    devices: tuple[Any, ...]
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "mesh_shape", tuple(int(s) for s in self.mesh_shape))
        object.__setattr__(self, "axis_names", tuple(self.axis_names))
        if not self.devices:
            raise ValueError("DeviceMesh requires at least one device.")
        expected = math.prod(self.mesh_shape)
        if len(self.devices) != expected:
            raise ValueError(f"mesh_shape {self.mesh_shape} expects {expected} devices, got {len(self.devices)}")
        if len(self.axis_names) != len(self.mesh_shape):
            raise ValueError(
                f"axis_names length ({len(self.axis_names)}) must match mesh_shape rank ({len(self.mesh_shape)})"
            )
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ValueError(f"axis_names must be unique, got {self.axis_names}")
        if len(self.devices) > 1:
            unique = len(set(self.devices))
            if unique not in (1, len(self.devices)):
                raise ValueError(
                    "DeviceMesh requires either all-same devices (simulated) or all-distinct devices (multi-device), "
                    f"but got {unique} unique devices for {len(self.devices)} slots."
                )

    @staticmethod
    def from_jax(mesh: Mesh) -> DeviceMesh:
        """The grid of a ``jax.sharding.Mesh`` (e.g. ``maxfx.make_mesh``'s, over every process's devices).

        Its devices stay ``jax.Device``s: driver devices name only this
        process's, and a mesh of a multi-process job spans the others too.
        `jax_mesh` gives the same ``Mesh`` back, so `NamedMapping`'s
        ``named_sharding()`` places values over every process.

        Example:
            >>> import jax, numpy as np
            >>> DeviceMesh.from_jax(Mesh(np.array(jax.devices()[:1]), ("dp",)))
            DeviceMesh(dp=1)
        """
        return DeviceMesh(tuple(mesh.devices.flat), tuple(int(s) for s in mesh.devices.shape), tuple(mesh.axis_names))

    @staticmethod
    def single(device: Any) -> DeviceMesh:
        """The trivial one-device mesh (axis ``"_"``)."""
        return DeviceMesh((device,), (1,), ("_",))

    @staticmethod
    def default() -> DeviceMesh:
        """A single-device mesh on the default device, the CPU (as in MAX).

        Example:
            >>> DeviceMesh.default()
            DeviceMesh(_=1)
            >>> DeviceMesh.default().devices
            (CPU(),)
        """
        return DeviceMesh.single(CPU())

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return len(self.mesh_shape)

    @property
    def num_devices(self) -> int:
        """Number of device slots."""
        return len(self.devices)

    @property
    def is_single(self) -> bool:
        """True for a one-device mesh."""
        return self.num_devices == 1

    @property
    def is_simulated(self) -> bool:
        """True when several slots hold one device (multi-device emulated on one)."""
        return self.num_devices > 1 and len(set(self.devices)) == 1

    def axis_index(self, axis: str | int) -> int:
        """The index of mesh axis ``axis`` (a name or an index).

        Raises:
            ValueError: an unknown name. IndexError: an index out of range.
            TypeError: neither a name nor an index.
        """
        if not isinstance(axis, (str, numbers.Integral)) or isinstance(axis, bool):
            raise TypeError(f"a mesh axis is a name (str) or an index (int), got {type(axis).__name__} {axis!r}")
        if isinstance(axis, str):
            if axis not in self.axis_names:
                raise ValueError(f"Unknown axis name {axis!r}. Available: {self.axis_names}")
            return self.axis_names.index(axis)
        if not 0 <= axis < self.ndim:
            raise IndexError(f"Axis index {axis} out of range for mesh with {self.ndim} dimensions")
        return int(axis)

    def axis_size(self, axis: str | int | tuple[str | int, ...]) -> int:
        """Size of mesh axis ``axis`` (a name or an index); for several axes, the devices they span together.

        Raises:
            ValueError: an unknown name. IndexError: an index out of range.

        Example:
            >>> from maxfx.driver import CPU
            >>> mesh = DeviceMesh((CPU(),) * 6, (2, 3), ("dp", "tp"))
            >>> mesh.axis_size("tp"), mesh.axis_size(("dp", "tp"))
            (3, 6)
        """
        if not isinstance(axis, (tuple, list)):
            return self.mesh_shape[self.axis_index(axis)]
        return math.prod(self.mesh_shape[self.axis_index(a)] for a in axis)

    def device_coord(self, device_idx: int, axis: str | int | tuple[str | int, ...]) -> int:
        """Device ``device_idx``'s coordinate along mesh axis ``axis`` (a name or an index).

        Devices are numbered row-major over `mesh_shape`: on a ``(2, 3)`` mesh,
        device 4 sits at ``(1, 1)``. For several axes, the device's index among
        the devices they span, row-major over the axes as given.

        Args:
            device_idx: the flat device index, in ``[0, num_devices)``.
            axis: the mesh axis (or axes), by name or integer index.

        Returns:
            The coordinate, in ``[0, axis_size(axis))``.

        Raises:
            TypeError: ``device_idx`` is not an int.
            IndexError: ``device_idx`` out of range, or an axis index outside ``[0, ndim)``.
            ValueError: an axis name not on the mesh.

        Example:
            >>> from maxfx.driver import CPU
            >>> mesh = DeviceMesh((CPU(),) * 6, (2, 3), ("dp", "tp"))
            >>> mesh.device_coord(4, 0), mesh.device_coord(4, "tp"), mesh.device_coord(4, ("dp", "tp"))
            (1, 1, 4)
        """
        if isinstance(device_idx, bool) or not isinstance(device_idx, numbers.Integral):
            raise TypeError(f"device_coord: device_idx must be an int, got {type(device_idx).__name__}")
        if not 0 <= device_idx < self.num_devices:
            raise IndexError(f"device_idx {device_idx} out of range for mesh with {self.num_devices} devices")
        if isinstance(axis, (tuple, list)):
            coord = 0
            for a in axis:
                idx = self.axis_index(a)
                coord = coord * self.mesh_shape[idx] + self.device_coord(device_idx, idx)
            return coord
        idx = self.axis_index(axis)
        return (int(device_idx) // math.prod(self.mesh_shape[idx + 1 :])) % self.mesh_shape[idx]

    def coords(self) -> Iterator[tuple[int, ...]]:
        """Each device slot's grid coordinate, in the order of `devices`."""
        return iter(np.ndindex(*self.mesh_shape))

    def jax_mesh(self) -> Any:
        """This grid as a ``jax.sharding.Mesh`` (real, distinct devices only).

        Raises:
            ValueError: a simulated mesh, or devices JAX does not have.
        """
        if self.is_simulated:
            raise ValueError(f"{self}: a simulated mesh (one device in every slot) has no jax.sharding.Mesh")
        try:
            devices = [d if isinstance(d, jax.Device) else d.jax_device for d in self.devices]
        except (AttributeError, ValueError) as e:
            raise ValueError(f"{self}: its devices are not JAX devices of this machine ({e})") from None
        return Mesh(np.array(devices, dtype=object).reshape(self.mesh_shape), self.axis_names)

    def __repr__(self) -> str:
        return "DeviceMesh(" + ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape)) + ")"


_ACTIVE_MESH: contextvars.ContextVar[DeviceMesh | None] = contextvars.ContextVar("maxfx_active_mesh", default=None)


def get_active_mesh() -> DeviceMesh | None:
    """The mesh published by the innermost `mesh_context`, or None outside one.

    Example:
        >>> get_active_mesh() is None
        True
    """
    return _ACTIVE_MESH.get()


@contextlib.contextmanager
def mesh_context(mesh: DeviceMesh) -> Iterator[DeviceMesh]:
    """Publish ``mesh`` to spec-first `NamedMapping` constructions inside the block (JAX style).

    A `NamedMapping` made inside without an explicit mesh (``NamedMapping.from_spec
    (spec)`` or ``NamedMapping(spec=spec)``) resolves its spec against ``mesh``; an
    explicit mesh still wins. Blocks nest (the innermost mesh is active) and the
    previous mesh comes back on exit, exceptions included.

    Raises:
        TypeError: ``mesh`` is not a `DeviceMesh`.

    Example:
        >>> from maxfx.driver import CPU
        >>> from maxfx.experimental.sharding import NamedMapping
        >>> mesh = DeviceMesh(devices=(CPU(), CPU()), mesh_shape=(2,), axis_names=("tp",))
        >>> with mesh_context(mesh):
        ...     active = get_active_mesh()
        ...     mapping = NamedMapping.from_spec(("tp", None))
        >>> active is mesh, mapping.mesh is mesh, mapping.to_placements(), get_active_mesh()
        (True, True, (Sharded(axis=0),), None)
    """
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh_context: expected a DeviceMesh, got {type(mesh).__name__}")
    token = _ACTIVE_MESH.set(mesh)
    try:
        yield mesh
    finally:
        _ACTIVE_MESH.reset(token)
