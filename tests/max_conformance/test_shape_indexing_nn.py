"""MAX graph-API conformance of the shape, indexing and nn ops.

Behaviours MAX's own unit tests rely on (error types and wording, rank-0
transpose, pad modes, static-size rules), checked against numpy or MAX's
documented behaviour.
"""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from tests.ops.harness import run_op
from tests.ops.test_nn_ops import np_roi_align


def _graph(*types):
    return Graph("conformance", input_types=list(types))


def _t(dtype, shape, device=None):
    return TensorType(dtype, shape, device or DeviceRef.CPU())


# ─── axes: IndexError, as MAX ─────────────────────────────────────────────


def test_out_of_range_axes_are_index_errors():
    with _graph(_t(DType.float32, [2, 3])) as g:
        x = g.inputs[0].tensor
        for call in (
            lambda: ops.transpose(x, 2, 0),
            lambda: ops.permute(x, [0, 2]),
            lambda: ops.flatten(x, 0, 2),
            lambda: ops.concat([x, x], 2),
            lambda: ops.stack([x], axis=3),
            lambda: ops.split(x, [1, 1], axis=-3),
            lambda: ops.squeeze(x, 5),
        ):
            with pytest.raises(IndexError, match="out of range|Axis must be in range"):
                call()
            # Still a ValueError (OpError), as maxfx documents.
            with pytest.raises(ValueError):
                call()


def test_transpose_rank_zero_accepts_0_and_minus_1():
    with _graph(_t(DType.float32, [])) as g:
        x = g.inputs[0].tensor
        for a, b in [(0, 0), (-1, 0), (0, -1)]:
            assert ops.transpose(x, a, b).type == _t(DType.float32, [])
        with pytest.raises(
            IndexError, match=r"transpose: Axis axis_1 out of range \(expected to be in range of \[-1, 0\], but got 1\)"
        ):
            ops.transpose(x, 1, 0)
        with pytest.raises(
            IndexError,
            match=r"transpose: Axis axis_2 out of range \(expected to be in range of \[-1, 0\], but got -2\)",
        ):
            ops.transpose(x, 0, -2)
    np.testing.assert_array_equal(run_op(lambda v: ops.transpose(v, 0, -1), np.float32(2.5)), np.float32(2.5))


# ─── concat / stack / split / chunk ───────────────────────────────────────


def test_concat_stack_mismatched_devices_list_the_inputs():
    with _graph(_t(DType.float32, [1, 2]), _t(DType.float32, [1, 2], DeviceRef.GPU())) as g:
        a, b = (v.tensor for v in g.inputs)
        for op in (ops.concat, ops.stack):
            with pytest.raises(
                ValueError,
                match=(
                    r"Input values must be on the same device\n    0: float32\[1, 2\] on cpu:0\n    1: float32\[1, "
                    r"2\] on gpu:0"
                ),
            ):
                op([a, b])


def test_stack_messages():
    with _graph(_t(DType.float32, [1, 2]), _t(DType.float32, [1, 2, 3]), _t(DType.int32, [1, 2])) as g:
        a, b, c = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match="stack: Expected at least one value to stack"):
            ops.stack(v for v in [])
        with pytest.raises(
            ValueError, match=r"All inputs to stack must be the same rank, got float32\[1, 2\], float32\[1, 2, 3\]"
        ):
            ops.stack([a, b])
        with pytest.raises(
            ValueError, match=r"All inputs to stack must have the same dtype, got float32\[1, 2\], int32\[1, 2\]"
        ):
            ops.stack([a, c])
        with pytest.raises(
            IndexError, match=r"stack: Axis out of range \(expected to be in range of \[-3, 2\], but got -4\)"
        ):
            ops.stack([a], axis=-4)


def test_split_needs_static_sizes_and_uses_max_wording():
    x = np.arange(15, dtype=np.float32)
    a, b = run_op(lambda v: ops.split(v, [10, 5]), x)
    np.testing.assert_array_equal(a, x[:10])
    np.testing.assert_array_equal(b, x[10:])
    with _graph(_t(DType.float32, [15]), _t(DType.float32, ["n"])) as g:
        x, s = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=r"Split sizes must sum to dimension value; x\.shape\[axis\]=Dim\(15\) != sum\(sizes=\[10, 6\]\)",
        ):
            ops.split(x, [10, 6])
        with pytest.raises(ValueError, match=r"Split sizes must be positive: sizes=\[10, -6\]"):
            ops.split(x, [10, -6])
        with pytest.raises(IndexError, match=r"Axis must be in range \[-1, 1\), got 2"):
            ops.split(x, [10, 5], 2)
        with pytest.raises(TypeError, match="split: split_sizes must be static ints, got symbolic dim n"):
            ops.split(s, ["n"])


def test_chunk_needs_a_static_dim_it_divides():
    with _graph(_t(DType.float32, [9, "n"])) as g:
        x = g.inputs[0].tensor
        assert [o.type for o in ops.chunk(x, 3)] == [_t(DType.float32, [3, "n"])] * 3
        with pytest.raises(ValueError, match=r"chunk: chunks=2 must statically divide dim 0 of float32\[9, n\]"):
            ops.chunk(x, 2)
        with pytest.raises(TypeError, match=r"chunk: dim 1 of float32\[9, n\] must be static to chunk"):
            ops.chunk(x, 1, axis=1)


# ─── pad modes ────────────────────────────────────────────────────────────


@pytest.mark.parametrize("mode", ["reflect", "edge"])
@pytest.mark.parametrize("paddings", [[1, 2, 0, 1], [0, 0, 0, 0], [3, 5, 4, 1]])
def test_pad_modes_match_numpy(mode, paddings):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = run_op(lambda v: ops.pad(v, paddings, mode=mode), x)
    want = np.pad(x, [(paddings[0], paddings[1]), (paddings[2], paddings[3])], mode=mode)
    np.testing.assert_array_equal(got, want)


def test_pad_mode_errors():
    with _graph(_t(DType.int32, [3, 3])) as g:
        x = g.inputs[0].tensor
        assert ops.pad(x, [1, 1, 2, 0], mode="edge").type == _t(DType.int32, [5, 5])
        with pytest.raises(ValueError, match="pad: unsupported padding mode 'wrap'"):
            ops.pad(x, [1, 1, 1, 1], mode="wrap")
        with pytest.raises(ValueError, match="pad: paddings must be non-negative"):
            ops.pad(x, [1, -1, 1, 1], mode="reflect")


# ─── roi_align ────────────────────────────────────────────────────────────


@pytest.mark.parametrize("mode", ["AVG", "MAX"])
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("ratio", [0.0, 2.0])
def test_roi_align_matches_the_kernel_loops(mode, aligned, ratio):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 7, 6, 3)).astype(np.float32)
    rois = np.array(
        [
            [0, 0.5, 1.0, 4.0, 5.5],  # inside
            [1, 2.0, 0.0, 2.3, 0.4],  # thinner than a pixel
            [1, -3.0, -2.0, 9.0, 12.0],  # beyond the image: outside samples count as 0
            [0, 8.0, 1.0, 16.0, 3.0],  # scaled by 0.5 below
        ],
        np.float32,
    )
    got = run_op(
        lambda a, r: ops.roi_align(a, r, 3, 2, spatial_scale=0.5, sampling_ratio=ratio, aligned=aligned, mode=mode),
        x,
        rois,
    )
    np.testing.assert_allclose(got, np_roi_align(x, rois, 3, 2, 0.5, ratio, aligned, mode), rtol=1e-5, atol=1e-5)


def test_roi_align_types_and_errors():
    with _graph(
        _t(DType.float64, [2, 8, 8, 4]),
        _t(DType.float64, ["m", 5]),
        _t(DType.float32, [10, 10]),
        _t(DType.float32, [1, 5, 1]),
    ) as g:
        x, rois, flat, bad_rois = (v.tensor for v in g.inputs)
        assert ops.roi_align(x, rois, 2, 3).type == _t(DType.float64, ["m", 2, 3, 4])
        with pytest.raises(ValueError, match=r"roi_align: expects rank-4 NHWC input, got rank 2"):
            ops.roi_align(flat, rois, 3, 3)
        with pytest.raises(ValueError, match=r"roi_align: expects rank-2 rois \[M, 5\], got rank 3"):
            ops.roi_align(x, bad_rois, 3, 3)
        with pytest.raises(ValueError, match=r"roi_align: mode must be 'AVG' or 'MAX', got 'SUM'"):
            ops.roi_align(x, rois, 3, 3, mode="SUM")


# ─── broadcast_to / tile / reshape / shape_to_tensor ──────────────────────


def test_broadcast_to_names_the_mismatched_dims():
    with _graph(_t(DType.float32, [6]), _t(DType.float32, ["D0"]), _t(DType.float32, [2]), _t(DType.int64, [2])) as g:
        x, s, two, shape = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=(
                r"\[broadcast_to\] input dimension at index 0 \(6\) must be either 1 "
                r"or equal to corresponding output dimension at index 1 \(7\)"
            ),
        ):
            ops.broadcast_to(x, [6, 7])
        with pytest.raises(
            ValueError,
            match=(
                r"\[broadcast_to\] input dimension at index 0 \(D0\) must be either 1 or equal to corresponding "
                r"output dimension at index 1 \(D2\)"
            ),
        ):
            ops.broadcast_to(s, ["D1", "D2"])
        # A tensor-valued shape: its out_dims are known only when the graph runs.
        assert ops.broadcast_to(two, shape, out_dims=["a", "b"]).type == _t(DType.float32, ["a", "b"])


def test_tile_repeats_must_be_positive():
    np.testing.assert_array_equal(
        run_op(lambda v: ops.tile(v, [2, 1]), np.eye(2, dtype=np.float32)), np.tile(np.eye(2), (2, 1))
    )
    with _graph(_t(DType.bool, [1, 3])) as g:
        with pytest.raises(ValueError, match=r"tile: repeats must be positive, got \[0, 1\]"):
            ops.tile(g.inputs[0].tensor, [0, 1])


def test_reshape_with_zero_dims():
    with _graph(_t(DType.bool, [2470, 3734158719374404, 0]), _t(DType.float32, [4, 5])) as g:
        z, x = (v.tensor for v in g.inputs)
        # 2470 * 3734158719374404 does not fit in 64 bits; the zero makes both sides empty.
        assert ops.reshape(z, [0]).type == _t(DType.bool, [0])
        assert ops.reshape(z, [0, 5]).type == _t(DType.bool, [0, 5])
        with pytest.raises(ValueError, match=r"reshape\(\): cannot infer -1 dimension when another dimension is 0"):
            ops.reshape(x, [-1, 0, 2])


def test_shape_to_tensor_rejects_strings_and_non_shapes():
    with _graph() as g:
        with pytest.raises(
            ValueError, match="shape_to_tensor: shape must be a list of dims .*got the string 'not a shape'"
        ):
            ops.shape_to_tensor("not a shape")
        for bad in (None, 42):
            with pytest.raises(TypeError):
                ops.shape_to_tensor(bad)
        g.output(ops.shape_to_tensor([2, 3]))


# ─── conv / slice ─────────────────────────────────────────────────────────


def test_conv_symbolic_channels_are_checked_when_the_graph_runs():
    with _graph(
        _t(DType.bfloat16, [1, "height", "width", "channels"]),
        _t(DType.bfloat16, [16, 16, 3, 1024]),
        _t(DType.float32, [1, 8, 8, 4]),
        _t(DType.float32, [3, 3, 3, 2]),
    ) as g:
        x, f, y, bad = (v.tensor for v in g.inputs)
        out = ops.conv2d(x, f, (16, 16))
        assert out.shape[3] == 1024 and str(out.shape[1]) != "height"  # (height - 16) // 16 + 1
        with pytest.raises(ValueError, match="conv2d: input channels do not match the filter"):
            ops.conv2d(y, bad)  # static channels that differ: 4 vs 3


def test_slice_reversed_range_of_a_symbolic_dim():
    with _graph(_t(DType.float32, ["n"])) as g:
        x = g.inputs[0].tensor
        with pytest.raises(
            ValueError,
            match=(
                "start and stop should be increasing for positive step and decreasing for negative step, but got "
                "start 2, stop 1 for step 1"
            ),
        ):
            x[2:1]
        with pytest.raises(ValueError, match="but got start -3, stop -1 for step -1"):
            x[-3:-1:-1]
        assert x[1:3].shape == [2]
        x[-1:1]  # mixed signs: whether the range is empty depends on n, so it builds


def test_resize_checks_the_input_rank_first():
    with _graph(_t(DType.float32, [224, 224]), _t(DType.float32, [1, 3, 8, 8])) as g:
        m, x = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError, match=r"Input tensor must have rank 4 \(NCHW format\) for resize operation, but got rank 2"
        ):
            ops.resize(m, [448, 448])
        with pytest.raises(
            ValueError, match=r"shape must have 4 elements for NCHW format \(batch, channels, height, width\)"
        ):
            ops.resize(x, [16, 16])
