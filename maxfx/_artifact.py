"""The artifact `maxfx.export` writes: `ExportedModel`, `load_exported`, `is_exported_artifact`.

One zip file: ``maxfx_export.json`` (format, input/output types, weight names,
dtypes and shapes, and the ``jax.export.Exported`` fields: avals with symbolic
dims, platforms, calling convention), ``program.mlirbc`` (the StableHLO module
as MLIR bytecode, as ``Exported.mlir_module_serialized``) and
``weights/<i>.bin`` (raw little-endian bytes). Loading rebuilds the
``Exported`` and needs only maxfx (and JAX): no Python code of the model.
(JAX's own ``Exported.serialize`` needs the optional ``flatbuffers`` package;
the fields are stored directly instead, so the artifact works without it.)

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
import os
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.compile import InputMismatchError, check_input_types
from lowering.dims import StaticDim
from lowering.dtypes import DType
from lowering.targets import export_checks
from lowering.types import DeviceRef, TensorType
from lowering.x64 import x64
from maxfx.driver import CPU, Accelerator, accelerator_count
from maxfx.driver._device import as_device
from maxfx.driver._tensor import as_array
from maxfx.experimental._tensor import Tensor, _leaf

__all__ = ["ArtifactProgram", "ExportedModel", "is_exported_artifact", "load_exported", "platform_of", "program_trees"]

_FORMAT = "maxfx.export"
_VERSION = 1
_META = "maxfx_export.json"
_PROGRAM = "program.mlirbc"


def platform_of(device: jax.Device) -> str:
    """The ``jax.export`` platform name of a JAX device (``"cpu"``, ``"cuda"``, ``"rocm"``)."""
    if device.platform != "gpu":
        return device.platform
    version = str(getattr(device.client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version or "hip" in version else "cuda"


def _type_json(t: TensorType) -> dict[str, Any]:
    return {"dtype": t.dtype.name, "shape": [d.dim if isinstance(d, StaticDim) else str(d) for d in t.shape]}


def _type_from_json(d: Mapping[str, Any]) -> TensorType:
    return TensorType(DType[d["dtype"]], d["shape"], DeviceRef.CPU())


def _encode_exported(exp: Any) -> dict[str, Any]:
    """The fields of a ``jax.export.Exported`` as JSON (the module bytes are stored separately)."""
    if any(s is not None for s in (*exp.in_shardings_hlo, *exp.out_shardings_hlo)) or exp.nr_devices != 1:
        raise ValueError(f"maxfx.export: sharded programs ({exp.nr_devices} devices) are not supported; export the single-device model")
    if exp.ordered_effects or exp.unordered_effects:
        raise ValueError(f"maxfx.export: programs with side effects ({exp.ordered_effects + exp.unordered_effects}) cannot be exported")
    aval = lambda a: {"shape": [str(d) for d in a.shape], "dtype": str(a.dtype)}  # noqa: E731
    return {
        "fun_name": exp.fun_name,
        "in_avals": [aval(a) for a in exp.in_avals],
        "out_avals": [aval(a) for a in exp.out_avals],
        "platforms": list(exp.platforms),
        "calling_convention_version": exp.calling_convention_version,
        "module_kept_var_idx": list(exp.module_kept_var_idx),
        "uses_global_constants": bool(exp.uses_global_constants),
        "disabled_safety_checks": [str(c) for c in exp.disabled_safety_checks],
    }


def program_trees(n_inputs: int, n_weights: int, n_outputs: int) -> tuple[Any, Any]:
    """The in/out pytree structures of ``program(args, weights)``."""
    return jax.tree.structure((([0] * n_inputs, [0] * n_weights), {})), jax.tree.structure((0,) * n_outputs)


def _decode_check(text: str, where: str) -> Any:
    """A stored disabled safety check: only the custom-call targets `lowering.targets.export_checks` writes."""
    allowed = {str(c): c for c in export_checks(("cuda",))}
    if text not in allowed:
        raise ValueError(f"{where}: unsupported disabled safety check {text!r} (maxfx artifacts only disable {sorted(allowed)})")
    return allowed[text]


def _decode_exported(fields: Mapping[str, Any], module: bytes, n_inputs: int, where: str) -> Any:
    checks = tuple(_decode_check(c, where) for c in fields.get("disabled_safety_checks", ()))
    scope = jax.export.SymbolicScope()

    def aval(d: Mapping[str, Any]) -> Any:
        shape = jax.export.symbolic_shape(",".join(d["shape"]), scope=scope) if d["shape"] else ()
        return jax.core.ShapedArray(shape, jnp.dtype(d["dtype"]))

    in_avals = tuple(aval(a) for a in fields["in_avals"])
    out_avals = tuple(aval(a) for a in fields["out_avals"])
    in_tree, out_tree = program_trees(n_inputs, len(in_avals) - n_inputs, len(out_avals))
    try:
        return jax.export.Exported(
            fun_name=fields["fun_name"],
            in_tree=in_tree,
            in_avals=in_avals,
            out_tree=out_tree,
            out_avals=out_avals,
            nr_devices=1,
            in_shardings_hlo=(None,) * len(in_avals),
            out_shardings_hlo=(None,) * len(out_avals),
            _in_named_shardings=(None,) * len(in_avals),
            _out_named_shardings=(None,) * len(out_avals),
            platforms=tuple(fields["platforms"]),
            ordered_effects=(),
            unordered_effects=(),
            disabled_safety_checks=checks,
            mlir_module_serialized=module,
            calling_convention_version=int(fields["calling_convention_version"]),
            module_kept_var_idx=tuple(fields["module_kept_var_idx"]),
            uses_global_constants=bool(fields["uses_global_constants"]),
            _get_vjp=None,
        )
    except TypeError as e:  # the Exported dataclass changed between JAX versions
        raise ValueError(f"{where}: this JAX ({jax.__version__}) cannot rebuild the exported program: {e}") from e


class ExportedModel:
    """An exported model: callable on Tensors/arrays; `save`/`serialize` write the artifact.

    Made by `export` and `load_exported`. Calls check inputs against
    `input_types` (symbolic dims accept any size) and compile once per new
    input shape.

    Attributes:
        name: the model's name.
        input_types: one ``TensorType`` per input (symbolic dims as exported).
        output_types: one ``TensorType`` per output.
        platforms: the JAX platforms the StableHLO was lowered for.
    """

    def __init__(self, exported: Any, name: str, input_types: Sequence[TensorType], output_types: Sequence[TensorType], weights: Mapping[str, np.ndarray], is_tuple: bool, device: Any = None):
        self._exported = exported
        self.name = name
        self.input_types = list(input_types)
        self.output_types = list(output_types)
        self._host_weights = dict(weights)
        self._is_tuple = is_tuple
        self._device = device
        self._placed: list[Any] | None = None
        self._call = jax.jit(lambda args, ws: exported.call(args, ws))

    # -- properties -----------------------------------------------------------
    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self._exported.platforms)

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """Weight name → value (host numpy arrays), as stored in the artifact."""
        return dict(self._host_weights)

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

    def _run(self, arrays: Sequence[Any]) -> list[Any]:
        platform = platform_of(self.device.jax_device)
        if platform not in self.platforms:
            raise RuntimeError(f"exported model {self.name!r} was lowered for {list(self.platforms)}, not for {platform} ({self.device}); export with platforms=[..., {platform!r}]")
        target = self.device.jax_device
        with x64():
            if self._placed is None:
                self._placed = [jax.device_put(self._host_weights[n], target) for n in sorted(self._host_weights)]
            args = [jax.device_put(a, target) for a in arrays]
            return list(self._call(args, self._placed))

    def _arrays(self, args: Sequence[Any]) -> list[Any]:
        out = []
        for a, t in zip(args, self.input_types):
            if isinstance(a, Tensor):
                out.append(a._array())
            elif isinstance(a, (int, float, bool, np.generic)):
                out.append(np.asarray(a, dtype=t.dtype.to_numpy()))
            else:
                out.append(as_array(a))
        return out + [as_array(a) for a in args[len(self.input_types):]]

    def __call__(self, *args: Any) -> Any:
        """Run on Tensors or arrays; returns a Tensor (or a tuple for multi-output models).

        Raises:
            ValueError: an input's dtype or shape does not match `input_types`.
        """
        arrays = self._arrays(args)
        try:
            self._check(arrays)
        except InputMismatchError as e:
            raise ValueError(f"exported model {self.name!r}: {e}") from None
        outs = tuple(_leaf(o) for o in self._run(arrays))
        return outs if self._is_tuple else outs[0]

    # -- serialization --------------------------------------------------------
    def serialize(self) -> bytes:
        """The artifact as bytes (a zip: metadata JSON, serialized jax.export program, raw weights)."""
        names = sorted(self._host_weights)
        meta = {
            "format": _FORMAT,
            "version": _VERSION,
            "name": self.name,
            "inputs": [_type_json(t) for t in self.input_types],
            "outputs": [_type_json(t) for t in self.output_types],
            "is_tuple": self._is_tuple,
            "jax_version": jax.__version__,
            "exported": _encode_exported(self._exported),
            "weights": [
                {"name": n, "dtype": DType.from_numpy(self._host_weights[n].dtype).name, "shape": list(self._host_weights[n].shape), "file": f"weights/{i}.bin"}
                for i, n in enumerate(names)
            ],
        }
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr(_META, json.dumps(meta, indent=1))
            z.writestr(_PROGRAM, bytes(self._exported.mlir_module_serialized))
            for w in meta["weights"]:
                z.writestr(w["file"], np.ascontiguousarray(self._host_weights[w["name"]]).tobytes())  # native (little-endian) order
        return buf.getvalue()

    def save(self, path: str | os.PathLike) -> Path:
        """Write the artifact to ``path``; returns the path."""
        path = Path(path)
        path.write_bytes(self.serialize())
        return path

    def __repr__(self) -> str:
        return f"ExportedModel({self.name!r}, inputs={[str(t) for t in self.input_types]}, platforms={list(self.platforms)})"


class ArtifactProgram:
    """An `ExportedModel` presented as the compiled block an engine ``Model`` runs.

    ``InferenceSession().load(path)`` wraps a loaded artifact in one, so
    ``execute`` returns driver Tensors as for a loaded Graph.
    """

    _buffer_inputs: list[int] = []

    class _Var:
        def __init__(self, t: TensorType):
            self.type = t

    class _Block:
        def __init__(self, inputs: list, outputs: list):
            self.inputs = inputs
            self.outputs = outputs

    def __init__(self, exported: ExportedModel):
        self._exported = exported
        self.block = self._Block([self._Var(t) for t in exported.input_types], [self._Var(t) for t in exported.output_types])

    def check_inputs(self, args: Sequence[Any], names: Sequence[str] | None = None) -> None:
        self._exported._check(args, names)

    def __call__(self, args: Sequence[Any], donate_buffers: bool = False) -> tuple[list[Any], list[Any]]:
        # An exported program has no buffer inputs, so there is nothing to donate.
        return self._exported._run(args), []

    def lower_text(self, args: Sequence[Any], donate_buffers: bool = False) -> str:
        return self._exported.stablehlo()


# ─── loading ───────────────────────────────────────────────────────────────


def _read_bytes(path_or_bytes: Any) -> bytes:
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return bytes(path_or_bytes)
    if isinstance(path_or_bytes, (str, os.PathLike)):
        return Path(path_or_bytes).read_bytes()
    raise TypeError(f"load_exported: expected a path or bytes, got {type(path_or_bytes).__name__}")


def is_exported_artifact(path_or_bytes: Any) -> bool:
    """Whether ``path_or_bytes`` is an artifact written by `ExportedModel.save`/`serialize`."""
    try:
        source = io.BytesIO(_read_bytes(path_or_bytes)) if isinstance(path_or_bytes, (bytes, bytearray, memoryview)) else os.fspath(path_or_bytes)
        if not zipfile.is_zipfile(source):
            return False
        with zipfile.ZipFile(source) as z:
            return _META in z.namelist()
    except (OSError, TypeError):
        return False


def load_exported(path_or_bytes: str | os.PathLike | bytes, *, device: Any = None) -> ExportedModel:
    """Load an artifact written by `export` (a path or bytes); returns a callable `ExportedModel`.

    Args:
        path_or_bytes: the file (``model.save(path)``) or ``model.serialize()`` bytes.
        device: the driver device to run on (default: the first device of the
            platform the artifact was exported for).

    Raises:
        ValueError: the data is not a maxfx export artifact, or it is corrupt or of
            an unknown format version.

    Example:
        >>> import numpy as np, maxfx
        >>> from maxfx.graph import TensorType
        >>> from maxfx.dtype import DType
        >>> from maxfx.experimental import functional as F
        >>> art = maxfx.export(lambda x: F.relu(x) * 2, TensorType(DType.float32, ["n"]))
        >>> maxfx.load_exported(art.serialize())(np.array([-1.0, 3.0], np.float32)).to_numpy()
        array([0., 6.], dtype=float32)
    """
    data = _read_bytes(path_or_bytes)
    where = f"load_exported({path_or_bytes!r})" if not isinstance(path_or_bytes, (bytes, bytearray, memoryview)) else "load_exported(<bytes>)"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if _META not in z.namelist():
                raise ValueError(f"{where}: not a maxfx export artifact (no {_META}); write one with maxfx.export(...).save(path)")
            meta = json.loads(z.read(_META))
            if meta.get("format") != _FORMAT or meta.get("version") != _VERSION:
                raise ValueError(f"{where}: unsupported artifact format {meta.get('format')!r} version {meta.get('version')!r} (this maxfx reads {_FORMAT!r} version {_VERSION})")
            exported = _decode_exported(meta["exported"], z.read(_PROGRAM), len(meta["inputs"]), where)
            weights = {}
            for w in meta["weights"]:
                raw = z.read(w["file"])
                weights[w["name"]] = np.frombuffer(raw, dtype=DType[w["dtype"]].to_numpy()).reshape(w["shape"])
    except zipfile.BadZipFile as e:
        raise ValueError(f"{where}: not a maxfx export artifact ({e})") from None
    except (KeyError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: corrupt maxfx export artifact ({type(e).__name__}: {e})") from None
    dev = as_device(device, "load_exported") if device is not None else None
    return ExportedModel(
        exported,
        meta["name"],
        [_type_from_json(t) for t in meta["inputs"]],
        [_type_from_json(t) for t in meta["outputs"]],
        weights,
        bool(meta["is_tuple"]),
        dev,
    )
