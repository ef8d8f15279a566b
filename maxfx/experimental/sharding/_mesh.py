"""`DeviceMesh`: devices arranged on a grid of named axes (``max.experimental.sharding``).

A mesh is a flat tuple of driver devices in row-major order, the grid's shape
and one name per axis (``("dp", "tp")``). `DeviceMesh.jax_mesh` is the same
grid as a ``jax.sharding.Mesh``, the backend of `NamedMapping.named_sharding`.

Example:
    >>> from maxfx.driver import CPU
    >>> mesh = DeviceMesh((CPU(),), (1,), ("tp",))
    >>> mesh.num_devices, mesh.axis_size("tp"), mesh
    (1, 1, DeviceMesh(tp=1))
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import Mesh

__all__ = ["DeviceMesh"]


@dataclass(frozen=True)
class DeviceMesh:
    """An N-dimensional logical grid of devices.

    Args:
        devices: flat tuple of driver devices, row-major over ``mesh_shape``.
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
            raise ValueError(f"axis_names length ({len(self.axis_names)}) must match mesh_shape rank ({len(self.mesh_shape)})")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ValueError(f"axis_names must be unique, got {self.axis_names}")
        if len(self.devices) > 1:
            unique = len(set(self.devices))
            if unique not in (1, len(self.devices)):
                raise ValueError(f"DeviceMesh requires either all-same devices (simulated) or all-distinct devices (multi-device), but got {unique} unique devices for {len(self.devices)} slots.")

    @staticmethod
    def single(device: Any) -> DeviceMesh:
        """The trivial one-device mesh (axis ``"_"``)."""
        return DeviceMesh((device,), (1,), ("_",))

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
        """
        if isinstance(axis, str):
            if axis not in self.axis_names:
                raise ValueError(f"Unknown axis name {axis!r}. Available: {self.axis_names}")
            return self.axis_names.index(axis)
        if not 0 <= axis < self.ndim:
            raise IndexError(f"Axis index {axis} out of range for mesh with {self.ndim} dimensions")
        return int(axis)

    def axis_size(self, axis: str | int) -> int:
        """Size of mesh axis ``axis`` (a name or an index)."""
        return self.mesh_shape[self.axis_index(axis)]

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
            devices = [d.jax_device for d in self.devices]
        except (AttributeError, ValueError) as e:
            raise ValueError(f"{self}: its devices are not JAX devices of this machine ({e})") from None
        return Mesh(np.array(devices, dtype=object).reshape(self.mesh_shape), self.axis_names)

    def __repr__(self) -> str:
        return "DeviceMesh(" + ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape)) + ")"
