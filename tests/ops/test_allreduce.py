"""ops.allreduce.sum and device chains across cond / while_loop bodies, checked against numpy."""

import numpy as np
import pytest

from maxfx.driver import Tensor
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops

DEVICES = [DeviceRef.CPU(0), DeviceRef.CPU(1)]


def _graph(shape=(3,)):
    types = [TensorType(DType.float32, list(shape), d) for d in DEVICES]
    signals = [BufferType(DType.uint8, [8], d) for d in DEVICES]
    return Graph("allreduce", input_types=types + signals)


def test_allreduce_sum_gives_every_device_the_total():
    # "allreduce_sum" is the registry op behind ops.allreduce.sum.
    with _graph() as g:
        outs = ops.allreduce.sum(g.inputs[:2], g.inputs[2:])
        assert [str(o.device) for o in outs] == ["cpu:0", "cpu:1"]
        g.output(*outs)
    a, b = np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, -2.0, 4.0], np.float32)
    sig = [Tensor.from_numpy(np.zeros(8, np.uint8)) for _ in DEVICES]
    got = [o.to_numpy() for o in InferenceSession().load(g).execute(a, b, *sig)]
    for o in got:
        np.testing.assert_array_equal(o, a + b)


def test_allreduce_sum_checks_its_inputs():
    with _graph() as g:
        x0, x1, s0, s1 = g.inputs
        with pytest.raises(
            ValueError,
            match=r"allreduce.sum: expected number of inputs \(2\) and number of signal buffers \(1\) to match",
        ):
            ops.allreduce.sum([x0, x1], [s0])
        with pytest.raises(ValueError, match="allreduce.sum: inputs must share dtype and shape"):
            ops.allreduce.sum([x0, ops.reshape(x1, [3, 1])], [s0, s1])
        with pytest.raises(ValueError, match="allreduce.sum: signal buffer 0 is on cpu:1 but input 0 is on cpu:0"):
            ops.allreduce.sum([x0, x1], [s1, s0])


def test_an_allreduce_inside_cond_or_loop_advances_the_device_chains():
    with _graph() as g:
        x0, x1, s0, s1 = g.inputs
        before = [g.device_chains[d] for d in DEVICES]
        pred = ops.constant(True, DType.bool, device=DeviceRef.CPU())
        ops.cond(pred, None, lambda: ops.allreduce.sum([x0, x1], [s0, s1]) and None, lambda: None)
        after_cond = [g.device_chains[d] for d in DEVICES]
        assert all(a is not b for a, b in zip(after_cond, before))

        def body(a, b):
            ops.allreduce.sum([x0, x1], [s0, s1])
            return [a, b]

        # Loop-carried values may live on different devices.
        ops.while_loop([x0, x1], lambda a, b: ops.constant(False, DType.bool, device=DeviceRef.CPU()), body)
        assert all(a is not b for a, b in zip((g.device_chains[d] for d in DEVICES), after_cond))
        g.output()
