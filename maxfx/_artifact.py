"""The artifact `maxfx.export` writes: `ExportedModel`, `load_exported`, `is_exported_artifact`.

One zip file, every entry stored uncompressed:

* ``maxfx_export.json``: the format name and version, the model's name, each
  weight's name, dtype and shape, and the device mesh of a sharded program;
* ``program.jaxexport``: the program, ``jax.export.Exported.serialize(vjp_order=1)``
  (StableHLO with symbolic dims, shardings, platforms and the first-order VJP);
* ``weights/<i>.bin``: the raw little-endian bytes of weight ``i``, the
  program's arguments after the inputs.

Loading needs only maxfx and JAX, no Python code of the model, and the format
holds no pickle: a hostile file can at most be a program that computes
something else. `load_exported` checks everything before returning (the
program parses, the weights' dtypes and shapes are the program's arguments,
every entry's size and CRC), so a damaged artifact raises `ArtifactError`
naming the file and the part, not an error at the first call.

This module reads, writes and runs artifacts; `maxfx._export` makes them. The
engine loads one by path (``InferenceSession().load(path)``) through here.

Example:
    >>> import numpy as np, maxfx
    >>> from maxfx.graph import TensorType
    >>> from maxfx.dtype import DType
    >>> art = maxfx.export(lambda x: x * 2, TensorType(DType.float32, ["n"]))
    >>> is_exported_artifact(art.serialize()), is_exported_artifact(b"not a zip")
    (True, False)
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lowering.compile import InputMismatchError, check_input_types
from lowering.dtypes import DType
from lowering.targets import export_checks
from lowering.types import DeviceRef, TensorType
from lowering.x64 import jit, to_device
from maxfx.driver import CPU, Accelerator, accelerator_count
from maxfx.driver._device import as_device
from maxfx.driver._tensor import as_array
from maxfx.experimental._tensor import Tensor, _leaf

__all__ = [
    "ArtifactError",
    "ArtifactProgram",
    "ExportedModel",
    "is_exported_artifact",
    "load_exported",
    "mesh_json",
    "platform_of",
    "program_tree",
]

_FORMAT = "maxfx.export"
_VERSION = 2
_META = "maxfx_export.json"
_PROGRAM = "program.jaxexport"
_META_LIMIT = 1 << 20  # bytes: the metadata is a few KB even for thousands of weights
_PLATFORMS = frozenset({"cpu", "cuda", "rocm", "tpu"})


class ArtifactError(ValueError):
    """A file or bytes that is not a readable maxfx export artifact: damaged, foreign or of another format version."""


def platform_of(device: jax.Device) -> str:
    """The ``jax.export`` platform name of a JAX device (``"cpu"``, ``"cuda"``, ``"rocm"``)."""
    if device.platform != "gpu":
        return device.platform
    version = str(getattr(device.client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version or "hip" in version else "cuda"


def program_tree(n_inputs: int, n_weights: int) -> Any:
    """The input pytree structure of every exported ``program(inputs, weights)``: two tuples of arrays."""
    return jax.tree.structure((((0,) * n_inputs, (0,) * n_weights), {}))


def mesh_json(mesh: Any) -> dict[str, Any]:
    """The parts of a mesh ``Exported.in_shardings_jax`` checks: axis names, sizes and types."""
    return {
        "axis_names": list(mesh.axis_names),
        "axis_sizes": [int(s) for s in mesh.axis_sizes],
        "axis_types": [t.name for t in mesh.axis_types],
    }


def _tensor_type(aval: Any) -> TensorType:
    dims = [d if isinstance(d, int) else _dim_name(str(d)) for d in aval.shape]
    return TensorType(DType.from_numpy(aval.dtype), dims, DeviceRef.CPU())


def _dim_name(text: str) -> str:
    # Output dims may be expressions ("2*batch"); Dim names must be identifiers, so spell them out.
    return text if text.isidentifier() else "expr_" + re.sub(r"\W+", "_", text).strip("_")


class ExportedModel:
    """An exported model: callable on Tensors/arrays; `save`/`serialize` write the artifact.

    Made by `export` and `load_exported`. Calls check inputs against
    `input_types` (symbolic dims accept any size) and compile once per new
    input shape. `call` takes and returns JAX arrays and composes with
    ``jax.jit``/``jax.grad``; calling with Tensors under ``maxfx.grad`` works too.

    Attributes:
        name: the model's name.
        input_types: one ``TensorType`` per input (symbolic dims as exported).
        output_types: one ``TensorType`` per output.
        platforms: the JAX platforms the StableHLO was lowered for.
    """

    def __init__(
        self,
        exported: Any,
        program: bytes,
        name: str,
        weights: Mapping[str, np.ndarray],
        mesh: Mapping[str, Any] | None = None,
        device: Any = None,
    ):
        self._exported = exported
        self._program = bytes(program)
        self.name = name
        self._host_weights = dict(weights)  # in argument order
        n_inputs = len(exported.in_avals) - len(self._host_weights)
        self.input_types = [_tensor_type(a) for a in exported.in_avals[:n_inputs]]
        self.output_types = [_tensor_type(a) for a in exported.out_avals]
        self._is_tuple = exported.out_tree != jax.tree.structure(0)
        self._mesh = dict(mesh) if mesh else None
        self._device = device
        self._placement: tuple[list[Any], list[Any]] | None = None  # input shardings, placed weights
        self._call = jit(exported.call)  # traced with 64-bit types (lowering.x64)

    # -- properties -----------------------------------------------------------
    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self._exported.platforms)

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """Weight name → value (host numpy arrays), as stored in the artifact."""
        return dict(self._host_weights)

    @property
    def nr_devices(self) -> int:
        """How many devices the program runs on (more than 1 for a sharded export)."""
        return int(self._exported.nr_devices)

    @property
    def differentiable(self) -> bool:
        """Whether the artifact carries its VJP, so ``jax.grad``/``maxfx.grad`` can go through `call`."""
        return bool(self._exported.has_vjp())

    @property
    def device(self) -> Any:
        """The driver device calls run on (the exported platform's first device unless given)."""
        if self._device is None:
            gpu = any(p in ("cuda", "rocm") for p in self.platforms) and accelerator_count() > 0
            self._device = Accelerator() if gpu and "cpu" not in self.platforms[:1] else CPU()
        return self._device

    def stablehlo(self) -> str:
        """The exported StableHLO module as text (symbolic dims appear as dynamic sizes)."""
        return str(self._exported.mlir_module())

    # -- running ----------------------------------------------------------------
    def _check(self, arrays: Sequence[Any], names: Sequence[str] | None = None) -> None:
        check_input_types(self.input_types, arrays, names)

    def _devices(self) -> list[Any]:
        """The JAX devices the program runs on: the chosen device, or the first ``nr_devices`` of its platform."""
        target = self.device.jax_device
        platform = platform_of(target)
        if platform not in self.platforms:
            raise RuntimeError(
                f"exported model {self.name!r} was lowered for {list(self.platforms)}, not for {platform} "
                f"({self.device}); export with platforms=[..., {platform!r}]"
            )
        if self.nr_devices == 1:
            return [target]
        devices = [d for d in jax.devices(target.platform)]
        if len(devices) < self.nr_devices:
            raise RuntimeError(
                f"exported model {self.name!r} is sharded over {self.nr_devices} devices; this process has "
                f"{len(devices)} {platform} device(s)"
            )
        return devices[: self.nr_devices]

    def _placed(self) -> tuple[list[Any], list[Any]]:
        """The input shardings and the weights on their devices (placed on the first call)."""
        if self._placement is None:
            devices = self._devices()
            if self.nr_devices == 1:
                shardings = [jax.sharding.SingleDeviceSharding(devices[0])] * len(self._exported.in_avals)
            else:
                shardings = self._sharded_placement(devices)
            n_inputs = len(self.input_types)
            weights = [to_device(w, s) for w, s in zip(self._host_weights.values(), shardings[n_inputs:])]
            self._placement = (shardings[:n_inputs], weights)
        return self._placement

    def _sharded_placement(self, devices: list[Any]) -> list[Any]:
        # Exported.in_shardings_jax wants a mesh with the export's axis names, sizes and types.
        replicated = NamedSharding(Mesh(np.array(devices), ("devices",)), PartitionSpec())
        if self._mesh is None:
            return [replicated] * len(self._exported.in_avals)
        types = tuple(jax.sharding.AxisType[t] for t in self._mesh["axis_types"])
        mesh = Mesh(
            np.array(devices).reshape(self._mesh["axis_sizes"]), tuple(self._mesh["axis_names"]), axis_types=types
        )
        return [
            s if s is not None else NamedSharding(mesh, PartitionSpec()) for s in self._exported.in_shardings_jax(mesh)
        ]

    def _run(self, arrays: Sequence[Any]) -> list[Any]:
        shardings, weights = self._placed()
        args = tuple(to_device(a, s) for a, s in zip(arrays, shardings))
        out = self._call(args, tuple(weights))
        return list(out) if self._is_tuple else [out]

    def call(self, *arrays: Any) -> Any:
        """Run on JAX/numpy arrays; returns a JAX array (a tuple for multi-output models).

        Works on tracers: ``jax.grad(lambda x: m.call(x).sum())(x)`` differentiates
        through the stored VJP (`differentiable`), and ``jax.jit`` inlines the program.

        Raises:
            ValueError: an input's dtype or shape does not match `input_types`.
        """
        arrays = self._arrays(arrays)
        try:
            self._check(arrays)
        except InputMismatchError as e:
            raise ValueError(f"exported model {self.name!r}: {e}") from None
        outs = self._run(arrays)
        return tuple(outs) if self._is_tuple else outs[0]

    def _arrays(self, args: Sequence[Any]) -> list[Any]:
        out = []
        for a, t in zip(args, self.input_types):
            if isinstance(a, Tensor):
                out.append(a._array())
            elif isinstance(a, (int, float, bool, np.generic)):
                out.append(np.asarray(a, dtype=t.dtype.to_numpy()))
            elif isinstance(a, jax.core.Tracer):
                out.append(a)
            else:
                out.append(as_array(a))
        return out + [as_array(a) for a in args[len(self.input_types) :]]

    def __call__(self, *args: Any) -> Any:
        """Run on Tensors or arrays; returns a Tensor (or a tuple for multi-output models).

        Raises:
            ValueError: an input's dtype or shape does not match `input_types`.
        """
        outs = self.call(*args)
        return tuple(_leaf(o) for o in outs) if self._is_tuple else _leaf(outs)

    # -- serialization --------------------------------------------------------
    def serialize(self) -> bytes:
        """The artifact as bytes (a zip: metadata JSON, the serialized ``jax.export`` program, raw weights)."""
        meta = {
            "format": _FORMAT,
            "version": _VERSION,
            "name": self.name,
            "jax_version": jax.__version__,
            "mesh": self._mesh,
            "weights": [
                {"name": n, "dtype": DType.from_numpy(w.dtype).name, "shape": list(w.shape)}
                for n, w in self._host_weights.items()
            ],
        }
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr(_META, json.dumps(meta, indent=1))
            z.writestr(_PROGRAM, self._program)
            for i, w in enumerate(self._host_weights.values()):
                z.writestr(
                    _weight_entry(i), np.ascontiguousarray(w).astype(w.dtype.newbyteorder("<"), copy=False).tobytes()
                )
        return buf.getvalue()

    def save(self, path: str | os.PathLike) -> Path:
        """Write the artifact to ``path``; returns the path."""
        path = Path(path)
        path.write_bytes(self.serialize())
        return path

    def __repr__(self) -> str:
        return (
            f"ExportedModel({self.name!r}, inputs={[str(t) for t in self.input_types]}, "
            f"platforms={list(self.platforms)})"
        )


def _weight_entry(i: int) -> str:
    return f"weights/{i}.bin"


class ArtifactProgram:
    """An `ExportedModel` presented as the compiled block an engine ``Model`` runs.

    ``InferenceSession().load(path)`` wraps a loaded artifact in one, so
    ``execute`` returns driver Tensors as for a loaded Graph.
    """

    _buffer_inputs: list[int] = []
    prints = False  # jax.export refuses host callbacks, so an artifact holds no print ops

    class _Var:
        def __init__(self, t: TensorType):
            self.type = t

    class _Block:
        def __init__(self, inputs: list, outputs: list):
            self.inputs = inputs
            self.outputs = outputs

    def __init__(self, exported: ExportedModel):
        self._exported = exported
        self.block = self._Block(
            [self._Var(t) for t in exported.input_types], [self._Var(t) for t in exported.output_types]
        )

    def check_inputs(self, args: Sequence[Any], names: Sequence[str] | None = None) -> None:
        self._exported._check(args, names)

    def __call__(self, args: Sequence[Any], donate_buffers: bool = False) -> tuple[list[Any], list[Any]]:
        # An exported program has no buffer inputs, so there is nothing to donate.
        return self._exported._run(args), []

    def lower_text(self, args: Sequence[Any], donate_buffers: bool = False) -> str:
        return self._exported.stablehlo()


# ─── loading ───────────────────────────────────────────────────────────────


def _zip_source(path_or_bytes: Any) -> Any:
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(path_or_bytes))
    if isinstance(path_or_bytes, (str, os.PathLike)):
        return os.fspath(path_or_bytes)
    raise TypeError(f"load_exported: expected a path or bytes, got {type(path_or_bytes).__name__}")


def is_exported_artifact(path_or_bytes: Any) -> bool:
    """Whether ``path_or_bytes`` is a zip with the metadata entry `ExportedModel.save`/`serialize` write."""
    try:
        source = _zip_source(path_or_bytes)
        if not zipfile.is_zipfile(source):
            return False
        with zipfile.ZipFile(source) as z:
            return _META in z.namelist()
    except (OSError, TypeError, zipfile.BadZipFile):
        return False


def _read_entry(z: zipfile.ZipFile, name: str, size: int | None, limit: int, fail: Any) -> bytes:
    """Entry ``name``'s bytes, read only after its header says it is stored and at most ``limit`` bytes long.

    Artifacts store entries uncompressed, so nothing is inflated: a deflate bomb
    is refused by its header, and a stored entry is never longer than the file.
    zipfile checks the CRC once the last byte is read.
    """
    try:
        info = z.getinfo(name)
    except KeyError:
        raise fail(f"the entry {name!r} is missing") from None
    if info.compress_type != zipfile.ZIP_STORED:
        raise fail(
            f"the entry {name!r} is compressed (method {info.compress_type}); maxfx artifacts store entries "
            "uncompressed"
        )
    if size is not None and info.file_size != size:
        raise fail(f"the entry {name!r} holds {info.file_size} bytes, expected {size}")
    if info.file_size > limit:
        raise fail(f"the entry {name!r} holds {info.file_size} bytes, more than the {limit} allowed")
    with z.open(info) as f:
        data = f.read(info.file_size + 1)
    if len(data) != info.file_size:
        raise fail(f"the entry {name!r} holds {len(data)} bytes, its header says {info.file_size}")
    return data


def _require(ok: bool, fail: Any, message: str) -> None:
    if not ok:
        raise fail(message)


def _check_meta(meta: Any, fail: Any) -> None:
    """The metadata's fields and types (the version was checked first)."""
    _require(isinstance(meta.get("name"), str), fail, f"'name' must be a string, got {meta.get('name')!r}")
    weights = meta.get("weights")
    _require(isinstance(weights, list), fail, f"'weights' must be a list, got {type(weights).__name__}")
    names = set()
    for i, w in enumerate(weights):
        _require(isinstance(w, dict), fail, f"weight {i} must be an object, got {w!r}")
        name, dtype, shape = w.get("name"), w.get("dtype"), w.get("shape")
        _require(
            isinstance(name, str) and name not in names,
            fail,
            f"weight {i}: the name {name!r} must be a string not used by another weight",
        )
        names.add(name)
        _require(
            isinstance(dtype, str) and dtype in DType.__members__, fail, f"weight {name!r}: unknown dtype {dtype!r}"
        )
        _require(
            isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape),
            fail,
            f"weight {name!r}: the shape {shape!r} must be a list of sizes >= 0",
        )
    mesh = meta.get("mesh")
    if mesh is not None:
        _require(isinstance(mesh, dict), fail, f"'mesh' must be null or an object, got {mesh!r}")
        axis_names, sizes, types = mesh.get("axis_names"), mesh.get("axis_sizes"), mesh.get("axis_types")
        _require(
            isinstance(axis_names, list)
            and all(isinstance(n, str) for n in axis_names)
            and len(set(axis_names)) == len(axis_names),
            fail,
            f"mesh axis_names {axis_names!r} must be distinct strings",
        )
        _require(
            isinstance(sizes, list) and len(sizes) == len(axis_names) and all(type(s) is int and s >= 1 for s in sizes),
            fail,
            f"mesh axis_sizes {sizes!r} must be one size >= 1 per axis",
        )
        _require(
            isinstance(types, list)
            and len(types) == len(axis_names)
            and all(t in jax.sharding.AxisType.__members__ for t in types),
            fail,
            f"mesh axis_types {types!r} must be one of {list(jax.sharding.AxisType.__members__)} per axis",
        )


def _check_version(meta: Any, fail: Any) -> None:
    _require(
        isinstance(meta, dict) and meta.get("format") == _FORMAT,
        fail,
        f"the metadata does not name the format {_FORMAT!r}",
    )
    version = meta.get("version")
    _require(type(version) is int, fail, f"the format version {version!r} is not an integer")
    if version > _VERSION:
        raise fail(
            f"it was written by a newer maxfx (format version {version}); this maxfx reads version {_VERSION}: upgrade "
            "maxfx"
        )
    if version < _VERSION:
        raise fail(
            f"it has format version {version}, which stored private jax.export fields and is no longer read; this "
            f"maxfx reads version {_VERSION}: export the model again"
        )


def _check_checks(exported: Any, fail: Any) -> None:
    """Only the custom-call targets `lowering.targets.export_checks` writes may skip jax.export's checks."""
    allowed = {str(c) for c in export_checks(("cuda",))}
    for c in exported.disabled_safety_checks:
        _require(
            str(c) in allowed,
            fail,
            f"unsupported disabled safety check {str(c)!r} (maxfx artifacts only disable {sorted(allowed)})",
        )


def _load_program(blob: bytes, weights: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], fail: Any) -> Any:
    """Deserialize the program and check it against the metadata: shapes, trees, devices, checks."""
    try:
        exported = jax.export.deserialize(bytearray(blob))
    except Exception as e:  # flatbuffers and jax raise many types on damaged bytes
        raise fail(f"{_PROGRAM} cannot be deserialized ({type(e).__name__}: {e})") from None
    n_weights = len(weights)
    n_inputs = len(exported.in_avals) - n_weights
    _require(
        n_inputs >= 0 and exported.in_tree == program_tree(n_inputs, n_weights),
        fail,
        f"the program takes {exported.in_tree}, not (inputs, {n_weights} weights)",
    )
    leaves = jax.tree.structure((0,) * len(exported.out_avals))
    _require(
        exported.out_tree in (leaves, jax.tree.structure(0)),
        fail,
        f"the program returns {exported.out_tree}, not an array or a tuple of arrays",
    )
    _require(not exported.ordered_effects and not exported.unordered_effects, fail, "the program has side effects")
    _require(
        set(exported.platforms) <= _PLATFORMS and len(exported.platforms) > 0,
        fail,
        f"unknown platforms {list(exported.platforms)}",
    )
    _check_checks(exported, fail)
    for i, (w, aval) in enumerate(zip(weights, exported.in_avals[n_inputs:])):
        want = (tuple(w["shape"]), DType[w["dtype"]].to_numpy())
        _require(
            (tuple(aval.shape), aval.dtype) == want,
            fail,
            f"weight {i} ({w['name']!r}) is {w['dtype']}{w['shape']} in the metadata but {aval.str_short()} in the "
            "program",
        )
    mesh = meta.get("mesh")
    if exported.nr_devices > 1 and mesh is not None:
        _require(
            math.prod(mesh["axis_sizes"]) == exported.nr_devices,
            fail,
            f"the mesh {mesh['axis_sizes']} does not have the program's {exported.nr_devices} devices",
        )
        try:
            exported.in_shardings_jax(
                jax.sharding.AbstractMesh(
                    tuple(mesh["axis_sizes"]),
                    tuple(mesh["axis_names"]),
                    axis_types=tuple(jax.sharding.AxisType[t] for t in mesh["axis_types"]),
                )
            )
        except ValueError as e:
            raise fail(f"the mesh in the metadata is not the program's: {e}") from None
    try:
        exported.mlir_module()  # parse the StableHLO now, not at the first call
    except Exception as e:
        raise fail(f"the StableHLO in {_PROGRAM} cannot be parsed ({type(e).__name__}: {e})") from None
    return exported


def _open(z: zipfile.ZipFile, fail: Any, size_limit: int) -> tuple[dict[str, Any], Any, bytes, dict[str, np.ndarray]]:
    if _META not in z.namelist():
        raise fail(f"not a maxfx export artifact (no {_META}); write one with maxfx.export(...).save(path)")
    try:
        meta = json.loads(_read_entry(z, _META, None, _META_LIMIT, fail))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        if isinstance(e, ArtifactError):
            raise
        raise fail(f"{_META} is not valid JSON ({type(e).__name__}: {e})") from None
    _check_version(meta, fail)
    _check_meta(meta, fail)
    blob = _read_entry(z, _PROGRAM, None, size_limit, fail)
    exported = _load_program(blob, meta["weights"], meta, fail)
    weights = {}
    for i, w in enumerate(meta["weights"]):
        dtype = DType[w["dtype"]].to_numpy()
        raw = _read_entry(z, _weight_entry(i), math.prod(w["shape"]) * dtype.itemsize, size_limit, fail)
        weights[w["name"]] = (
            np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(w["shape"])
        )
    return meta, exported, blob, weights


def load_exported(path_or_bytes: str | os.PathLike | bytes, *, device: Any = None) -> ExportedModel:
    """Load an artifact written by `export` (a path or bytes); returns a callable `ExportedModel`.

    Everything is checked here, before anything runs: a damaged artifact raises
    `ArtifactError` naming the file and the part, never an error at the first call.

    Args:
        path_or_bytes: the file (``model.save(path)``) or ``model.serialize()`` bytes.
        device: the driver device to run on (default: the first device of the
            platform the artifact was exported for). A sharded artifact runs on
            the first ``nr_devices`` devices of that device's platform.

    Raises:
        ArtifactError (a ``ValueError``): not a maxfx export artifact, damaged
            (truncated, bytes changed, entries missing or compressed, metadata
            that disagrees with the program), or of another format version.

    Example:
        >>> import numpy as np, maxfx
        >>> from maxfx.graph import TensorType
        >>> from maxfx.dtype import DType
        >>> from maxfx.experimental import functional as F
        >>> art = maxfx.export(lambda x: F.relu(x) * 2, TensorType(DType.float32, ["n"]))
        >>> maxfx.load_exported(art.serialize())(np.array([-1.0, 3.0], np.float32)).to_numpy()
        array([0., 6.], dtype=float32)
    """
    source = _zip_source(path_or_bytes)
    where = (
        "load_exported(<bytes>)" if isinstance(source, io.BytesIO) else f"load_exported({os.fspath(path_or_bytes)!r})"
    )

    def fail(message: str) -> ArtifactError:
        return ArtifactError(f"{where}: {message}")

    size = source.getbuffer().nbytes if isinstance(source, io.BytesIO) else os.path.getsize(source)
    try:
        with zipfile.ZipFile(source) as z:
            meta, exported, blob, weights = _open(z, fail, size)
    except zipfile.BadZipFile as e:
        raise fail(f"not a maxfx export artifact, or a damaged one ({e})") from None
    except (zipfile.LargeZipFile, EOFError, NotImplementedError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise fail(f"damaged zip ({type(e).__name__}: {e})") from None
    dev = as_device(device, "load_exported") if device is not None else None
    return ExportedModel(exported, blob, meta["name"], weights, meta.get("mesh"), dev)
