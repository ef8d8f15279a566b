"""maxfx.export / maxfx.load_exported: StableHLO artifacts that run without the model's code."""

import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import jax
import numpy as np
import pytest

import maxfx
from maxfx._artifact import ArtifactError
from maxfx.dtype import DType
from maxfx.engine import InferenceSession, Model
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Embedding, LayerNorm, Linear, Sequential
from maxfx.experimental.tensor import Tensor
from maxfx.graph import Graph, TensorType, Weight, ops
from maxfx.graph.type import DeviceRef


def _read_npz(path) -> dict:
    """Every array of an .npz file, the file closed (an open NpzFile left to the GC warns)."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _t(*shape, dtype=DType.float32):
    return TensorType(dtype, list(shape), DeviceRef.CPU())


def _np_mlp(model, x):
    """numpy reference of Sequential(Linear, LayerNorm, Linear)."""
    p = {n: t.to_numpy() for n, t in model.parameters}
    h = x @ p["0.weight"].T + p["0.bias"]
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mean) / np.sqrt(var + model[1].eps) * p["1.weight"] + p["1.bias"]
    return h @ p["2.weight"].T + p["2.bias"]


@pytest.fixture(scope="module")
def mlp():
    return Sequential(Linear(4, 16), LayerNorm(16), Linear(16, 3))


# ─── a fresh process runs the artifact with only maxfx imported ─────────────

_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import maxfx
    from maxfx.engine import InferenceSession

    path, data = sys.argv[1], np.load(sys.argv[2])
    loaded = maxfx.load_exported(path)
    model = InferenceSession().load(path)
    out = {}
    for name in ("x2", "x7"):
        out["fn_" + name] = loaded(data[name]).to_numpy()
        out["engine_" + name] = model.execute(data[name])[0].to_numpy()
    out["symbolic"] = np.array("?x4xf32" in loaded.stablehlo())
    out["model_code_imported"] = np.array(any(m.startswith("maxfx.experimental.nn") for m in sys.modules))
    np.savez(sys.argv[3], **out)
    """
)


def test_compiled_module_runs_in_a_fresh_process(mlp, tmp_path, rng):
    compiled = mlp.compile(_t("batch", 4))
    path = maxfx.export(compiled).save(tmp_path / "mlp.maxfx")
    data = {"x2": rng.standard_normal((2, 4)).astype(np.float32), "x7": rng.standard_normal((7, 4)).astype(np.float32)}
    np.savez(tmp_path / "in.npz", **data)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = _read_npz(tmp_path / "out.npz")
    assert bool(out["symbolic"]), "the batch dim must stay symbolic in the StableHLO"
    assert not bool(out["model_code_imported"])
    for name, x in data.items():
        original = compiled(Tensor(x)).to_numpy()
        np.testing.assert_allclose(original, _np_mlp(mlp, x), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(out["fn_" + name], original, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["engine_" + name], original, rtol=1e-5, atol=1e-6)


def _python(code, *args, cwd, devices=1):
    """Run ``code`` in a fresh interpreter with ``devices`` forced host CPU devices (as tests/forced_devices.py
    does).
    """
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    proc = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=240, env=env, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


_LOAD_AND_DIFFERENTIATE = textwrap.dedent(
    """
    import sys
    import jax
    import numpy as np
    import maxfx
    from maxfx.experimental.tensor import Tensor

    folder, names = sys.argv[1], sys.argv[2].split(",")
    data, out = np.load(folder + "/in.npz"), {}
    loaded = {name: maxfx.load_exported(f"{folder}/{name}.maxfx") for name in names}
    runs = [(key, loaded[key.rsplit("_x", 1)[0]]) for key in data.files]
    for key, model in runs:
        out[key + "_y"] = model(data[key]).to_numpy()
    # loading and running needs no model code (maxfx.grad below imports the Module machinery)
    out["model_code_imported"] = np.array(any(m.startswith(("maxfx.experimental.nn", "tests")) for m in sys.modules))
    for key, model in runs:
        out[key.rsplit("_x", 1)[0] + "_devices"] = np.array(model.nr_devices)
        # through the stored VJP: jax.grad on arrays, maxfx.grad on Tensors
        out[key + "_jax_grad"] = np.asarray(jax.grad(lambda x: model.call(x).sum())(data[key]))
        total = lambda x: model(x).sum(axis=0).sum(axis=1).squeeze(0).squeeze(0)
        out[key + "_maxfx_grad"] = maxfx.grad(total)(Tensor(data[key])).to_numpy()
    np.savez(folder + "/out.npz", **out)
    """
)


def test_jax_functions_and_a_module_load_and_differentiate_in_a_fresh_process(mlp, tmp_path, rng):
    import jax.numpy as jnp

    w = rng.standard_normal((4, 3)).astype(np.float32)
    w_jax = jnp.asarray(w)

    def uses_jnp(x):  # a captured JAX array becomes a weight of the artifact
        return jnp.tanh(x) @ w_jax

    models = {
        "jnp": (uses_jnp, lambda x: np.tanh(x) @ w, lambda x: (1 - np.tanh(x) ** 2) * w.sum(1)),
        "jax_jit": (jax.jit(lambda x: jnp.sin(x) * 2 + 1), lambda x: np.sin(x) * 2 + 1, lambda x: np.cos(x) * 2),
        "maxfx_jit": (
            maxfx.jit(lambda x: jnp.cos(x) @ w_jax),
            lambda x: np.cos(x) @ w,
            lambda x: -np.sin(x) * w.sum(1),
        ),
        "module": (mlp, lambda x: _np_mlp(mlp, x), None),
    }
    data = {}
    for name, (model, _, _) in models.items():
        art = maxfx.export(model, _t("batch", 4))
        assert art.differentiable
        art.save(tmp_path / f"{name}.maxfx")
        for n in (2, 7):  # one artifact, two batch sizes
            data[f"{name}_x{n}"] = rng.standard_normal((n, 4)).astype(np.float32)
    assert set(maxfx.load_exported(tmp_path / "jnp.maxfx").weights) == {"w_jax"}
    np.savez(tmp_path / "in.npz", **data)
    _python(_LOAD_AND_DIFFERENTIATE, tmp_path, ",".join(models), cwd=tmp_path)
    out = _read_npz(tmp_path / "out.npz")
    assert not bool(out["model_code_imported"])
    for key, x in data.items():
        name = key.rsplit("_x", 1)[0]
        _, value, grad = models[name]
        np.testing.assert_allclose(out[key + "_y"], value(x), rtol=1e-4, atol=1e-5)
        want = grad(x) if grad else _numeric_grad(value, x)
        np.testing.assert_allclose(out[key + "_jax_grad"], want, rtol=1e-3, atol=1e-3 if grad is None else 1e-5)
        np.testing.assert_allclose(out[key + "_maxfx_grad"], out[key + "_jax_grad"], rtol=1e-6)


def _numeric_grad(f, x, eps=1e-3):
    """Central differences in float64: the gradient of ``f(x).sum()`` for a numpy function ``f``."""
    x = x.astype(np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d).sum() - f(x - d).sum()) / (2 * eps)
    return g


_EXPORT_SHARDED = textwrap.dedent(
    """
    import sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    import maxfx
    from jax.sharding import NamedSharding, PartitionSpec as P
    from maxfx.dtype import DType
    from maxfx.graph import TensorType

    folder = sys.argv[1]
    mesh = maxfx.make_mesh((2,), ("x",))
    w = jax.device_put(np.load(folder + "/w.npy"), NamedSharding(mesh, P(None, "x")))  # columns split over 2 devices
    fn = jax.jit(lambda x: jnp.tanh(x) @ w)
    art = maxfx.export(fn, TensorType(DType.float32, [8, 4]), in_shardings=[NamedSharding(mesh, P("x", None))])
    art.save(folder + "/sharded.maxfx")
    print(art.nr_devices)
    """
)


def test_two_device_sharded_function_loads_in_a_fresh_process(tmp_path, rng):
    w = rng.standard_normal((4, 6)).astype(np.float32)
    np.save(tmp_path / "w.npy", w)
    assert _python(_EXPORT_SHARDED, tmp_path, cwd=tmp_path, devices=2).split() == ["2"]
    x = rng.standard_normal((8, 4)).astype(np.float32)
    np.savez(tmp_path / "in.npz", sharded_x8=x)
    _python(_LOAD_AND_DIFFERENTIATE, tmp_path, "sharded", cwd=tmp_path, devices=2)
    out = _read_npz(tmp_path / "out.npz")
    assert int(out["sharded_devices"]) == 2
    np.testing.assert_allclose(out["sharded_x8_y"], np.tanh(x) @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["sharded_x8_jax_grad"], (1 - np.tanh(x) ** 2) * w.sum(1), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="sharded over 2 devices; this process has 1 cpu device"):
        maxfx.load_exported(tmp_path / "sharded.maxfx")(x)  # this pytest process has one device


# ─── kinds of models ────────────────────────────────────────────────────────


def test_module_weights_are_stored_beside_the_program(mlp, rng):
    art = maxfx.export(mlp, _t("batch", 4))
    assert set(art.weights) == {n for n, _ in mlp.parameters}
    for n, t in mlp.parameters:
        np.testing.assert_array_equal(art.weights[n], t.to_numpy())
    with zipfile.ZipFile(io.BytesIO(art.serialize())) as z:
        assert {"maxfx_export.json", "program.jaxexport"} <= set(z.namelist())
        meta = json.loads(z.read("maxfx_export.json"))
        assert [w["name"] for w in meta["weights"]] == sorted(art.weights)
        for i, w in enumerate(meta["weights"]):  # raw little-endian bytes beside the program
            np.testing.assert_array_equal(
                np.frombuffer(z.read(f"weights/{i}.bin"), "<f4").reshape(w["shape"]),
                dict(mlp.parameters)[w["name"]].to_numpy(),
            )
        program = jax.export.deserialize(bytearray(z.read("program.jaxexport")))  # JAX's own format
    assert program.has_vjp()
    assert [tuple(a.shape) for a in program.in_avals[1:]] == [
        tuple(w["shape"]) for w in meta["weights"]
    ]  # 1 input, then the weights
    # Weights are arguments of the program, not constants: 1 input + 6 weights.
    main = next(line for line in art.stablehlo().splitlines() if "func.func public @main" in line)
    assert main.count("%arg") == 7
    x = rng.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(
        maxfx.load_exported(art.serialize())(x).to_numpy(), _np_mlp(mlp, x), rtol=1e-4, atol=1e-5
    )


def test_function_of_tensors_with_captured_module(mlp, rng):
    scale = Tensor(np.array([1.0, -2.0, 0.5], np.float32))

    def head(x):
        return F.relu(mlp(x)) * scale

    art = maxfx.load_exported(maxfx.export(head, _t("batch", 4)).serialize())
    assert set(art.weights) == {"scale"} | {f"mlp.{n}" for n, _ in mlp.parameters}
    for n in (1, 6):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(
            art(Tensor(x)).to_numpy(), np.maximum(_np_mlp(mlp, x), 0) * [1.0, -2.0, 0.5], rtol=1e-4, atol=1e-5
        )


def test_pure_function_two_symbolic_dims_and_tuple_output(rng):
    def f(x, y):
        return x + y, F.relu(x) * 3

    art = maxfx.load_exported(maxfx.export(f, _t("n", "m"), _t("n", "m")).serialize())
    x, y = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    a, b = art(x, y)
    np.testing.assert_allclose(a.to_numpy(), x + y, rtol=1e-6)
    np.testing.assert_allclose(b.to_numpy(), np.maximum(x, 0) * 3, rtol=1e-6)
    with pytest.raises(ValueError, match=r"input 1.*shape \[2, 4\].*n.*m"):
        art(x, np.zeros((2, 4), np.float32))  # m is already 3 from input 0


def test_reshape_over_a_symbolic_dim_stays_symbolic(rng):
    # Attention blocks split heads with reshapes that name the batch symbol.
    def f(x):
        return F.reshape(x, ["n", 2, 2]).sum(axis=-1)

    art = maxfx.load_exported(maxfx.export(f, _t("n", 4)).serialize())
    for n in (1, 5):
        x = rng.standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(art(x).to_numpy(), x.reshape(n, 2, 2).sum(-1, keepdims=True), rtol=1e-6)


def test_embedding_int64_inputs(rng):
    emb = Embedding(11, dim=3)
    art = maxfx.load_exported(maxfx.export(emb.compile(_t("batch", "seq", dtype=DType.int64))).serialize())
    ids = rng.integers(0, 11, (2, 5)).astype(np.int64)
    np.testing.assert_array_equal(art(ids).to_numpy(), emb.weight.to_numpy()[ids])
    with pytest.raises(ValueError, match="expected dtype int64, got int32"):
        art(ids.astype(np.int32))


def test_graph_with_weights_and_engine_model(tmp_path, rng):
    w = rng.standard_normal((4, 2)).astype(np.float32)
    with Graph("proj", input_types=[_t("batch", 4)]) as g:
        weight = g.add_weight(Weight("w", DType.float32, [4, 2], DeviceRef.CPU()))
        g.output(ops.relu(g.inputs[0] @ weight))
    x = rng.standard_normal((3, 4)).astype(np.float32)
    from_graph = maxfx.export(g, weights_registry={"w": w})
    from_model = maxfx.export(InferenceSession().load(g, weights_registry={"w": w}))
    for art in (from_graph, from_model):
        path = art.save(tmp_path / "proj.maxfx")
        model = InferenceSession().load(path)
        assert isinstance(model, Model)
        assert model.input_metadata[0].shape == [None, 4]
        assert model.output_metadata[0].shape == [None, 2]
        np.testing.assert_allclose(model.execute(x)[0].to_numpy(), np.maximum(x @ w, 0), rtol=1e-5)


def test_input_types_can_fix_a_symbolic_dim(mlp, rng):
    art = maxfx.export(mlp.compile(_t("batch", 4)), _t(3, 4))
    assert "3x4xf32" in art.stablehlo()
    art(rng.standard_normal((3, 4)).astype(np.float32))
    with pytest.raises(ValueError, match=r"input 0: shape \[5, 4\].*dim 0: expected 3, got 5"):
        art(np.zeros((5, 4), np.float32))


# ─── bad input ───────────────────────────────────────────────────────────────


def test_errors(mlp, tmp_path):
    compiled = mlp.compile(_t("batch", 4))
    with pytest.raises(TypeError, match="needs input_types"):
        maxfx.export(lambda x: x)
    with pytest.raises(ValueError, match=r"input type 0 .* does not fit the model's input"):
        maxfx.export(compiled, _t("batch", 5))
    with pytest.raises(TypeError, match="expected a compiled module"):
        maxfx.export(42)
    with pytest.raises(ValueError, match="not a maxfx export artifact"):
        maxfx.load_exported(b"not a zip")
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("x.txt", "hi")
    with pytest.raises(ValueError, match="not a maxfx export artifact"):
        maxfx.load_exported(other)
    # Other files keep the engine's error for serialized MAX graphs.
    with pytest.raises(RuntimeError, match="serialized MAX graphs"):
        InferenceSession().load(str(other))
    with pytest.raises(ValueError, match="expected 1 inputs, got 2"):
        maxfx.export(compiled)(np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32))


def _with_version(data, version):
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w") as dst:
        for name in src.namelist():
            content = src.read(name)
            if name == "maxfx_export.json":
                content = json.dumps({**json.loads(content), "version": version})
            dst.writestr(name, content)
    return buf.getvalue()


def test_other_format_versions(mlp):
    data = maxfx.export(mlp.compile(_t("batch", 4))).serialize()
    with pytest.raises(
        ArtifactError,
        match=r"written by a newer maxfx \(format version 99\); this maxfx reads version 2: upgrade maxfx",
    ):
        maxfx.load_exported(_with_version(data, 99))
    with pytest.raises(ArtifactError, match="format version 1, .* no longer read; .* export the model again"):
        maxfx.load_exported(_with_version(data, 1))
