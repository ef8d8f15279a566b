"""``maxfx.experimental.sharding`` against what Modular's API reference documents for ``max.experimental.sharding``.

Expected values come from the pages (DeviceMesh, mesh_context, get_active_mesh,
DeviceMapping, NamedMapping, PlacementMapping, Sharded) and from MAX's tests of
the active mesh, not from maxfx itself. The meshes are simulated (every slot
the host CPU), as in MAX's own examples.
"""

import dataclasses
import doctest
import importlib

import numpy as np
import pytest

from lowering.dims import Dim
from maxfx.driver import CPU
from maxfx.dtype import DType
from maxfx.experimental import sharding
from maxfx.experimental.sharding import (
    ConversionError,
    DeviceMapping,
    DeviceMesh,
    DistributedTensor,
    NamedMapping,
    Partial,
    PlacementMapping,
    Replicated,
    Sharded,
    TensorLayout,
    get_active_mesh,
    mesh_context,
)
from maxfx.experimental.tensor import Tensor, defaults


def _mesh(n: int, name: str = "tp") -> DeviceMesh:
    return DeviceMesh((CPU(),) * n, (n,), (name,))


def _mesh_2x3() -> DeviceMesh:
    return DeviceMesh((CPU(),) * 6, (2, 3), ("dp", "tp"))


# ─── DeviceMesh ──────────────────────────────────────────────────────────


def test_device_coord_follows_the_pages_example():
    # "For a mesh shaped (2, 3) with row-major device ordering, the device at flat index 4 has
    # coords (1, 1), so mesh.device_coord(4, 0) == 1 and mesh.device_coord(4, 1) == 1."
    mesh = _mesh_2x3()
    assert mesh.device_coord(4, 0) == 1 and mesh.device_coord(4, 1) == 1
    assert (mesh.device_coord(4, "dp"), mesh.device_coord(4, "tp")) == (1, 1)
    # Row-major: every device's coordinates, and each within [0, axis_size).
    assert [(mesh.device_coord(i, 0), mesh.device_coord(i, 1)) for i in range(6)] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
        (1, 2),
    ]
    assert [(mesh.device_coord(i, 0), mesh.device_coord(i, 1)) for i in range(6)] == list(mesh.coords())
    # Several axes (MAX's source): the index among the devices they span, row-major over the axes as given.
    assert mesh.device_coord(4, (0, 1)) == 4 and mesh.device_coord(4, ("tp", "dp")) == 1 * 2 + 1
    assert mesh.axis_size(("dp", "tp")) == 6


def test_device_coord_errors_name_what_is_expected():
    mesh = _mesh_2x3()
    with pytest.raises(IndexError, match="device_idx 6 out of range for mesh with 6 devices"):
        mesh.device_coord(6, 0)
    with pytest.raises(IndexError, match="device_idx -1 out of range"):
        mesh.device_coord(-1, 0)
    with pytest.raises(IndexError, match="Axis index 2 out of range for mesh with 2 dimensions"):
        mesh.device_coord(0, 2)
    with pytest.raises(ValueError, match=r"Unknown axis name 'ep'. Available: \('dp', 'tp'\)"):
        mesh.device_coord(0, "ep")
    with pytest.raises(TypeError, match="device_idx must be an int, got float"):
        mesh.device_coord(1.0, 0)
    with pytest.raises(TypeError, match=r"a mesh axis is a name \(str\) or an index \(int\), got NoneType"):
        mesh.device_coord(0, None)


def test_default_is_a_single_device_mesh_on_the_cpu():
    # "Returns a single-device mesh on the default device (CPU)."
    mesh = DeviceMesh.default()
    assert isinstance(mesh, DeviceMesh) and mesh.is_single and mesh.num_devices == 1 and mesh.ndim == 1
    assert mesh.devices == (CPU(),) and mesh == DeviceMesh.single(CPU())


# ─── mesh_context / get_active_mesh ─────────────────────────────────────


def test_mesh_context_example_from_the_page():
    mesh = DeviceMesh(devices=(CPU(), CPU()), mesh_shape=(2,), axis_names=("tp",))
    assert get_active_mesh() is None  # "Returns the mesh from the current mesh_context(), or None."
    with mesh_context(mesh) as yielded:
        active = get_active_mesh()
    assert active is mesh and yielded is mesh
    assert get_active_mesh() is None  # cleared on block exit


def test_named_mapping_without_a_mesh_resolves_against_the_active_one():
    # MAX's TestActiveMesh: "NamedMapping takes its mesh from mesh_context when given none."
    mesh = _mesh(4)
    with mesh_context(mesh):
        mapping = NamedMapping(spec=("tp",))
        from_spec = NamedMapping.from_spec(("tp", None))
    assert mapping.mesh is mesh and mapping.to_placements() == (Sharded(0),)
    assert from_spec.mesh is mesh and from_spec.to_placements() == (Sharded(0),)
    # The explicit mesh wins.
    with mesh_context(_mesh(4)):
        assert NamedMapping(_mesh(2), ("tp",)).mesh.num_devices == 2
        assert NamedMapping.from_spec(("tp",), _mesh(2)).mesh.num_devices == 2
    # The same spec resolves against each context's mesh.
    spec = ("tp", None)
    with mesh_context(_mesh(2)):
        two = NamedMapping(spec=spec)
    with mesh_context(_mesh(8)):
        eight = NamedMapping(spec=spec)
    assert (two.mesh.num_devices, eight.mesh.num_devices) == (2, 8)
    assert two.to_placements() == eight.to_placements() == (Sharded(0),)


def test_an_axis_the_active_mesh_lacks_replicates():
    # MAX: names the mesh lacks resolve to Replicated, so one spec runs on any topology.
    with mesh_context(_mesh(4, name="other")):
        mapping = NamedMapping(spec=("tp", None))
    assert mapping.to_placements() == (Replicated(),) and mapping.is_fully_replicated
    assert mapping.spec == (None, None) and mapping.original_spec == ("tp", None)
    model_spec = NamedMapping(DeviceMesh((CPU(),) * 2, (2,), ("tp",)), (("dp", "tp"), None), frozenset({"dp"}))
    assert (
        model_spec.spec == ("tp", None)
        and model_spec.unreduced == frozenset()
        and model_spec.to_placements() == (Sharded(0),)
    )


def test_contexts_nest_and_restore_even_on_errors():
    outer, inner = _mesh(2), _mesh(4)
    with mesh_context(outer):
        with mesh_context(inner):
            assert get_active_mesh() is inner
        assert get_active_mesh() is outer
        with pytest.raises(RuntimeError), mesh_context(inner):
            raise RuntimeError("boom")
        assert get_active_mesh() is outer
    assert get_active_mesh() is None


def test_no_mesh_and_no_context():
    # MAX's NamedMapping refuses a spec with nothing to resolve against ...
    with pytest.raises(ValueError, match=r"needs a mesh .* mesh_context"):
        NamedMapping(spec=("tp",))
    # ... while the published from_spec falls back to DeviceMesh.default().
    fallback = NamedMapping.from_spec(("tp", None))
    assert fallback.mesh == DeviceMesh.default() and fallback.to_placements() == (Replicated(),)
    with pytest.raises(TypeError, match="mesh_context: expected a DeviceMesh, got CPU"):
        mesh_context(CPU()).__enter__()


def test_the_active_mesh_lays_tensors_out_through_named_mappings():
    mesh = _mesh(2)
    with mesh_context(mesh):
        t = Tensor.ones([4, 3], device=NamedMapping.from_spec(("tp", None)))
        layout = TensorLayout(DType.float32, ["batch", 3], NamedMapping.from_spec(("tp", None)))
    assert isinstance(t, DistributedTensor) and t.mesh is mesh and t.placements == (Sharded(0),)
    assert [list(map(int, s.shape)) for s in t.local_shards] == [[2, 3], [2, 3]]
    np.testing.assert_array_equal(t.to_numpy(), np.ones((4, 3), np.float32))
    assert layout.mesh is mesh and layout.local_shape(1) == [Dim("batch_tp_1"), 3]


def test_the_active_mesh_is_not_a_default_device():
    # In MAX the context feeds spec-first NamedMapping constructions only: tensor creation without
    # device= keeps the default device and distribute takes its target explicitly.
    before = defaults()
    with mesh_context(_mesh(2)):
        assert defaults() == before
        t = Tensor.zeros([2])
        assert not isinstance(t, DistributedTensor) and t.device == before[1]


# ─── is_fully_resolved, priorities, from_spec ────────────────────────────


def test_is_fully_resolved_as_the_pages_define_it():
    mesh = _mesh(2)
    # PlacementMapping: "Returns True; placement mappings are always fully concrete."
    assert PlacementMapping(mesh, (Sharded(0),)).is_fully_resolved
    assert PlacementMapping(mesh, (Partial(),)).is_fully_resolved
    # NamedMapping: False only with compiler-only priorities.
    assert NamedMapping(mesh, ("tp", None)).is_fully_resolved
    prioritized = NamedMapping(mesh, ("tp", None), _priorities=(1, None))
    assert not prioritized.is_fully_resolved and prioritized.priorities == (1, None)
    assert not prioritized.is_fully_replicated  # from the spec, no placements needed
    # DeviceMapping declares it; TensorLayout answers for its mapping.
    assert "is_fully_resolved" in vars(DeviceMapping)
    assert TensorLayout(DType.float32, [4, 2], mesh).is_fully_resolved
    layout = TensorLayout(DType.float32, [4, 2], prioritized)
    assert not layout.is_fully_resolved and not layout.is_fully_replicated


def test_priorities_have_no_placements():
    prioritized = NamedMapping(_mesh(2), ("tp", None), _priorities=(0, 1))
    with pytest.raises(ConversionError, match=r"priorities \(0, 1\) are compiler-only"):
        prioritized.to_placements()
    with pytest.raises(ConversionError, match="compiler-only"):
        sharding.distribute(Tensor(np.ones((2, 2), np.float32)), prioritized)
    with pytest.raises(ValueError, match=r"priorities length \(1\) must match spec length \(2\)"):
        NamedMapping(_mesh(2), ("tp", None), _priorities=(0,))
    with pytest.raises(ValueError, match="spec entry 2"):
        TensorLayout(DType.float32, [4, 2], NamedMapping(_mesh(2), (None, None, "tp"), _priorities=(0, 0, 0)))


def test_named_mapping_fields_follow_the_page():
    # NamedMapping(_mesh, _spec=(), _unreduced=frozenset(), _priorities=(), _memory_kind=None, _original_spec=None)
    mesh = DeviceMesh((CPU(),) * 4, (2, 2), ("dp", "tp"))
    m = NamedMapping(mesh, ("dp", None), frozenset({"tp"}), (), "pinned_host")
    assert (m.mesh, m.spec, m.unreduced, m.priorities, m.memory_kind) == (mesh, ("dp", None), {"tp"}, (), "pinned_host")
    assert m.to_placements() == (Sharded(0), Partial()) and m.to_named_sharding(2) is m
    assert "memory_kind='pinned_host'" in repr(m)
    assert NamedMapping(mesh).spec == () and NamedMapping(mesh).is_fully_replicated
    assert dataclasses.replace(m, _memory_kind=None) == NamedMapping(mesh, ("dp", None), frozenset({"tp"}))
    assert len({m, NamedMapping(mesh, ("dp", None), frozenset({"tp"}), (), "pinned_host")}) == 1
    assert NamedMapping(mesh, [["dp", "tp"], None]).spec == (("dp", "tp"), None)  # lists read as tuples


def test_named_mapping_errors_name_what_is_expected():
    mesh = _mesh(2)
    with pytest.raises(TypeError, match="expected a DeviceMesh, got CPU"):
        NamedMapping(CPU(), ("tp",))
    with pytest.raises(TypeError, match=r"spec entry 0 must be a mesh axis name, a tuple of names or None, got 0"):
        NamedMapping(mesh, (0,))
    with pytest.raises(TypeError, match="one entry per tensor dim, got str 'tp'"):
        NamedMapping(mesh, "tp")
    with pytest.raises(TypeError, match=r"got the string 'tp' \(write \{'tp'\}\)"):
        NamedMapping(mesh, (None,), "tp")
    with pytest.raises(TypeError, match="priorities are ints or None, got str"):
        NamedMapping(mesh, ("tp",), _priorities=("high",))
    with pytest.raises(TypeError, match="memory_kind is a str"):
        NamedMapping(mesh, ("tp",), _memory_kind=1)
    with pytest.raises(TypeError, match="got both _spec and spec"):
        NamedMapping(mesh, ("tp",), spec=(None,))
    with pytest.raises(ValueError, match="used for both sharding and unreduced"):
        NamedMapping(mesh, ("tp",), frozenset({"tp"}))
    with pytest.raises(ConversionError, match="already assigned to a different tensor dimension"):
        NamedMapping(mesh, ("tp", "tp")).to_placements()


# ─── Sharded(axis, even=True) ────────────────────────────────────────────


def test_sharded_even_defaults_true_and_is_a_field():
    # class max.experimental.sharding.Sharded(axis, even=True); even: bool = True
    assert Sharded(0).even is True and Sharded(0, even=False).even is False and Sharded(axis=1, even=True) == Sharded(1)
    assert Sharded(0) != Sharded(0, even=False) and repr(Sharded(0, even=False)) == "Sharded(axis=0, even=False)"
    assert (
        Sharded(2).localized_axis() == 2
        and Replicated().localized_axis() is None
        and Partial().localized_axis() is None
    )
    with pytest.raises(TypeError, match="even must be a bool, got str"):
        Sharded(0, even="yes")
    with pytest.raises(TypeError, match=r"axis must be an int \(the tensor axis to split\), got str"):
        Sharded("0")


@pytest.mark.parametrize("even", [True, False])
def test_even_changes_nothing_for_static_dims(even):
    # The page: even concerns dynamic axes; "StaticDim parents use uneven divmod".
    mesh = _mesh(2)
    t = Tensor.full([5, 3], 2.0, device=PlacementMapping(mesh, (Sharded(0, even=even),)))
    assert [list(map(int, s.shape)) for s in t.local_shards] == [[3, 3], [2, 3]]
    value = np.arange(10, dtype=np.float32).reshape(5, 2)
    d = sharding.distribute(Tensor(value), PlacementMapping(mesh, (Sharded(0, even=even),)))
    np.testing.assert_array_equal(d.local_shards[1].to_numpy(), value[3:])
    np.testing.assert_array_equal(d.to_numpy(), value)


# ─── the modules' own examples ───────────────────────────────────────────


@pytest.mark.parametrize(
    "module",
    [
        "maxfx.experimental.sharding",
        "maxfx.experimental.sharding._mesh",
        "maxfx.experimental.sharding._mappings",
        "maxfx.experimental.sharding._placements",
        "maxfx.experimental.sharding._layout",
    ],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
