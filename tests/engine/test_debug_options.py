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
from lowering.debug_options import PrintStyle
from maxfx.dtype import DType
from maxfx.engine import DebugConfig as EngineDebugConfig
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, ops

MAX_OPTIONS = (
    "nan_check",
    "uninitialized_read_check",
    "device_sync_mode",
    "stack_trace_on_error",
    "stack_trace_on_crash",
    "source_tracebacks",
    "op_log_level",
    "assert_level",
    "print_style",
    "ir_output_dir",
    "sensible_mode",
)


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
    with pytest.raises(ValueError, match="op_log_level must be one of '', 'notset', 'trace'"):
        InferenceSession.debug.op_log_level = "verbose"
    with pytest.raises(ValueError, match="assert_level must be one of '', 'none', 'warn', 'safe', 'all'"):
        InferenceSession.debug.assert_level = "some"
    with pytest.raises(AttributeError, match="no option 'nan_checks'"):
        InferenceSession.debug.nan_checks = True


def test_nan_check_names_the_op_and_its_source_line():
    x = np.array([4.0, -1.0, 9.0], np.float32)
    plain = InferenceSession().load(_sqrt_then_log_graph("no_check")).execute(x)[0].to_numpy()
    assert np.isnan(plain[1])  # without the check the NaN flows to the output

    Graph.debug.source_tracebacks = True
    graph = _sqrt_then_log_graph("checked")
    InferenceSession.debug.nan_check = True
    model = InferenceSession().load(graph)
    with pytest.raises(
        FloatingPointError,
        match=r"nan_check: op 'sqrt' output 0 .* holds 1 NaN and 0 Inf values, created at .*test_debug_options\.py:\d+",
    ):
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
    with pytest.warns(UserWarning, match="ignoring assert-level=sometimes, no-such-option"):
        DebugConfig(env="assert-level=sometimes,no-such-option")


def test_max_option_names_and_defaults():
    """Every DebugConfig property of MAX's engine bindings, with its default."""
    cfg = DebugConfig(env="")
    assert {name: getattr(cfg, name) for name in MAX_OPTIONS} == {
        "nan_check": False,
        "uninitialized_read_check": False,
        "device_sync_mode": False,
        "stack_trace_on_error": False,
        "stack_trace_on_crash": False,
        "source_tracebacks": False,
        "op_log_level": "",
        "assert_level": "",
        "print_style": PrintStyle.COMPACT,
        "ir_output_dir": "",
        "sensible_mode": False,
    }
    cfg.op_log_level, cfg.assert_level, cfg.print_style = "NotSet", "safe", "FULL"
    assert (cfg.op_log_level, cfg.assert_level, cfg.print_style) == ("notset", "safe", PrintStyle.FULL)
    env = DebugConfig(
        env="uninitialized-read-check,assert-level=warn,print-style=BINARY,ir-output-dir=/tmp/ir,stack-trace-on-error"
    )
    assert (
        env.uninitialized_read_check,
        env.assert_level,
        env.print_style,
        env.ir_output_dir,
        env.stack_trace_on_error,
    ) == (True, "warn", PrintStyle.BINARY, "/tmp/ir", True)


def test_sensible_mode_turns_on_max_curated_set_which_options_override():
    cfg = DebugConfig(env="sensible")
    assert cfg.sensible_mode
    on = ("nan_check", "device_sync_mode", "stack_trace_on_error", "stack_trace_on_crash", "source_tracebacks")
    assert all(getattr(cfg, name) for name in on) and cfg.assert_level == "all"
    assert not cfg.uninitialized_read_check and cfg.op_log_level == ""  # not part of the set
    cfg.nan_check = False  # an individual setting wins over the curated default
    assert not cfg.nan_check and cfg.device_sync_mode
    plain = DebugConfig(env="")
    plain.sensible_mode = True
    assert plain.nan_check and plain.source_tracebacks
    both = DebugConfig(env="sensible,device-sync-mode")
    assert both.sensible_mode and both.device_sync_mode


def test_sensible_mode_finds_the_nan_and_its_line():
    InferenceSession.debug.sensible_mode = True
    graph = _sqrt_then_log_graph("sensible")  # source_tracebacks is on: nodes record their lines
    model = InferenceSession().load(graph)
    with pytest.raises(FloatingPointError, match=r"op 'sqrt' .* created at .*test_debug_options\.py:\d+"):
        model.execute(np.array([4.0, -1.0, 9.0], np.float32))


def test_print_style_is_the_default_of_sessions_that_pick_none(capfd):
    with Graph("p", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
        g.inputs[0].print("x")
        g.output(g.inputs[0])
    session = InferenceSession()
    model = session.load(g)
    InferenceSession.debug.print_style = PrintStyle.FULL
    model.execute(np.array([1.0, 2.0], np.float32))
    assert capfd.readouterr().out == "x = tensor<2xf32> [1.000000e+00, 2.000000e+00]\n"
    session.set_debug_print_options("COMPACT")  # the session's own choice wins
    model.execute(np.array([1.0, 2.0], np.float32))
    assert capfd.readouterr().out == "x = tensor([[1.0000, 2.0000]], dtype=f32, shape=[2])\n"


def test_ir_output_dir_receives_the_stablehlo_of_compiled_programs(tmp_path):
    InferenceSession.debug.ir_output_dir = str(tmp_path)
    with Graph("dumped", input_types=[TensorType(DType.float32, [5], DeviceRef.CPU())]) as g:
        g.output(ops.sqrt(g.inputs[0].tensor) * 3.5 - 1.25)  # a program no other test compiles (no cache hit)
    model = InferenceSession().load(g)
    model.execute(np.arange(5, dtype=np.float32))
    dumps = list(tmp_path.glob("dumped.*.mlir"))
    assert len(dumps) == 1 and "stablehlo.sqrt" in dumps[0].read_text()


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
