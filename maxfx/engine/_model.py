"""`Model`: a loaded program, ready to execute on driver Tensors (made by `InferenceSession.load`).

Example:
    >>> import numpy as np
    >>> from maxfx.engine import InferenceSession
    >>> from maxfx.graph import Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> with Graph("double", input_types=[TensorType(DType.float32, [2])]) as g:
    ...     g.output(g.inputs[0] * 2)
    >>> model = InferenceSession().load(g)
    >>> model.input_metadata
    [TensorSpec(shape=[2], dtype=float32, name='input0')]
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.compile import CompiledBlock, InputMismatchError
from lowering.debug_print import DEFAULT_PRINT_OPTIONS, PrintOptions, using_print_options
from lowering.dtypes import DType, check_weak_array
from lowering.hlo_summary import kernel_summaries
from lowering.ops.core import to_constant_array
from lowering.types import BufferType
from maxfx.driver import Tensor
from maxfx.driver._tensor import as_array

__all__ = ["Model", "MojoValue", "TensorSpec"]


class MojoValue:
    """An opaque non-tensor model output (maxfx models only return tensors)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"MojoValue({self.value!r})"


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (None for symbolic dims) and dtype of a model input or output."""

    shape: list[int | None] | None
    dtype: DType
    name: str = ""

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype.name}, name={self.name!r})"


# Arrays this engine wrote into buffer Tensors (id -> array, weakly). Only these, and host
# numpy memory (copied onto the device per call), are donated: a jax.Array the caller
# wrapped (Tensor.from_dlpack shares it) may still be read through the caller's own name.
_engine_buffers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _donatable(array: Any) -> bool:
    return isinstance(array, np.ndarray) or _engine_buffers.get(id(array)) is array


def _spec(t: Any, name: str) -> TensorSpec:
    dims = [d.dim if d.__class__.__name__ == "StaticDim" else None for d in t.shape]
    return TensorSpec(dims, t.dtype, name)


def require_contiguous(where: str, what: str, x: Any) -> None:
    """Refuse a strided (non-contiguous) array, as MAX does for inputs and weights.

    Raises:
        ValueError: ``x`` is a numpy array or a tensor with ``is_contiguous()`` that is not contiguous.
    """
    if isinstance(x, np.ndarray):
        contiguous = x.flags.c_contiguous
    elif callable(getattr(x, "is_contiguous", None)):
        contiguous = x.is_contiguous()
    else:
        return
    if not contiguous:
        raise ValueError(
            f"{where}: {what} is strided; non-contiguous tensors are not supported (pass a contiguous copy, e.g. "
            "np.ascontiguousarray(x))"
        )


class Model:
    """A loaded graph, ready to execute. Made by `InferenceSession.load`.

    Its print ops follow ``print_options``, its session's (``set_debug_print_options``),
    as they are when it runs.
    """

    def __init__(
        self,
        compiled: CompiledBlock,
        name: str,
        input_names: Sequence[str],
        print_options: PrintOptions = DEFAULT_PRINT_OPTIONS,
    ):
        self._compiled = compiled
        self._name = name
        self._input_names = list(input_names)
        self._print_options = print_options
        self._last_input_avals: list[Any] | None = None  # for kernel_summaries of a graph with symbolic dims

    @property
    def input_metadata(self) -> list[TensorSpec]:
        """One `TensorSpec` per input."""
        return [_spec(v.type, n) for v, n in zip(self._compiled.block.inputs, self._input_names)]

    @property
    def output_metadata(self) -> list[TensorSpec]:
        """One `TensorSpec` per output."""
        return [_spec(v.type, f"output{i}") for i, v in enumerate(self._compiled.block.outputs)]

    @property
    def input_devices(self) -> list[Any]:
        """The driver device each input is expected on (move inputs there with ``.to(...)``)."""
        return [v.type.device.to_device() for v in self._compiled.block.inputs]

    @property
    def output_devices(self) -> list[Any]:
        """The driver device each output is produced on."""
        return [v.type.device.to_device() for v in self._compiled.block.outputs]

    @property
    def kernel_summaries(self) -> list[str]:
        """One string per kernel XLA launches for this model: a fusion as ``Kind(op, op, ...)``, else the op.

        MAX lists its fused Mojo kernels (``"Epilogue(custom__kv_rope, ...)"``);
        maxfx lists the kernels of XLA's optimized program: each fusion with its
        kind (Loop, Input, Output, Custom) and the ops it fuses, and each other
        kernel (``dot``, ``custom-call(target)``...) by name. A graph with
        symbolic dims is summarized for the input shapes of its last execution.

        Raises:
            RuntimeError: the graph has symbolic input dims and has not run yet,
                or the model was loaded from an exported artifact.

        Example:
            >>> import numpy as np
            >>> from maxfx.dtype import DType
            >>> from maxfx.engine import InferenceSession
            >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
            >>> with Graph("g", input_types=[TensorType(DType.float32, [4, 8], DeviceRef.CPU())]) as g:
            ...     g.output(ops.exp(g.inputs[0]) * 2 + 1)
            >>> InferenceSession().load(g).kernel_summaries
            ['Loop(exponential, broadcast, multiply, add)']
        """
        compiled = self._compiled
        if not hasattr(compiled, "optimized_hlo"):
            raise RuntimeError(
                f"Model {self._name!r}: kernel_summaries needs the graph; a model loaded from an exported artifact has "
                "only its compiled program"
            )
        inputs = compiled.block.inputs
        try:
            avals = [(tuple(int(d) for d in v.type.shape), v.type.dtype.to_numpy()) for v in inputs]
        except TypeError:
            if self._last_input_avals is None:
                dims = sorted(
                    {str(d) for v in inputs for d in v.type.shape if not isinstance(d, int) and not str(d).isdigit()}
                )
                raise RuntimeError(
                    f"Model {self._name!r}: kernel_summaries depends on the sizes of the symbolic dims {dims}; execute "
                    "the model once, then read kernel_summaries"
                ) from None
            avals = self._last_input_avals
        return kernel_summaries(compiled.optimized_hlo(avals))

    @property
    def devices(self) -> list[Any]:
        """The distinct devices of the model's inputs and outputs, in order of first use."""
        return list(dict.fromkeys([*self.input_devices, *self.output_devices]))

    def execute(self, *args: Any) -> list[Any]:
        """Run the model on one argument per graph input; returns a list of driver Tensors.

        Arguments may be driver Tensors, numpy/JAX/DLPack arrays, or Python
        scalars and (nested) lists, which are converted to the input's declared
        dtype (``[[1.0, 2.0]]`` for a float32 input) when their values fit it. Buffer inputs must be driver Tensors;
        they are updated
        in place: the executable reuses (donates) their memory when the engine owns it
        (a previous execution's value, or host memory it copies anyway), so a
        step does not copy e.g. a whole KV-cache pool.

        Raises:
            ValueError: an input's dtype or shape does not match the graph (the
                message names the input and the expected type), or a Python
                value does not fit the input's dtype (a float for an int input).
        """
        inputs = self._compiled.block.inputs
        if len(args) != len(inputs):
            raise ValueError(
                f"Model {self._name!r}: expected {len(inputs)} inputs ({', '.join(self._input_names)}), got {len(args)}"
            )
        arrays = []
        for i, (v, a) in enumerate(zip(inputs, args)):
            if isinstance(v.type, BufferType) and not isinstance(a, Tensor):
                raise TypeError(
                    f"Model {self._name!r}: input {i} is a buffer ({v.type}); pass a maxfx.driver.Tensor so it can be "
                    "updated in place"
                )
            if isinstance(a, (int, float, bool, np.generic, list, tuple)) and not isinstance(a, np.ndarray):
                a = self._python_input(i, v.type, a)
            require_contiguous(f"Model {self._name!r}", f"input {i}", a)
            arrays.append(as_array(a))
        try:
            self._compiled.check_inputs(arrays, self._input_names)
        except InputMismatchError as e:
            raise ValueError(f"Model {self._name!r}: {e}") from None
        self._last_input_avals = [(a.shape, a.dtype) for a in arrays]
        # Donated: the executable writes the buffers' new values over their old memory (no copy of
        # e.g. a KV-cache pool per step); the Tensors are rebound to those values right below.
        buffers = self._compiled._buffer_inputs
        donate = all(_donatable(arrays[i]) for i in buffers)
        with self._printing():
            outs, buffer_finals = self._compiled(arrays, donate_buffers=donate)
        for i, final in zip(buffers, buffer_finals):
            args[i]._assign(final)
            _engine_buffers[id(final)] = final
        return [Tensor._from_array(o) for o in outs]

    def _python_input(self, i: int, t: Any, value: Any) -> np.ndarray:
        """A Python scalar or (nested) list for input ``i`` as an array of the input's dtype, as MAX converts Python
        values.

        The values must fit the dtype as MAX's promotion of weak values requires
        (`lowering.dtypes.check_weak_array`: no floats into an int input, ints
        within its range); a numpy scalar keeps its own value, cast.
        """
        dtype = t.dtype
        name = self._input_names[i] if i < len(self._input_names) else f"input {i}"
        where = f"Model {self._name!r}: input {i} ({name!r}, {t})"
        if isinstance(value, np.generic):
            return np.asarray(value, dtype=dtype.to_numpy())
        try:
            to_constant_array(value, None, op=where)  # numbers only; a ragged list is named
            check_weak_array(dtype, np.asarray(value))
        except (TypeError, ValueError) as e:
            msg = str(e).removeprefix(f"{where}: ")
            raise ValueError(
                f"{where}: the Python value does not convert to {dtype}: {msg}; pass a numpy array of dtype "
                f"{dtype.to_numpy()} instead"
            ) from None
        with np.errstate(over="ignore"):
            return np.asarray(value, dtype=dtype.to_numpy())

    def _printing(self) -> contextlib.AbstractContextManager:
        """Around a run: the session's print options, and return only after the run's prints (if it has print ops)."""
        return using_print_options(self._print_options) if self._compiled.prints else contextlib.nullcontext()

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Same as `execute`; keyword arguments bind inputs by name."""
        if kwargs:
            args = list(args) + [None] * (len(self._input_names) - len(args))
            for k, v in kwargs.items():
                if k not in self._input_names:
                    raise TypeError(f"Model {self._name!r}: unknown input name {k!r}; inputs are {self._input_names}")
                args[self._input_names.index(k)] = v
            missing = [n for n, a in zip(self._input_names, args) if a is None]
            if missing:
                raise TypeError(f"Model {self._name!r}: missing inputs {missing}")
        return self.execute(*args)

    def _stablehlo(self, *args: Any, platform: str | None = None) -> str:
        """StableHLO of the program for ``args``; ``platform="cuda"`` lowers for a GPU (also from a CPU-only
        machine).
        """
        return self._compiled.lower_text([as_array(a) for a in args], donate_buffers=True, platform=platform)

    def __repr__(self) -> str:
        return f"Model({self._name!r}, inputs={self.input_metadata}, outputs={self.output_metadata})"
