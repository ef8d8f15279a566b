"""MAX's compile/init split with graph Modules and virtual devices (from MAX's graph/test_compile_init.py).

Outputs are checked against numpy; virtual-device compilation against the
shapes and platform ``jax.export`` records for the lowered program.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from lowering.driver_devices import accelerators
from maxfx import driver
from maxfx.driver import CPU, Accelerator, VirtualAccelerator
from maxfx.dtype import DType
from maxfx.engine import CompiledModel, InferenceSession, Model
from maxfx.graph import DeviceRef, Graph, Module, TensorType, Weight, ops

ROOT = Path(__file__).resolve().parents[2]


def _affine(name: str, module: Module | None = None, device: DeviceRef | None = None, weight: str = "w") -> Graph:
    device = device or DeviceRef.CPU()
    with Graph(name, input_types=[TensorType(DType.float32, ["batch", 4], device)], module=module) as g:
        w = g.add_weight(Weight(weight, DType.float32, [4, 3], device))
        g.output(ops.relu(g.inputs[0].tensor @ w))
    return g


# ─── virtual-device settings ─────────────────────────────────────────────────


def test_virtual_device_settings_default_to_off_and_round_trip(virtual_cuda):
    assert driver.is_virtual_device_mode() and driver.get_virtual_device_count() == 1
    assert (driver.get_virtual_device_api(), driver.get_virtual_device_target_arch()) == ("cuda", "sm_80")
    driver.set_virtual_device_count(0)
    assert not driver.is_virtual_device_mode() and driver.get_virtual_device_count() == 0


def test_virtual_device_count_needs_a_target_first():
    assert driver.get_virtual_device_api() == "" and driver.get_virtual_device_target_arch() == ""
    with pytest.raises(ValueError, match="set_virtual_device_api and set_virtual_device_target_arch first"):
        driver.set_virtual_device_count(1)
    with pytest.raises(ValueError, match=">= 0"):
        driver.set_virtual_device_count(-1)
    with pytest.raises(TypeError, match="expected an int"):
        driver.set_virtual_device_count(1.0)
    with pytest.raises(ValueError, match="unknown GPU API 'opencl'"):
        driver.set_virtual_device_api("opencl")


def test_virtual_target_cannot_be_unset_while_on(virtual_cuda):
    with pytest.raises(ValueError, match=r"set_virtual_device_count\(0\) before"):
        driver.set_virtual_device_api("")


def test_accelerators_are_virtual_while_the_mode_is_on(virtual_cuda):
    driver.set_virtual_device_count(2)
    assert driver.accelerator_count() == 2
    gpu = Accelerator()
    assert isinstance(gpu, VirtualAccelerator) and gpu is Accelerator(0) and gpu.id == 0
    assert (gpu.api, gpu.architecture_name, driver.accelerator_api(), driver.accelerator_architecture_name()) == (
        "cuda",
        "sm_80",
        "cuda",
        "sm_80",
    )
    assert DeviceRef.GPU(1).to_device() == Accelerator(1) and DeviceRef.from_device(gpu) == DeviceRef.GPU(0)
    assert [s.device_type for s in driver.scan_available_devices()] == ["gpu", "gpu"]
    with pytest.raises(ValueError, match="virtual-device mode has 2 virtual accelerator"):
        Accelerator(2)
    with pytest.raises(RuntimeError, match="virtual cuda sm_80 device .* needs a real GPU"):
        gpu.jax_device
    with pytest.raises(RuntimeError, match="needs a real GPU"):
        driver.Tensor.zeros((2,), DType.float32, gpu)


def test_changing_the_target_gives_a_device_of_the_new_target(virtual_cuda):
    driver.set_virtual_device_count(0)
    driver.set_virtual_device_api("hip")
    driver.set_virtual_device_target_arch("gfx942")
    driver.set_virtual_device_count(1)
    assert (Accelerator().api, Accelerator().architecture_name) == ("hip", "gfx942")


def test_the_mode_off_gives_the_machines_devices_again(virtual_cuda):
    driver.set_virtual_device_count(0)
    real = len(accelerators())
    assert driver.accelerator_count() == real
    if real == 0:
        with pytest.raises(ValueError, match="no accelerator available"):
            Accelerator()
    else:
        assert not isinstance(Accelerator(), VirtualAccelerator)


# ─── Modules ──────────────────────────────────────────────────────────────────


def test_a_module_collects_its_graphs_and_a_graph_has_its_own_by_default():
    module = Module()
    enc, dec = _affine("encoder", module), _affine("decoder", module)
    assert module.top_level_graph_names() == ["encoder", "decoder"] and enc.module is module and dec.module is module
    alone = _affine("alone")
    assert alone.module is not module and alone.module.top_level_graph_names() == ["alone"]
    with pytest.raises(ValueError, match="'encoder' is already in this module"):
        _affine("encoder", module)
    with pytest.raises(TypeError, match="module must be a maxfx.graph.Module"):
        Graph("g", input_types=[], module="m")
    with pytest.raises(TypeError, match="not MLIR modules"):
        Module(object())


def test_subgraphs_stay_out_of_the_modules_top_level():
    module = Module()
    with Graph("main", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())], module=module) as g:
        sub = g.add_subgraph(
            "double", forward=lambda x: x * 2, input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]
        )
        g.output(ops.call(sub, g.inputs[0])[0])
    assert module.top_level_graph_names() == ["main"] and sub.module is module
    out = InferenceSession().load(g).execute(np.array([1.0, -2.0], np.float32))[0].to_numpy()
    np.testing.assert_array_equal(out, [2.0, -4.0])


def test_compile_a_module_then_init_all_gives_a_model_per_graph():
    module = Module()
    _affine("encoder", module, weight="enc.w")
    _affine("decoder", module, weight="dec.w")
    rng = np.random.default_rng(0)
    weights = {"enc.w": rng.standard_normal((4, 3), np.float32), "dec.w": rng.standard_normal((4, 3), np.float32)}
    x = rng.standard_normal((2, 4), np.float32)
    session = InferenceSession(devices=[CPU()])
    compiled = session.compile(module)
    assert isinstance(compiled, CompiledModel) and compiled.graph_names == ["encoder", "decoder"]
    assert sorted(compiled.expected_weights) == ["dec.w", "enc.w"]
    models = session.init_all(compiled, weights_registry=weights)
    assert list(models) == ["encoder", "decoder"] and all(isinstance(m, Model) for m in models.values())
    for name, key in (("encoder", "enc.w"), ("decoder", "dec.w")):
        np.testing.assert_allclose(models[name].execute(x)[0].to_numpy(), np.maximum(x @ weights[key], 0), rtol=1e-6)
    assert list(session.load_all(module, weights_registry=weights)) == ["encoder", "decoder"]
    with pytest.raises(ValueError, match=r"holds 2 graphs \['encoder', 'decoder'\]; use InferenceSession.init_all"):
        session.init(compiled, weights_registry=weights)


def test_graphs_of_a_module_share_a_weight_of_one_type_only():
    module = Module()
    _affine("a", module)
    with Graph("b", input_types=[TensorType(DType.float32, [4], DeviceRef.CPU())], module=module) as g:
        g.output(g.inputs[0] + g.add_weight(Weight("w", DType.float32, [4], DeviceRef.CPU())))
    with pytest.raises(ValueError, match="graphs 'a' and 'b' both read weight 'w'"):
        InferenceSession().compile(module)
    with pytest.raises(ValueError, match="the Module has no graphs"):
        InferenceSession().compile(Module())
    with pytest.raises(TypeError, match="expected a Graph or a Module"):
        InferenceSession().compile("graph.mlir")


# ─── compiling for a virtual device ──────────────────────────────────────────


def test_a_graph_on_a_virtual_gpu_is_lowered_for_its_platform(virtual_cuda):
    graph = _affine("gpu_affine", device=DeviceRef.GPU())
    session = InferenceSession(devices=[Accelerator()])
    compiled = session.compile(graph)
    exported = compiled._graphs[0].exported
    assert exported.platforms == ("cuda",)
    (x_aval, w_aval), (out_aval,) = exported.in_avals, exported.out_avals
    assert str(x_aval.shape[0]) == "batch" and x_aval.shape[1] == 4 and w_aval.shape == (4, 3)
    assert str(out_aval.shape[0]) == "batch" and out_aval.shape[1] == 3 and out_aval.dtype == np.float32
    assert "stablehlo.dot_general" in exported.mlir_module()
    with pytest.raises(RuntimeError, match="initializing graph 'gpu_affine' .* needs a real GPU"):
        session.init(compiled, weights_registry={"w": np.ones((4, 3), np.float32)})


def test_a_hip_virtual_device_lowers_for_rocm(virtual_cuda):
    driver.set_virtual_device_count(0)
    driver.set_virtual_device_api("hip")
    driver.set_virtual_device_target_arch("gfx942")
    driver.set_virtual_device_count(1)
    compiled = InferenceSession(devices=[Accelerator()]).compile(_affine("g", device=DeviceRef.GPU()))
    assert compiled._graphs[0].exported.platforms == ("rocm",)


def test_cpu_graphs_still_run_in_virtual_mode(virtual_cuda):
    module = Module()
    _affine("encoder", module)
    _affine("decoder", module, weight="v")
    session = InferenceSession(devices=[CPU()])
    models = session.init_all(
        session.compile(module),
        weights_registry={"w": np.eye(4, 3, dtype=np.float32), "v": np.ones((4, 3), np.float32)},
    )
    x = np.array([[1.0, -2.0, 3.0, 4.0]], np.float32)
    np.testing.assert_array_equal(models["encoder"].execute(x)[0].to_numpy(), np.maximum(x @ np.eye(4, 3), 0))
    np.testing.assert_array_equal(models["decoder"].execute(x)[0].to_numpy(), np.maximum(x @ np.ones((4, 3)), 0))


# ─── the virtual CPU target ──────────────────────────────────────────────────


def test_virtual_cpu_target_is_checked_and_round_trips():
    assert driver.get_virtual_cpu_target() == ""
    with pytest.raises(ValueError, match="'native' names this machine's CPU"):
        driver.set_virtual_cpu_target("native")
    with pytest.raises(ValueError, match="cannot compile for 'not-a-cpu'"):
        driver.set_virtual_cpu_target("not-a-cpu")
    with pytest.raises(TypeError, match="expected a string"):
        driver.set_virtual_cpu_target(3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # this process's CPU backend already exists
            driver.set_virtual_cpu_target("generic")
            assert driver.get_virtual_cpu_target() == "generic"
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            driver.set_virtual_cpu_target("")
    assert driver.get_virtual_cpu_target() == ""


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the x86 target names")
def test_a_cpu_target_set_before_the_first_compile_caps_xlas_isa(tmp_path):
    """In a fresh process: the target reaches XLA:CPU (its dumped options), results stay right, a later change warns."""
    script = textwrap.dedent(
        """
        import os, warnings
        import numpy as np
        from maxfx import driver
        from maxfx.engine import InferenceSession
        from maxfx.graph import Graph, TensorType, ops
        from maxfx.dtype import DType

        driver.set_virtual_cpu_target("x86-64-v3")
        assert "--xla_cpu_max_isa=AVX2" in os.environ["XLA_FLAGS"].split()
        with Graph("sin2", input_types=[TensorType(DType.float32, [16])]) as g:
            g.output(ops.sin(g.inputs[0]) * 2)
        x = np.linspace(-3, 3, 16, dtype=np.float32)
        np.testing.assert_allclose(InferenceSession().load(g).execute(x)[0].to_numpy(), np.sin(x) * 2, rtol=1e-6)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            driver.set_virtual_cpu_target("")
        assert driver.get_virtual_cpu_target() == ""
        assert any("already exists" in str(w.message) for w in caught), caught
        print("ok")
        """
    )
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={tmp_path}", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
    options = [p.read_text() for p in tmp_path.glob("*sin2*debug_options")] or [
        p.read_text() for p in tmp_path.glob("*debug_options")
    ]
    assert options and all('xla_cpu_max_isa: "AVX2"' in o for o in options)
