"""Compiling blocks with XLA, cached.

`CompiledBlock` turns a top-level `Block` into a callable: it checks the inputs
against the block's types, binds symbolic dims, and runs one XLA executable per
concrete input signature. Executables are cached process-wide by
``(block structure hash, input avals, weight avals, device)``, so identical
graphs share them and a loop that rebuilds the same graph compiles once.
Weights are arguments of the executable, never baked-in constants.
A block that calls subgraphs at its top level runs as pieces instead
(`lowering.piecewise`): one executable per subgraph, shared by its call sites,
and one per run of nodes between calls.

Set ``MAXFX_COMPILATION_CACHE_DIR`` (or call `enable_persistent_cache`) to also
keep executables on disk across processes, at two levels: JAX's persistent
cache (keyed by the HLO, for every jitted program including eager realization)
and, for compiled blocks, a maxfx cache keyed by the block's structure key, the
argument avals, the device and a fingerprint of the lowering code. A maxfx hit
skips tracing and lowering as well as XLA, so a second process loads a model in
a small fraction of the first compile time. Blocks whose params have no stable
identity across processes (Python callables of custom ops) skip the maxfx level.

The maxfx level stores no executable and no pickle: an entry is the block's
program as a `jax.export` artifact (StableHLO in a versioned flatbuffer) behind
a header with a magic, a format version, the entry's own key and the SHA-256 of
the payload, all checked before the payload is parsed. XLA executables live only
in JAX's level, keyed by the HLO of the program an entry rebuilds, and stored
there behind the same header (`persistent_cache`), so the two levels cannot
disagree: a missing, damaged or foreign entry at either level is a miss. Writes are atomic (a temporary file in the same
folder, then
``os.replace``), so concurrent writers and readers see a whole entry or none.
A bad cache path (a file, not creatable, not writable) in the environment
variable disables the cache with one warning.

Buffer inputs (the values a graph mutates) can be donated: called with
``donate_buffers=True`` (as `InferenceSession` models do), the executable
reuses a written buffer's memory for its new value instead of copying it, so a
decode step does not copy the whole KV-cache pool. The caller must rebind its
handle to the returned final value: the donated array is deleted. Donation is
skipped (the inputs are copied as before) when a buffer's array is also another
argument or a weight, which XLA cannot alias, and for op-by-op graphs.
"""

from __future__ import annotations

import faulthandler
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from lowering import persistent_cache
from lowering.debug import DEBUG, DebugInterpreter
from lowering.dims import bind_symbols
from lowering.dtypes import DType
from lowering.executables import EXECUTABLES
from lowering.interpret import Interpreter, block_is_data_dependent, run_block
from lowering.ir import Block, uses_op
from lowering.logs import CACHE_LOG, compiling
from lowering.persistent_cache import DamagedEntryError, decode_entry, enable_persistent_cache, encode_entry
from lowering.piecewise import Pieces, split_at_calls
from lowering.targets import export_for
from lowering.types import BufferType
from lowering.x64 import jit, run, to_device

__all__ = [
    "CompiledBlock",
    "InputMismatchError",
    "block_program",
    "compile_stats",
    "enable_persistent_cache",
    "clear_cache",
]

_lock = threading.Lock()
_stats = {"compiles": 0, "hits": 0, "disk_hits": 0}


class InputMismatchError(ValueError):
    """An argument does not match the graph input type it is bound to."""


def compile_stats() -> dict[str, int]:
    """Counts since start: executables built (``compiles``, including ``disk_hits`` loaded from the
    persistent cache) and in-memory cache ``hits`` (for tests and benchmarks)."""
    return dict(_stats)


def clear_cache() -> None:
    """Drop every cached executable (of every mode: they share `EXECUTABLES`)."""
    EXECUTABLES.clear()


def _aval_key(x: Any) -> tuple:
    return (tuple(x.shape), str(x.dtype))


def check_input_types(types: Sequence[Any], args: Sequence[Any], names: Sequence[str] | None = None) -> dict[str, int]:
    """Check the dtype and dims of each of ``args`` against ``types`` (tensor types); returns the symbol binding.

    Raises:
        InputMismatchError: naming the input, the expected type and what was given.
    """
    if len(args) != len(types):
        raise InputMismatchError(f"expected {len(types)} inputs, got {len(args)}")
    env: dict[str, int] = {}
    for i, (t, a) in enumerate(zip(types, args)):
        label = f"input {i}" + (f" ({names[i]!r})" if names and names[i] else "")
        got_dtype = DType.from_numpy(a.dtype)
        if got_dtype is not t.dtype:
            raise InputMismatchError(
                f"{label}: expected dtype {t.dtype.name}, got {got_dtype.name} (expected type {t})"
            )
        err = bind_symbols(t.shape, a.shape, env)
        if err:
            raise InputMismatchError(f"{label}: shape {list(a.shape)} does not match {t}: {err}")
    return env


def block_program(
    block: Block, interpreter: Callable[[Mapping[str, Any]], Interpreter] | None = None
) -> Callable[[Sequence[Any], Sequence[Any] | None, Mapping[str, Any]], tuple[list[Any], list[Any]]]:
    """``block`` as a JAX function ``program(args, buffers, weights) -> (outputs, final buffer-input values)``.

    The one such closure: compiled blocks, their persistent-cache entries, virtual-device lowering and
    ``maxfx.export`` jit or export it. ``weights`` maps names to arrays. ``buffers`` is None when ``args`` holds the
    buffer inputs, else their values kept apart so that jit can donate just them (their slots in ``args`` are
    ignored). ``interpreter(weights)`` runs the nodes (default: a plain `Interpreter`).

    Example:
        >>> from lowering.ir import Var
        >>> from lowering.types import TensorType
        >>> x = Var(TensorType(DType.float32, [2]))
        >>> block_program(Block("id", [x], [], [x]))([np.ones(2, np.float32)], None, {})
        ([array([1., 1.], dtype=float32)], [])
    """
    buffer_inputs = [i for i, v in enumerate(block.inputs) if isinstance(v.type, BufferType)]

    def program(args, buffers, weights):
        full = list(args)
        for i, b in zip(buffer_inputs, buffers or ()):
            full[i] = b
        outs, finals = run_block(block, full, weights, None if interpreter is None else interpreter(weights))
        return outs, [finals[i] for i in buffer_inputs]

    return program


class CompiledBlock:
    """A block ready to run on a device with bound weights.

    Args:
        block: the top-level block (inputs, nodes, outputs).
        weights: weight name → array (numpy or jax), passed to every call.
        device: the JAX device to run on.
    """

    def __init__(self, block: Block, weights: Mapping[str, Any], device: jax.Device):
        self.block = block
        self.device = device
        self.weights = {k: to_device(v, device) for k, v in weights.items()}
        self._weight_key = tuple(sorted((k, _aval_key(v)) for k, v in self.weights.items()))
        # MAX's debug options read at compile time: a NaN check or op log runs the graph node by node.
        nan_check, log_ops = DEBUG.compile_options()
        if (
            DEBUG.stack_trace_on_crash
        ):  # MAX prints a stack trace on fatal signals; Python's faulthandler does for every thread
            faulthandler.enable()
        debug = nan_check or log_ops
        self._interpreted = debug or block_is_data_dependent(block)
        self._buffer_inputs = [i for i, v in enumerate(block.inputs) if isinstance(v.type, BufferType)]
        self.prints = uses_op(block.nodes, "print")  # a run then follows its session's print options
        self._weight_buffers = {_buffer_id(w) for w in self.weights.values()}
        # Top-level subgraph calls compile once per subgraph, not once per call site (lowering.piecewise).
        pieces = split_at_calls(block) if not (self._interpreted or self._buffer_inputs) else []
        self._pieces = Pieces(block, pieces, device) if pieces else None

        interpreter = partial(DebugInterpreter, nan_check=nan_check, log_ops=log_ops, sync=DEBUG.device_sync_mode)
        self._program = block_program(block, interpreter if debug else None)

    def check_inputs(self, args: Sequence[Any], names: Sequence[str] | None = None) -> dict[str, int]:
        """Check dtypes/ranks/dims of ``args``; returns the symbol binding.

        Raises:
            InputMismatchError: naming the input, the expected type and what was given.
        """
        return check_input_types([v.type for v in self.block.inputs], args, names)

    def _place(self, args: Sequence[Any]) -> list[Any]:
        return [
            a if isinstance(a, jax.Array) and self.device in a.devices() else to_device(a, self.device) for a in args
        ]

    def _split(self, args: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """(args with None at the buffer inputs, the buffer inputs): the program's first two arguments."""
        rest = list(args)
        for i in self._buffer_inputs:
            rest[i] = None
        return rest, [args[i] for i in self._buffer_inputs]

    def _can_donate(self, args: Sequence[Any]) -> bool:
        """Whether the buffer inputs of ``args`` (placed arrays) can be donated.

        XLA rejects donating a buffer that the same call also reads through another
        argument or a weight (``f(a, donate(a))``), so any such sharing turns donation off.
        """
        if not self._buffer_inputs or self._interpreted:
            return False
        donated = [_buffer_id(args[i]) for i in self._buffer_inputs]
        if len(set(donated)) != len(donated) or self._weight_buffers.intersection(donated):
            return False
        others = {_buffer_id(a) for i, a in enumerate(args) if i not in self._buffer_inputs}
        return others.isdisjoint(donated)

    def _executable(self, args: Sequence[Any], donate: bool = False) -> Any:
        """The cached XLA executable for these argument shapes (compiled on first use); ``donate``: buffer inputs
        donated.
        """
        key = (
            "block",
            self.block.structure_key(),
            tuple(_aval_key(a) for a in args),
            self._weight_key,
            self.device.id,
            self.device.platform,
            donate,
        )
        exe = EXECUTABLES.get(key)
        if exe is not None:
            with _lock:
                _stats["hits"] += 1
            return exe
        disk = _disk_path(self.block, key, self.device) if persistent_cache.configure() is not None else None
        if disk is None:
            with compiling("block", self.block.name):
                lowered = self._jit(donate).lower(*self._split(args), self.weights)
                _dump_ir(self.block.name, lowered)
                exe = lowered.compile()
            loaded = False
        else:
            exe, loaded = self._executable_via_disk(disk, args, donate)
        with _lock:
            _stats["compiles"] += 1
            _stats["disk_hits"] += loaded
        EXECUTABLES.put(key, exe)
        return exe

    def _executable_via_disk(self, disk: _DiskEntry, args: Sequence[Any], donate: bool) -> tuple[Any, bool]:
        """(executable, whether the maxfx entry was a hit): the program comes from ``disk`` or is exported and stored
        there.

        Either way the executable is compiled from the exported program, so JAX's
        level holds it under the same HLO in the process that wrote the entry and
        in every process that reads it.
        """
        exported = _disk_load(disk)
        if exported is not None:
            CACHE_LOG.info("disk hit: block %r from %s", self.block.name, disk.path)
            return self._compile_exported(exported, args, donate), True
        CACHE_LOG.debug("disk miss: block %r (%s)", self.block.name, disk.path.name)
        with compiling("block", self.block.name):
            exported = self._export(args)
            if exported is None:
                return self._jit(donate).lower(*self._split(args), self.weights).compile(), False
            exe = self._compile_exported(exported, args, donate)
        _disk_store(disk, exported)
        return exe, False

    def _export(self, args: Sequence[Any]) -> jax.export.Exported | None:
        """The program for ``args`` as a `jax.export.Exported`, or None for programs export refuses (e.g. host
        callbacks).
        """
        specs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (*self._split(args), self.weights))
        try:
            return export_for(self._program, (self.device.client.platform,), *specs, retarget=False)
        except Exception as e:  # noqa: BLE001 - not exportable: compile directly and keep only JAX's level
            CACHE_LOG.debug("block %r is not exportable, not stored in the maxfx level: %s", self.block.name, e)
            return None

    def _compile_exported(self, exported: jax.export.Exported, args: Sequence[Any], donate: bool) -> Any:
        return (
            jit(exported.call, donate_argnums=(1,) if donate else ()).lower(*self._split(args), self.weights).compile()
        )

    def _jit(self, donate: bool) -> Any:
        """The program as a `lowering.x64.jit` (traced with 64-bit types); ``donate``: buffer inputs donated."""
        return jit(self._program, donate_argnums=(1,) if donate else ())

    def precompile(self, args: Sequence[Any], donate_buffers: bool = False) -> None:
        """Compile for the shapes of ``args`` without running (no-op for op-by-op graphs)."""
        if self._pieces is not None:
            self._run_pieces(self._place(args), compile_only=True)
        elif not self._interpreted:
            args = self._place(args)
            self._executable(args, donate_buffers and self._can_donate(args))

    def _run_pieces(self, args: list[Any], compile_only: bool = False) -> list[Any]:
        before = self._pieces.compiles
        outs = self._pieces.run(args, self.weights, self.check_inputs(args), compile_only=compile_only)
        with _lock:
            _stats["compiles"] += self._pieces.compiles - before
        return outs

    def __call__(self, args: Sequence[Any], donate_buffers: bool = False) -> tuple[list[Any], list[Any]]:
        """Run on ``args`` (arrays); returns (outputs, final buffer-input values).

        ``donate_buffers``: let the executable reuse the buffer inputs' memory for
        their final values (see the module docstring). The buffer-input arrays
        passed in are then deleted; only the returned finals may be read.
        """
        # 64-bit types: the transfers, the tracing and the op-by-op run enter them (lowering.x64);
        # A compiled executable keeps the dtypes it was compiled for, but its host callbacks
        # (debug prints, MAX checkpoints) receive their arrays under the caller's mode: it runs under `run`.
        args = self._place(args)
        if self._interpreted:
            result = run(self._program, *self._split(args), self.weights)
        elif self._pieces is not None:
            result = run(self._run_pieces, args), args
        else:
            donate = donate_buffers and self._can_donate(args)
            result = run(self._executable(args, donate), *self._split(args), self.weights)
        if DEBUG.device_sync_mode:  # MAX's device-sync-mode: a failure surfaces at this call, not a later read
            jax.block_until_ready(result)
        return result

    def optimized_hlo(self, avals: Sequence[Any]) -> str:
        """XLA's optimized HLO of the whole program for inputs of ``avals`` (``(shape, dtype)`` pairs).

        Compiled as one program (subgraph calls inlined), as `lower_text` lowers it.
        """
        args = [jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in avals]
        return self._jit(False).lower(*self._split(args), self.weights).compile().as_text()

    def lower_text(self, args: Sequence[Any], donate_buffers: bool = False, platform: str | None = None) -> str:
        """StableHLO text of the program for ``args`` (for inspection); ``donate_buffers`` marks the buffer inputs
        donated.

        ``platform`` (a JAX platform name, e.g. ``"cuda"``): lower for that platform
        instead of the local device, through ``jax.export`` and `lowering.targets`,
        so a CPU-only machine shows the program a GPU would run, kernels included.
        """
        args = [np.asarray(a) for a in args]
        donate = donate_buffers and bool(self._buffer_inputs)
        if platform is None:
            return self._jit(donate).lower(*self._split(args), self.weights).as_text()
        (rest, buffers), weights = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), (self._split(args), self.weights)
        )
        return export_for(
            self._program, (platform,), rest, buffers, weights, donate_argnums=(1,) if donate else ()
        ).mlir_module()


def _dump_ir(name: str, lowered: Any) -> None:
    """MAX's ``ir_output_dir``: the StableHLO of a program XLA is about to compile, as ``{dir}/{name}.N.mlir``."""
    directory = DEBUG.ir_output_dir
    if directory:
        os.makedirs(directory, exist_ok=True)
        with _lock:
            n = _stats["compiles"]
        Path(directory, f"{name}.{n}.mlir").write_text(lowered.as_text())


def _buffer_id(a: Any) -> int:
    """Identity of the memory behind ``a``: its device buffer's address where it has one buffer, else the object."""
    try:
        return a.unsafe_buffer_pointer()
    except Exception:  # noqa: BLE001 - numpy, sharded or deleted arrays: fall back to object identity
        return id(a)


# ─── the maxfx level of the persistent cache ────────────────────────────────

_portable: dict[str, bool] = {}
_fingerprint: list[str] = []


def _code_fingerprint() -> str:
    """Hash of the lowering and kernel sources plus JAX/XLA versions and flags: an edit invalidates entries."""
    if not _fingerprint:
        h = hashlib.sha256(f"{jax.__version__} {os.environ.get('XLA_FLAGS', '')}".encode())
        root = Path(__file__).resolve().parent
        for folder in (root, root.parent / "custom_calls"):
            for f in sorted(folder.rglob("*.py")):
                h.update(f.read_bytes())
        _fingerprint.append(h.hexdigest())
    return _fingerprint[0]


class _DiskEntry(NamedTuple):
    """Where an entry lives and the key it must carry (SHA-256 of the full cache key)."""

    path: Path
    key: bytes


def _disk_path(block: Block, key: tuple, device: jax.Device) -> _DiskEntry | None:
    """The entry for ``key``, or None when the block's params are not stable across processes."""
    skey = key[1]
    if skey not in _portable:
        text = repr(block._structure())
        # Default reprs (" at 0x...") and id-based keys name objects of this process only.
        _portable[skey] = " at 0x" not in text and "('obj', " not in text and "('var', 'id'," not in text
    if not _portable[skey]:
        return None
    digest = hashlib.sha256(repr((key, device.device_kind, _code_fingerprint())).encode()).digest()
    return _DiskEntry(persistent_cache.disk_dir() / f"{digest.hex()}{ENTRY_SUFFIX}", digest)


# An entry: `persistent_cache.encode_entry` of `jax.export.Exported.serialize()` bytes.
ENTRY_SUFFIX = ".mxc"


def _disk_load(entry: _DiskEntry) -> jax.export.Exported | None:
    """The exported program stored at ``entry``, or None (a miss) when it is absent, damaged or foreign."""
    try:
        data = entry.path.read_bytes()
    except OSError:
        return None
    try:
        payload = decode_entry(data, entry.key)
    except DamagedEntryError as e:
        CACHE_LOG.info("ignoring damaged cache entry %s: %s", entry.path, e)
        return None
    try:
        # The hash matched, so these are the bytes this cache wrote; a failure here means another JAX version.
        return jax.export.deserialize(bytearray(payload))
    except Exception as e:  # noqa: BLE001 - an artifact this JAX cannot read is a miss; it is rewritten
        CACHE_LOG.info("ignoring unreadable cache entry %s: %s", entry.path, e)
        return None


def _disk_store(entry: _DiskEntry, exported: jax.export.Exported) -> None:
    """Write ``exported`` at ``entry`` atomically: readers see the old file or the whole new one, never a part."""
    data = encode_entry(entry.key, bytes(exported.serialize()))
    try:
        fd, tmp = tempfile.mkstemp(dir=entry.path.parent, prefix=entry.path.name + ".", suffix=".tmp")
    except OSError as e:
        CACHE_LOG.info("cannot write cache entry %s: %s", entry.path, e)
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, entry.path)
    except OSError as e:
        CACHE_LOG.info("cannot write cache entry %s: %s", entry.path, e)
        Path(tmp).unlink(missing_ok=True)
