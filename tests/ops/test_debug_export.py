"""export_tensor: debug checkpoints written as .npy files when the graph runs."""

import jax
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import Graph, TensorType, ops


def test_export_tensor_writes_npy(tmp_path, rng):
    x = rng.normal(size=(2, 3)).astype(np.float32)
    with Graph("export", input_types=[TensorType(DType.float32, [2, 3])]) as g:
        y = g.inputs[0].tensor * 2.0
        ops.export_tensor(y, str(tmp_path), "doubled")
        g.output(y + 1.0)
    out = InferenceSession().load(g).execute(x)[0].to_numpy()
    jax.effects_barrier()
    np.testing.assert_allclose(np.load(tmp_path / "doubled.npy"), x * 2.0)
    np.testing.assert_allclose(out, x * 2.0 + 1.0)


def test_export_tensor_rejects_bad_labels(tmp_path):
    with Graph("bad", input_types=[TensorType(DType.float32, [2])]) as g:
        with pytest.raises(ValueError, match="export_tensor: label must be a plain file name"):
            ops.export_tensor(g.inputs[0].tensor, str(tmp_path), "../up")
        with pytest.raises(TypeError, match="export_tensor: path and label must be str"):
            ops.export_tensor(g.inputs[0].tensor, tmp_path, "x")
