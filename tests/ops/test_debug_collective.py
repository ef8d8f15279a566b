"""print, assert_same_device, transfer_to and allgather."""

import jax
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
from tests.ops.harness import rand, run_op

CPU0, CPU1, CPU2 = DeviceRef.CPU(0), DeviceRef.CPU(1), DeviceRef.CPU(2)


def _printed(capfd) -> list[str]:
    jax.effects_barrier()  # callbacks may still be running when execute returns
    return capfd.readouterr().out.splitlines()


# ─── print ──────────────────────────────────────────────────────────────────


def test_print_doc_example(capfd):
    input_type = TensorType(dtype=DType.float32, shape=(2,), device=CPU0)
    with Graph("simple_add_graph", input_types=(input_type, input_type)) as graph:
        lhs, rhs = graph.inputs
        out = ops.add(lhs, rhs)
        ops.print(out, label="addition_output")
        graph.output(out)
    result = (
        InferenceSession().load(graph).execute(np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32))[0]
    )
    np.testing.assert_allclose(result.to_numpy(), [4.0, 6.0])
    # The printed line of MAX's own ops.print docstring (MAX's COMPACT style: a vector is one row of a matrix).
    assert _printed(capfd) == ["addition_output = tensor([[4.0000, 6.0000]], dtype=f32, shape=[2])"]


def test_print_strings_ints_and_program_order(capfd):
    def f(x):
        ops.print("start")
        x.print()  # TensorValue.print, default label
        ops.print(x * 2, label="doubled")
        ops.print("end", label="msg")
        return x

    run_op(f, np.array([[1, 2], [3, 4]], np.int32))
    assert _printed(capfd) == [
        "debug_tensor = start",
        "debug_tensor = tensor([[1, 2],",
        "[3, 4]], dtype=si32, shape=[2, 2])",
        "doubled = tensor([[2, 4],",
        "[6, 8]], dtype=si32, shape=[2, 2])",
        "msg = end",
    ]


def test_print_only_in_the_branch_taken(capfd):
    def f(p):
        ops.cond(p, None, lambda: ops.print("yes"), lambda: ops.print("no"))
        return p

    run_op(f, np.array(False))
    assert _printed(capfd) == ["debug_tensor = no"]


def test_print_errors():
    with Graph("p", input_types=[TensorType(DType.float32, [2])]) as g:
        with pytest.raises(TypeError, match="print: label must be a str"):
            ops.print(g.inputs[0], label=3)
        with pytest.raises(TypeError, match="print: value must be a str or a tensor value"):
            ops.print(object())


def test_assert_same_device():
    types = [
        TensorType(DType.float32, [2], CPU0),
        BufferType(DType.float32, [2], CPU0),
        TensorType(DType.float32, [2], DeviceRef.GPU(0)),
    ]
    with Graph("dev", input_types=types) as g:
        a, b, c = g.inputs
        assert ops.assert_same_device(a, b, other=a) is None
        with pytest.raises(
            ValueError,
            match=(
                r"assert_same_device: input values must be on the same device\n    0: float32\[2\] on cpu:0\n    w: "
                r"float32\[2\] on gpu:0"
            ),
        ):
            ops.assert_same_device(a, w=c)


# ─── transfer_to ─────────────────────────────────────────────────────────


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_transfer_to_changes_the_type_device_and_keeps_values(rng, dtype):
    x = rand(rng, [2, 3], dtype)

    def f(v):
        moved = ops.transfer_to(v, CPU1)
        assert moved.type == TensorType(v.dtype, v.shape, CPU1)
        assert ops.transfer_to(v, CPU0) is v  # already there
        back = moved.to(CPU0)
        assert back.device == CPU0
        return back

    np.testing.assert_array_equal(run_op(f, x, symbolic=[["n", None]]), x)


def test_transfer_to_accepts_driver_devices_and_moves_jax_arrays():
    from maxfx.driver import CPU  # noqa: PLC0415

    with Graph("t", input_types=[TensorType(DType.float32, [2], CPU1)]) as g:
        assert ops.transfer_to(g.inputs[0], CPU()).device == CPU0
    moved = ops.transfer_to(jax.numpy.ones(2), CPU0)
    assert moved.devices() == {jax.devices("cpu")[0]}


def test_transfer_to_errors():
    with Graph("t", input_types=[BufferType(DType.float32, [2], CPU0)]) as g:
        with pytest.raises(ValueError, match="transfer_to: x is a buffer"):
            ops.transfer_to(g.inputs[0], CPU1)
        with pytest.raises(TypeError, match="DeviceRef.from_device"):
            ops.transfer_to(ops.buffer_load(g.inputs[0]), "gpu")


# ─── allgather ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_allgather_concatenates_on_every_device(rng, axis):
    devices = [CPU0, CPU1, CPU2]
    shapes = [[2, 3], [2, 3], [2, 3]] if axis == 0 else [[2, 1], [2, 2], [2, 3]]
    xs = [rand(rng, s) for s in shapes]
    types = [TensorType(DType.float32, s, d) for s, d in zip(shapes, devices)]
    types += [BufferType(DType.uint8, [16], d) for d in devices]
    with Graph("allgather", input_types=types) as g:
        outs = ops.allgather(g.inputs[:3], g.inputs[3:], axis=axis)
        assert [o.device for o in outs] == devices
        g.output(*outs)
    from maxfx.driver import Tensor  # noqa: PLC0415

    signals = [Tensor.from_numpy(np.zeros(16, np.uint8)) for _ in devices]
    outs = InferenceSession().load(g).execute(*xs, *signals)
    want = np.concatenate(xs, axis=axis)
    for o in outs:
        np.testing.assert_array_equal(o.to_numpy(), want)


def test_allgather_single_input_and_errors():
    types = [
        TensorType(DType.float32, [2, 3], CPU0),
        TensorType(DType.float32, [2, 3], CPU1),
        TensorType(DType.float32, [2, 3], CPU0),
        TensorType(DType.int32, [2, 3], CPU2),
        TensorType(DType.float32, [4, 4], CPU2),
        BufferType(DType.uint8, [16], CPU0),
        BufferType(DType.uint8, [16], CPU1),
    ]
    with Graph("errors", input_types=types) as g:
        a, b, a2, i, sq, s0, s1 = g.inputs
        assert ops.allgather([a], [s0]) == [a]
        with pytest.raises(
            ValueError, match=r"allgather: expected number of inputs \(2\) and number of signal buffers \(1\) to match"
        ):
            ops.allgather([a, b], [s0])
        with pytest.raises(ValueError, match="allgather: inputs must be on distinct devices"):
            ops.allgather([a, a2], [s0, s1])
        with pytest.raises(ValueError, match="allgather: inputs must have the same dtype"):
            ops.allgather([a, i], [s0, s1])
        with pytest.raises(ValueError, match=r"allgather: inputs must have the same shape except on axis 0"):
            ops.allgather([a, sq], [s0, s1])
        with pytest.raises(IndexError, match="allgather: axis 2 is out of range for rank 2"):
            ops.allgather([a, b], [s0, s1], axis=2)
        with pytest.raises(TypeError, match="allgather: signal buffer 0 must be a BufferValue"):
            ops.allgather([a, b], [a, b])


# ─── distributed_broadcast ─────────────────────────────────────────────────


def test_distributed_broadcast_copies_the_root_to_every_device(rng):
    devices = [CPU0, CPU1, CPU2]
    x = rand(rng, [2, 3])
    types = [TensorType(DType.float32, [2, 3], CPU1)] + [BufferType(DType.uint8, [16], d) for d in devices]
    with Graph("distributed_broadcast", input_types=types) as g:
        outs = ops.distributed_broadcast(g.inputs[0], [b.buffer for b in g.inputs[1:]])
        assert [o.device for o in outs] == devices
        assert all(o.shape == [2, 3] and o.dtype == DType.float32 for o in outs)
        g.output(*outs)
    from maxfx.driver import Tensor  # noqa: PLC0415

    signals = [Tensor.from_numpy(np.zeros(16, np.uint8)) for _ in devices]
    for o in InferenceSession().load(g).execute(x, *signals):
        np.testing.assert_array_equal(o.to_numpy(), x)


def test_distributed_broadcast_errors():
    types = [
        TensorType(DType.float32, [2], CPU0),
        BufferType(DType.uint8, [16], CPU0),
        BufferType(DType.uint8, [16], CPU1),
        BufferType(DType.uint8, [16], CPU2),
    ]
    with Graph("errors", input_types=types) as g:
        x, s0, s1, s2 = g.inputs
        assert ops.distributed_broadcast(x, [s0]) == [x]
        with pytest.raises(ValueError, match="distributed_broadcast requires at least 1 signal buffer"):
            ops.distributed_broadcast(x, [])
        with pytest.raises(
            ValueError, match=r"input tensor device cpu:0 not found in signal buffer devices: \[cpu:1, cpu:2\]"
        ):
            ops.distributed_broadcast(x, [s1, s2])
        with pytest.raises(ValueError, match="distributed_broadcast requires unique devices"):
            ops.distributed_broadcast(x, [s0, s0, s1])


# ─── shard_and_stack ───────────────────────────────────────────────────────


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_shard_and_stack_splits_then_stacks(rng, axis):
    a, b, c = (rand(rng, [4, 6]) for _ in range(3))
    devices = [CPU0, CPU1]
    with Graph("shard_and_stack", input_types=[TensorType(DType.float32, [4, 6], CPU0)] * 3) as g:
        outs = ops.shard_and_stack([v.tensor for v in g.inputs], devices, axis)
        assert [o.device for o in outs] == devices
        g.output(*outs)
    got = [o.to_numpy() for o in InferenceSession().load(g).execute(a, b, c)]
    want = np.split(np.stack([a, b, c]), 2, axis=axis % 2 + 1)
    for o, w in zip(got, want):
        np.testing.assert_array_equal(o, w)


def test_shard_and_stack_symbolic_dim_and_errors():
    types = [
        TensorType(DType.float32, ["n", 4], CPU0),
        TensorType(DType.float32, [10, 4], CPU0),
        TensorType(DType.float32, [8, 4], CPU0),
        TensorType(DType.float32, [8, 4], DeviceRef.GPU()),
    ]
    with Graph("errors", input_types=types) as g:
        s, ten, eight, far = (v.tensor for v in g.inputs)
        (out,) = ops.shard_and_stack([s, s], [CPU1], axis=-1)
        assert out.type == TensorType(DType.float32, [2, "n", 4], CPU1)
        with pytest.raises(ValueError, match="shard_and_stack: Must provide at least one input tensor."):
            ops.shard_and_stack([], [CPU0])
        with pytest.raises(ValueError, match="shard_and_stack: Must provide at least one device."):
            ops.shard_and_stack([ten], [])
        with pytest.raises(
            ValueError, match=r"Dimension size along axis 0 \(10\) must be evenly divisible by number of devices \(3\)"
        ):
            ops.shard_and_stack([ten], [CPU0] * 3)
        with pytest.raises(
            ValueError,
            match=(
                r"All input tensors must have the same shape. Input 0 has shape \[Dim\(10\), Dim\(4\)\], but input 1 "
                r"has shape \[Dim\(8\), Dim\(4\)\]"
            ),
        ):
            ops.shard_and_stack([ten, eight], [CPU0, CPU1])
        with pytest.raises(IndexError, match=r"Axis must be in range \[-2, 2\), got -3"):
            ops.shard_and_stack([ten], [CPU0], axis=-3)
        with pytest.raises(ValueError, match="shard_and_stack: inputs must be on the host"):
            ops.shard_and_stack([far], [CPU0])
