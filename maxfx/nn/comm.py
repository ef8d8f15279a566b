"""``max.nn.comm``: multi-device collectives as layers (`Allreduce`, `Signals`).

MAX's custom allreduce synchronises GPUs through peer-to-peer *signal buffers*
(barriers plus scratch space). A maxfx graph runs as one XLA program, and XLA
orders cross-device transfers itself, so the signal buffers carry no data
here: `Signals` still provides them (uint8 buffers of MAX's size, one per
device) so graphs keep MAX's signature, and the collectives check and accept
them. `Allreduce` is ``ops.allreduce.sum``: every device receives the other
devices' values and adds them in device order, so all devices hold
bit-identical sums.

Example:
    >>> from maxfx.graph import DeviceRef
    >>> sig = Signals([DeviceRef.GPU(0), DeviceRef.GPU(1)])
    >>> [str(t.device) for t in sig.input_types()], Signals.NUM_BYTES
    (['gpu:0', 'gpu:1'], 537919488)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lowering.devices import accelerators
from lowering.dtypes import DType
from lowering.types import BufferType, DeviceRef
from maxfx.driver import CPU, Accelerator, Tensor
from maxfx.graph import ops

__all__ = ["Allreduce", "Signals"]


class Signals:
    """One uint8 signal buffer of ``NUM_BYTES`` per device in ``devices`` (see the module notes).

    Example:
        >>> Signals([DeviceRef.CPU()]).input_types()[0].shape  # doctest: +SKIP
        [Dim(537919488)]
    """

    NUM_BYTES = 537919488
    """Size in bytes of each signal buffer (MAX's value)."""

    def __init__(self, devices: Sequence[Any]):
        devices = [DeviceRef.from_device(d) for d in devices]
        if not devices:
            raise ValueError("Signals: need at least one device")
        self.devices: list[DeviceRef] = devices

    def input_types(self) -> list[BufferType]:
        """Graph input types of the signal buffers: ``BufferType(uint8, [NUM_BYTES], device)`` per device."""
        return [BufferType(DType.uint8, [self.NUM_BYTES], d) for d in self.devices]

    def buffers(self) -> list[Any]:
        """Zero-filled driver tensors matching `input_types` (one per device), to pass to ``Model.execute``."""
        return [Tensor.zeros([self.NUM_BYTES], DType.uint8, device=_driver_device(d)) for d in self.devices]


def _driver_device(ref: DeviceRef) -> Any:
    return CPU() if str(ref).startswith("cpu") else Accelerator(ref.id)


class Allreduce:
    """Sum one tensor per device and give every device the total.

    ``devices`` lists ``num_accelerators`` accelerators; on a machine with fewer
    GPUs the missing slots are the host CPU, so multi-device graphs can still be
    built and run (XLA runs them as one program).

    Example:
        >>> ar = Allreduce(2)
        >>> len(ar.devices)
        2
        >>> outs = ar([x0, x1], signals.buffers())  # doctest: +SKIP
    """

    def __init__(self, num_accelerators: int):
        if isinstance(num_accelerators, bool) or not isinstance(num_accelerators, int) or num_accelerators < 1:
            raise ValueError(f"Allreduce: num_accelerators must be an int >= 1, got {num_accelerators!r}")

        available = len(accelerators())
        self.num_accelerators = num_accelerators
        self.devices: list[Any] = [Accelerator(i) if i < available else CPU() for i in range(num_accelerators)]

    def __call__(self, inputs: Iterable[Any], signal_buffers: Iterable[Any]) -> list[Any]:
        """``[sum(inputs) on inputs[i].device for each i]``; ``signal_buffers`` has one buffer per input."""
        inputs, signal_buffers = list(inputs), list(signal_buffers)
        if len(inputs) != self.num_accelerators:
            raise ValueError(f"Allreduce: expected {self.num_accelerators} inputs (one per device), got {len(inputs)}")
        return ops.allreduce.sum(inputs, signal_buffers)

    @staticmethod
    def _sum_on(inputs: list[Any], device: DeviceRef) -> Any:
        """The sum of ``inputs`` placed on ``device`` (one reduction, without signal buffers)."""
        total = None
        for x in inputs:
            part = ops.transfer_to(x, device)
            total = part if total is None else total + part
        return total
