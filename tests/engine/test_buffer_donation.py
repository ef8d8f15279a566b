"""Buffer inputs written by a graph are donated to the executable (no copy per step) when that is safe.

The lowered program marks the buffer argument donated; an array the engine wrote
into a buffer Tensor is consumed (deleted) by the next execution; results stay
right across steps; arrays the caller may still read (its own jax.Array, an array
also passed as another input or bound as a weight) are never donated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from lowering.compile import CompiledBlock
from maxfx.driver import Tensor
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops

CPU = DeviceRef.CPU()


def _accumulator():
    """``buf += x`` (plus a weight); returns the old value: one buffer input, one tensor input."""
    with Graph(
        "acc", input_types=[BufferType(DType.float32, [2, 3], CPU), TensorType(DType.float32, [2, 3], CPU)]
    ) as g:
        buf, x = g.inputs
        before = ops.buffer_load(buf)
        ops.buffer_store(buf, before + x)
        g.output(before)
    return InferenceSession().load(g)


def _storage_array(t: Tensor) -> jax.Array:
    return t._jax_input()  # the array the Tensor hands to XLA (no copy)


def test_lowered_program_marks_the_buffer_donated():
    model = _accumulator()
    text = model._stablehlo(Tensor.from_numpy(np.zeros((2, 3), np.float32)), np.ones((2, 3), np.float32))
    main = next(line for line in text.splitlines() if "func.func public @main" in line)
    assert main.count("tf.aliasing_output") + main.count("jax.buffer_donor") == 1, main  # the buffer only, not x
    block = model._compiled
    plain = block.lower_text([np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)])
    assert "tf.aliasing_output" not in plain and "jax.buffer_donor" not in plain  # not asked: nothing donated


def test_host_buffer_results_stay_right_across_steps():
    model = _accumulator()
    rng = np.random.default_rng(0)
    state = rng.standard_normal((2, 3)).astype(np.float32)
    t = Tensor.from_numpy(state)  # host numpy memory: copied onto the device per call, rewritten in place
    want = state.copy()
    for _ in range(6):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        (before,) = model.execute(t, x)
        np.testing.assert_allclose(before.to_numpy(), want, rtol=0, atol=1e-6)
        want = want + x
        np.testing.assert_allclose(t.to_numpy(), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(state, want, rtol=0, atol=1e-6)  # the caller's array is the Tensor's memory


def test_result_array_is_consumed_by_the_next_step():
    model = _accumulator()
    x = np.ones((2, 3), np.float32)
    t = Tensor._from_array(jnp.zeros((2, 3), jnp.float32) + 0)  # a jax.Array only the Tensor holds...
    model.execute(t, x)  # ...the caller's, so the first step copies it
    owned = _storage_array(t)
    assert isinstance(owned, jax.Array)
    model.execute(t, x)
    assert owned.is_deleted()  # the engine's own array was donated (CPU XLA honours donation)
    np.testing.assert_array_equal(t.to_numpy(), 2 * x)
    model.execute(t, x)
    np.testing.assert_array_equal(t.to_numpy(), 3 * x)


def test_callers_jax_array_is_never_donated():
    model = _accumulator()
    mine = jnp.full((2, 3), 5.0, jnp.float32)
    t = Tensor.from_dlpack(mine)  # shares the caller's array
    model.execute(t, np.ones((2, 3), np.float32))
    assert not mine.is_deleted()
    np.testing.assert_array_equal(np.asarray(mine), np.full((2, 3), 5.0))  # still readable, unchanged
    np.testing.assert_array_equal(t.to_numpy(), np.full((2, 3), 6.0))


def test_numpy_view_of_the_buffer_stays_valid():
    model = _accumulator()
    t = Tensor._from_array(jnp.zeros((2, 3), jnp.float32) + 0)
    model.execute(t, np.ones((2, 3), np.float32))  # now engine-owned
    view = t.to_numpy()  # a zero-copy view of the engine's array
    model.execute(t, np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(view, np.ones((2, 3)))  # XLA skips donating memory with a live external view
    np.testing.assert_array_equal(t.to_numpy(), np.full((2, 3), 2.0))


def test_buffer_also_passed_as_another_input_or_weight_is_not_donated():
    with Graph("twice", input_types=[BufferType(DType.float32, [3], CPU), TensorType(DType.float32, [3], CPU)]) as g:
        buf, x = g.inputs
        ops.buffer_store(buf, ops.buffer_load(buf) + x)
        g.output(x * 2)
    block = InferenceSession().load(g)._compiled
    a = jax.device_put(np.arange(3, dtype=np.float32))
    outs, finals = block([a, a], donate_buffers=True)  # XLA cannot alias an array read twice: no donation, no error
    assert not a.is_deleted()
    np.testing.assert_array_equal(np.asarray(finals[0]), 2 * np.arange(3))
    np.testing.assert_array_equal(np.asarray(outs[0]), 2 * np.arange(3))
    with Graph("weighted", input_types=[BufferType(DType.float32, [3], CPU)]) as g:
        from maxfx.graph import Weight  # noqa: PLC0415

        w = Weight("w", DType.float32, [3], CPU)
        ops.buffer_store(g.inputs[0], ops.buffer_load(g.inputs[0]) + w)
        g.output(ops.buffer_load(g.inputs[0]))
    wa = jax.device_put(np.ones(3, np.float32))
    block = CompiledBlock(g._ir, {"w": wa}, jax.devices("cpu")[0])
    outs, _ = block([wa], donate_buffers=True)
    assert not wa.is_deleted()
    np.testing.assert_array_equal(np.asarray(outs[0]), np.full(3, 2.0))
    outs, _ = block([wa], donate_buffers=True)  # the weight is still intact for the next call
    np.testing.assert_array_equal(np.asarray(outs[0]), np.full(3, 2.0))


def test_without_the_flag_inputs_survive():
    block = _accumulator()._compiled
    a = jax.device_put(np.zeros((2, 3), np.float32))
    block([a, np.ones((2, 3), np.float32)])  # e.g. Module.compile, which keeps its inputs
    assert not a.is_deleted()
