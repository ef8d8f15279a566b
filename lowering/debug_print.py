"""How ``ops.print`` shows a tensor: MAX's debug-print styles and its ``.max`` tensor files.

``InferenceSession.set_debug_print_options`` picks one `PrintStyle` per
session; a model's print ops follow its session's options at run time:

- ``COMPACT`` (the default): ``label = tensor([[1.0000, 2.0000, 3.0000, ...,
  6.0000, 7.0000, 8.0000]], dtype=f32, shape=[8])``, MAX's layout: the last
  two axes print as a matrix of rows (a vector is one row, hence ``[[...]]``),
  rows, matrices and elements beyond 6 show their first and last three around
  ``...``; floats with 4 decimals.
- ``FULL``: ``label = tensor<8xf32> [1.000000e+00, ...]``, every element in
  scientific notation with ``precision`` digits.
- ``BINARY``: the raw bytes to ``{output_directory}/{label}`` (read back with
  ``Buffer.mmap``, giving dtype and shape).
- ``BINARY_MAX_CHECKPOINT``: ``{output_directory}/{label}.max``, the bytes with
  their dtype and shape (MAX's tensor-dump format, read back with
  ``load_max_buffer``).
- ``NONE``: nothing.

A session that did not pick a style follows ``DebugConfig.print_style``
(``MODULAR_DEBUG=print-style=FULL``); binary styles set that way write to the
current directory.

Example:
    >>> import numpy as np
    >>> print(format_compact("x", np.arange(8, dtype=np.float32)))
    x = tensor([[0.0000, 1.0000, 2.0000, ..., 5.0000, 6.0000, 7.0000]], dtype=f32, shape=[8])
    >>> print(format_full("x", np.array([1.5, 2.0], np.float32), precision=2))
    x = tensor<2xf32> [1.50e+00, 2.00e+00]
"""

from __future__ import annotations

import builtins
import contextlib
import os
import struct
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np

from lowering.debug_options import DEBUG, PrintStyle
from lowering.dtypes import DType

__all__ = [
    "PrintStyle",
    "PrintOptions",
    "DEFAULT_PRINT_OPTIONS",
    "print_options_in_effect",
    "using_print_options",
    "emit_tensor",
    "format_compact",
    "format_full",
    "write_max_checkpoint",
    "read_max_checkpoint",
]


_STYLE_ERROR = (
    "Invalid debug print style. Please use one of 'COMPACT', 'FULL', 'BINARY', 'BINARY_MAX_CHECKPOINT', or 'NONE'."
)


class PrintOptions:
    """One session's debug-print settings; `set` checks them as MAX does.

    Example:
        >>> options = PrintOptions()
        >>> options.set("FULL", precision=3); options.style_now, options.precision
        (<PrintStyle.FULL: 1>, 3)
        >>> options.set("BINARY")
        Traceback (most recent call last):
            ...
        ValueError: Debug print output directory cannot be empty.
    """

    __slots__ = ("style", "precision", "output_directory")

    def __init__(self) -> None:
        self.style: PrintStyle | None = None  # None: the process's DebugConfig.print_style
        self.precision = 6
        self.output_directory = ""

    def set(
        self,
        style: str | PrintStyle = PrintStyle.COMPACT,
        precision: int = 6,
        output_directory: str | os.PathLike | None = None,
    ) -> None:
        """Replace the settings; nothing changes when one is refused.

        Raises:
            TypeError: an unknown style, a non-int precision for ``FULL``, or a
                directory that is not a str or Path.
            ValueError: a binary style without an output directory.
        """
        if isinstance(style, str):
            style = getattr(PrintStyle, style, style)
        if not isinstance(style, PrintStyle):
            raise TypeError(_STYLE_ERROR)
        if style is PrintStyle.FULL and (not isinstance(precision, int) or isinstance(precision, bool)):
            raise TypeError(f"Debug print precision must be an int, got {type(precision).__name__} {precision!r}.")
        directory = ""
        if style in (PrintStyle.BINARY, PrintStyle.BINARY_MAX_CHECKPOINT):
            if output_directory is not None and not isinstance(output_directory, (str, os.PathLike)):
                raise TypeError(
                    f"Debug print output directory must be a str or Path, got {type(output_directory).__name__}."
                )
            directory = os.fspath(output_directory) if output_directory is not None else ""
            if not directory:
                raise ValueError("Debug print output directory cannot be empty.")
        self.style, self.precision, self.output_directory = style, precision, directory

    @property
    def style_now(self) -> PrintStyle:
        """The style prints follow now: the one `set` chose, else ``DebugConfig.print_style``."""
        return self.style if self.style is not None else DEBUG.print_style

    def __repr__(self) -> str:
        return (
            f"PrintOptions(style={self.style_now.name}, precision={self.precision}, "
            f"output_directory={self.output_directory!r})"
        )


DEFAULT_PRINT_OPTIONS = PrintOptions()
"""What prints follow outside a session's execution (eager tensors, ``jax.jit``-ed graph functions)."""

_in_effect = [DEFAULT_PRINT_OPTIONS]
_session_lock = threading.RLock()


def print_options_in_effect() -> PrintOptions:
    """The options print callbacks follow right now."""
    return _in_effect[-1]


@contextlib.contextmanager
def using_print_options(options: PrintOptions) -> Iterator[None]:
    """Run a session's model under its print options.

    Print callbacks run on XLA's threads, so the options are process state;
    models with print ops run one at a time under this lock, and the caller
    waits for the callbacks (``jax.effects_barrier``) before leaving, so every
    print of the execution follows these options and is out when it returns.
    """
    with _session_lock:
        _in_effect.append(options)
        try:
            yield
            jax.effects_barrier()
        finally:
            _in_effect.pop()


# ─── Text styles ──────────────────────────────────────────────────────────

# MAX prints dtypes with their MLIR element-type names (``dtype=f32``).
_SHORT = {
    DType.bool: "bool",
    DType.float16: "f16",
    DType.bfloat16: "bf16",
    DType.float32: "f32",
    DType.float64: "f64",
    DType.int8: "si8",
    DType.int16: "si16",
    DType.int32: "si32",
    DType.int64: "si64",
    DType.uint8: "ui8",
    DType.uint16: "ui16",
    DType.uint32: "ui32",
    DType.uint64: "ui64",
}

_EDGE = 3  # MAX shows the first and last three of a long axis ...
_ELIDE_AT = 7  # ... once it has seven or more


def _short_name(a: np.ndarray) -> str:
    dtype = DType.from_numpy(a.dtype)
    return _SHORT.get(dtype, dtype.name)


def _element_formatter(a: np.ndarray, float_format: str) -> Any:
    if a.dtype == np.bool_:
        return lambda v: "True" if v else "False"
    if a.dtype.kind in "iu":
        return lambda v: str(int(v))
    return lambda v: format(float(v), float_format)


def _row(values: np.ndarray, fmt: Any) -> str:
    n = len(values)
    if n < _ELIDE_AT:
        return "[" + ", ".join(fmt(v) for v in values) + "]"
    head = ", ".join(fmt(v) for v in values[:_EDGE])
    tail = ", ".join(fmt(v) for v in values[n - _EDGE :])
    return f"[{head}, ..., {tail}]"


def _elided(n: int) -> Iterator[tuple[int, bool]]:
    """(index, whether ``...`` follows it) for the items MAX shows of ``n``."""
    i = 0
    while i < n:
        skip = n >= _ELIDE_AT and i == _EDGE - 1
        yield i, skip
        i = n - _EDGE if skip else i + 1


def format_compact(label: str, array: Any) -> str:
    """``label = tensor([[...]], dtype=f32, shape=[...])``: MAX's ``COMPACT`` style.

    The last two axes are a matrix (a vector is a matrix of one row); rows are
    separated by ``,\\n``; the matrices of the leading axes follow one another
    inside one bracket per leading axis.

    Example:
        >>> print(format_compact("m", np.array([[1, 2], [3, 4]], np.int32)))
        m = tensor([[1, 2],
        [3, 4]], dtype=si32, shape=[2, 2])
    """
    a = np.asarray(array)
    shape = f"shape=[{', '.join(str(d) for d in a.shape)}]"
    fmt = _element_formatter(a, ".4f")
    if a.ndim == 0:
        return f"{label} = tensor({fmt(a[()])}, dtype={_short_name(a)}, {shape})"
    rows = a.shape[-2] if a.ndim >= 2 else 1
    matrices = a.reshape(-1, rows, a.shape[-1])
    out = ["[" * (a.ndim - 2)]
    for m, skip_matrices in _elided(len(matrices)):
        out.append(",\n[" if m else "[")
        for r, skip_rows in _elided(rows):
            out.append(("\n" if r else "") + _row(matrices[m, r], fmt) + ("," if r != rows - 1 else ""))
            if skip_rows:
                out.append("\n..., ")
        out.append("]")
        if skip_matrices:
            out.append("\n..., ")
    out.append("]" * (a.ndim - 2))
    return f"{label} = tensor({''.join(out)}, dtype={_short_name(a)}, {shape})"


def format_full(label: str, array: Any, precision: int = 6) -> str:
    """``label = tensor<2x3xf32> [...]``: MAX's ``FULL`` style, every element in order.

    Example:
        >>> print(format_full("v", np.array([[1, 2], [3, 4]], np.int64)))
        v = tensor<2x2xsi64> [1, 2, 3, 4]
    """
    a = np.asarray(array)
    fmt = _element_formatter(a, f".{precision}e")
    dims = "".join(f"{d}x" for d in a.shape)
    return f"{label} = tensor<{dims}{_short_name(a)}> [{', '.join(fmt(v) for v in a.reshape(-1))}]"


def _emit(text: str) -> None:
    builtins.print(text, file=sys.stdout, flush=True)


def emit_tensor(label: str, array: Any) -> None:
    """Show one printed tensor as the options in effect say (the print op's run-time callback)."""
    options = print_options_in_effect()
    style = options.style_now
    if style is PrintStyle.NONE:
        return
    if style is PrintStyle.COMPACT:
        _emit(format_compact(label, array))
    elif style is PrintStyle.FULL:
        _emit(format_full(label, array, options.precision))
    else:
        directory = Path(options.output_directory)
        directory.mkdir(parents=True, exist_ok=True)
        if style is PrintStyle.BINARY:
            (directory / label).write_bytes(np.asarray(array).tobytes())  # tobytes is C order
        else:
            write_max_checkpoint(directory / f"{label}.max", label, array)


def emit_message(label: str, message: str) -> None:
    """Show a printed string (``label = message``); binary styles and ``NONE`` write nothing."""
    if print_options_in_effect().style_now in (PrintStyle.COMPACT, PrintStyle.FULL):
        _emit(f"{label} = {message}")


# ─── The .max tensor file ─────────────────────────────────────────────────
#
# MAX's layout (what its ``load_max_buffer`` reads), native byte order:
#   8 bytes  magic b"\x93\xf0\x9f\x94\xa5++\x93"
#   uint32   major version (0), uint32 minor version (1)
#   uint64   metadata size: the bytes from the key size to the data offset, inclusive
#   uint32   key size, then the key (the print label, UTF-8)
#   uint8    dtype (the DType enum value), uint8 rank, rank x uint32 dims
#   uint64   offset of the data from the start of the file
#   the elements, C order

_MAGIC = b"\x93\xf0\x9f\x94\xa5\x2b\x2b\x93"
_VERSION = (0, 1)


def write_max_checkpoint(path: str | os.PathLike, label: str, array: Any) -> None:
    """Write ``array`` to ``path`` in MAX's ``.max`` layout, keyed by ``label``.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "h.max"
        >>> write_max_checkpoint(path, "h", np.arange(6, dtype=np.int32).reshape(2, 3))
        >>> read_max_checkpoint(path)
        (<DType.int32: 139>, (2, 3), 47)
    """
    a = np.asarray(array)  # not ascontiguousarray: it turns a scalar into shape (1,)
    key = label.encode()
    if a.ndim > 255 or any(d >= 2**32 for d in a.shape):
        raise ValueError(
            f"write_max_checkpoint: shape {list(a.shape)} does not fit the .max header (rank < 256, dims < 2**32)"
        )
    dims = struct.pack(f"={a.ndim}I", *a.shape)
    metadata_size = 4 + len(key) + 2 + len(dims) + 8
    offset = len(_MAGIC) + 8 + 8 + metadata_size
    header = b"".join(
        [
            _MAGIC,
            struct.pack("=2I", *_VERSION),
            struct.pack("=Q", metadata_size),
            struct.pack("=I", len(key)),
            key,
            struct.pack("=2B", DType.from_numpy(a.dtype).value, a.ndim),
            dims,
            struct.pack("=Q", offset),
        ]
    )
    with open(path, "wb") as f:
        f.write(header)
        f.write(a.tobytes())  # C order whatever the strides


def read_max_checkpoint(path: str | os.PathLike) -> tuple[DType, tuple[int, ...], int]:
    """(dtype, shape, data offset) of the one tensor in the ``.max`` file ``path``.

    Raises:
        ValueError: not a ``.max`` file, a newer major version, or more than one tensor.
    """
    with open(path, "rb") as f:
        if f.read(8) != _MAGIC:
            raise ValueError(
                f'{path} is not a max checkpoint. If this file was saved from the "BINARY" debug print option (and not '
                '"BINARY_MAX_CHECKPOINT"), please initialize `Buffer.mmap` directly.'
            )
        major, _minor = struct.unpack("=2I", f.read(8))
        if major > 0:
            raise ValueError(f"{path}: unable to read .max version {major} (this reader knows version 0)")
        (metadata_size,) = struct.unpack("=Q", f.read(8))
        (key_size,) = struct.unpack("=I", f.read(4))
        f.read(key_size)
        code, rank = struct.unpack("=2B", f.read(2))
        shape = struct.unpack(f"={rank}I", f.read(4 * rank))
        (offset,) = struct.unpack("=Q", f.read(8))
    if 4 + key_size + 2 + 4 * rank + 8 != metadata_size:
        raise ValueError(f"{path}: multiple buffers found in .max file; this is currently not supported")
    return DType(code), tuple(shape), offset
