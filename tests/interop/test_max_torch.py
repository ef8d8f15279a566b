"""maxfx.torch: MAX's Mojo-backed PyTorch ops say clearly that they need Mojo."""

import subprocess
import sys
from pathlib import Path

import pytest

import maxfx.torch
from maxfx.torch import CustomOpLibrary, MojoKernelsUnavailableError, graph_op

ROOT = Path(__file__).resolve().parents[2]


def test_custom_op_library_needs_mojo():
    with pytest.raises(
        MojoKernelsUnavailableError,
        match=r"max\.torch\.CustomOpLibrary needs Mojo: it compiles the Mojo kernels of 'my_library'"
        r".*maxfx runs on JAX",
    ) as info:
        CustomOpLibrary("my_library")
    assert isinstance(info.value, RuntimeError) and "maxfx.graph.ops.custom" in str(info.value)


def test_graph_op_needs_mojo_when_the_op_is_built():
    with pytest.raises(MojoKernelsUnavailableError, match=r"max\.torch\.graph_op needs Mojo: .*'grayscale'"):

        @graph_op
        def grayscale(pic):
            return pic

    decorator = graph_op(name="my_op", num_outputs=2)  # options alone build nothing yet
    assert callable(decorator)
    with pytest.raises(MojoKernelsUnavailableError, match="'my_op'"):
        decorator(lambda x: x)


def test_graph_op_checks_its_options():
    with pytest.raises(ValueError, match="num_outputs must be an int >= 1, got 0"):
        graph_op(num_outputs=0)
    with pytest.raises(ValueError, match=r"num_outputs \(2\) must match the 1 output_types"):
        graph_op(num_outputs=2, output_types=["t"])


def test_the_module_is_maxs_path_and_does_not_need_torch():
    assert maxfx.torch.__all__ == ["CustomOpLibrary", "MojoKernelsUnavailableError", "graph_op"]
    code = "import sys\nsys.modules['torch'] = None\nimport maxfx.torch\nprint('ok')\n"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
        ).stdout.strip()
        == "ok"
    )
