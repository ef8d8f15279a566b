"""MAX's debugging options (Modular's debugging guide): ``InferenceSession.debug`` / ``Graph.debug``.

``nan_check`` names the op that first produced a NaN (and, with
``source_tracebacks``, the line that created it); ``op_log_level="trace"`` logs
``[OP] LAUNCH``/``[OP] COMPLETE`` per op; ``device_sync_mode`` waits for each
execution; ``reset`` drops what Python set; ``MODULAR_DEBUG`` sets defaults.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from lowering.debug import DebugConfig
from maxfx.dtype import DType
from maxfx.engine import DebugConfig as EngineDebugConfig
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, ops


@pytest.fixture(autouse=True)
def _clean_options():
    InferenceSession.debug.reset()
    yield
    InferenceSession.debug.reset()


def _sqrt_then_log_graph(name: str) -> Graph:
    with Graph(name, input_types=[TensorType(DType.float32, [3], DeviceRef.CPU())]) as g:
        root = ops.sqrt(g.inputs[0].tensor)  # NaN for negative inputs
        g.output(ops.log(root + 1.0))
    return g


def test_the_options_are_one_process_wide_config():
    assert InferenceSession.debug is Graph.debug and isinstance(Graph.debug, EngineDebugConfig)
    InferenceSession.debug.nan_check = True
    assert Graph.debug.nan_check
    with pytest.raises(TypeError, match="nan_check must be a bool"):
        InferenceSession.debug.nan_check = "yes"
    with pytest.raises(ValueError, match="op_log_level must be None or one of trace"):
        InferenceSession.debug.op_log_level = "verbose"
    with pytest.raises(AttributeError, match="no option 'assert_level'"):
        InferenceSession.debug.assert_level = "safe"


def test_nan_check_names_the_op_and_its_source_line():
    x = np.array([4.0, -1.0, 9.0], np.float32)
    plain = InferenceSession().load(_sqrt_then_log_graph("no_check")).execute(x)[0].to_numpy()
    assert np.isnan(plain[1])  # without the check the NaN flows to the output

    Graph.debug.source_tracebacks = True
    graph = _sqrt_then_log_graph("checked")
    InferenceSession.debug.nan_check = True
    model = InferenceSession().load(graph)
    with pytest.raises(FloatingPointError, match=r"nan_check: op 'sqrt' output 0 .* holds 1 NaN and 0 Inf values, created at .*test_debug_options\.py:\d+"):
        model.execute(x)
    ok = model.execute(np.array([0.0, 3.0, 8.0], np.float32))[0].to_numpy()
    np.testing.assert_allclose(ok, np.log(np.sqrt([0.0, 3.0, 8.0]) + 1.0), rtol=1e-6)


def test_options_apply_at_their_stage():
    x = np.array([4.0, -1.0, 9.0], np.float32)
    model = InferenceSession().load(_sqrt_then_log_graph("compiled_before"))
    InferenceSession.debug.nan_check = True  # set after compile: this model is unaffected, as in MAX
    assert np.isnan(model.execute(x)[0].to_numpy()[1])


def test_op_log_level_trace_logs_each_op_launch_and_completion(capfd):
    InferenceSession.debug.op_log_level = "trace"
    session = InferenceSession()
    model = session.init(session.compile(_sqrt_then_log_graph("logged")))
    InferenceSession.debug.device_sync_mode = True
    out = model.execute(np.array([0.0, 3.0, 8.0], np.float32))[0].to_numpy()
    np.testing.assert_allclose(out, np.log(np.sqrt([0.0, 3.0, 8.0]) + 1.0), rtol=1e-6)
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[OP]")]
    events = [re.match(r"\[OP\] (LAUNCH|COMPLETE) (\w+) \[id=(\d+)\] target=cpu:0", ln).groups() for ln in lines]
    ops_run = [name for kind, name, _ in events if kind == "LAUNCH"]
    assert ops_run[0] == "sqrt" and ops_run[-1] == "log" and len(events) == 2 * len(ops_run)
    launches = {i: name for kind, name, i in events if kind == "LAUNCH"}
    assert all(launches[i] == name for kind, name, i in events if kind == "COMPLETE")


def test_reset_keeps_the_environment_defaults():
    cfg = DebugConfig(env="nan-check,op-log-level=DEBUG")
    assert (cfg.nan_check, cfg.op_log_level, cfg.device_sync_mode) == (True, "debug", False)
    cfg.nan_check, cfg.device_sync_mode = False, True
    cfg.reset()
    assert (cfg.nan_check, cfg.device_sync_mode) == (True, False)
    with pytest.warns(UserWarning, match="ignoring assert-level=safe"):
        DebugConfig(env="assert-level=safe")


def test_modular_debug_environment_variable_reaches_a_fresh_process():
    code = (
        "import numpy as np\n"
        "from maxfx.engine import InferenceSession\n"
        "from maxfx.graph import DeviceRef, Graph, TensorType, ops\n"
        "from maxfx.dtype import DType\n"
        "print(InferenceSession.debug.nan_check, InferenceSession.debug.op_log_level)\n"
    )
    env = {**__import__("os").environ, "MODULAR_DEBUG": "nan-check,op-log-level=info"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["True", "info"]
