"""`load_pretrained`'s ``dtype`` argument (issue 35 item 2a).

A dtype name (``"bfloat16"``) raised a raw AttributeError deep in the reader;
it now means the DType of that name, and anything else is a typed error that
names ``dtype``. Expected weights come from safetensors' own numpy reader.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from lowering.dtypes import DType
from maxfx.models import load_pretrained
from maxfx.models._loading import open_checkpoint, weights_dtype
from tests.models._helpers import LLAMA

NORM = "model.norm.weight"


def test_dtype_name_means_that_dtype():
    named = load_pretrained(LLAMA, dtype="bfloat16", device=None)
    typed = load_pretrained(LLAMA, dtype=DType.bfloat16, device=None)
    floats = {n: t for n, t in named.parameters if t.dtype.is_float()}
    assert floats and all(t.dtype == DType.bfloat16 for t in floats.values())
    ref = load_file(LLAMA / "model.safetensors")[NORM].astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(floats[NORM].to_numpy()), ref)
    np.testing.assert_array_equal(np.asarray(dict(typed.parameters)[NORM].to_numpy()), ref)


@pytest.mark.parametrize("name", ["float32", "FLOAT16", "DType.bfloat16"])
def test_names_map_to_dtypes(name):
    assert weights_dtype(name, "load_pretrained") is DType[name.lower().removeprefix("dtype.")]
    assert weights_dtype(None, "x") is None and weights_dtype(DType.float16, "x") is DType.float16


def test_graph_loader_reads_names_too():
    # load_pretrained_graph reads through open_checkpoint, which takes the name as well
    _, src = open_checkpoint(LLAMA, "float16", "load_pretrained_graph")
    assert src.read(NORM, (64,)).value.dtype == np.float16


@pytest.mark.parametrize(
    ("bad", "error"), [(3, TypeError), (np.float32, TypeError), ("bfloat17", ValueError), ("int8", ValueError)]
)
def test_bad_dtype_is_a_typed_error_naming_dtype(bad, error):
    with pytest.raises(error, match=r"load_pretrained: dtype") as e:
        load_pretrained(LLAMA, dtype=bad)
    assert "bfloat16" in str(e.value)  # says what is expected
