"""Checkpoints (issue 18): `maxfx.save` / `maxfx.restore` through Orbax, and state_dicts that safetensors writes.

References are independent of maxfx's reader: numpy arrays taken before saving,
and the safetensors file read back with ``safetensors.numpy.load_file``.
"""

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from safetensors.numpy import load_file, save_file

import maxfx
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Linear, Sequential
from maxfx.experimental.tensor import Tensor
from maxfx.models import load_pretrained

TINY_LLAMA = Path(__file__).parents[1] / "data" / "models" / "tiny_llama"


def _mlp():
    return Sequential(Linear(3, 8), Linear(8, 2))


def _loss(model, x, y):
    d = model(x) - y
    return F.reshape(F.mean(F.reshape(d * d, [-1]), axis=0), [])


def _numpy_leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


def test_module_and_adam_state_round_trip(tmp_path):
    opt = optax.adam(1e-2)
    model = _mlp()
    state = maxfx.optim.init(opt, model)
    step = maxfx.optim.make_train_step(_loss, opt)
    rng = np.random.default_rng(0)
    x, y = Tensor(rng.normal(size=(4, 3)).astype(np.float32)), Tensor(rng.normal(size=(4, 2)).astype(np.float32))
    for _ in range(3):
        model, state, _ = step(model, state, x, y)
    saved = {"model": model, "opt": state, "epoch": 3}
    expected = _numpy_leaves(saved)  # taken before saving: the reference

    maxfx.save(tmp_path / "ckpt", saved)
    fresh = _mlp()
    like = {"model": fresh, "opt": maxfx.optim.init(opt, fresh), "epoch": 0}
    back = maxfx.restore(tmp_path / "ckpt", like)

    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(saved)
    assert isinstance(back["model"], Sequential) and back["epoch"] == 3
    for _, t in back["model"].parameters:
        assert isinstance(t, Tensor)
    assert isinstance(back["opt"][0].mu, Sequential) and isinstance(back["opt"][0].count, jax.Array)
    assert int(back["opt"][0].count) == 3
    got = _numpy_leaves(back)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype
        np.testing.assert_array_equal(g, e)
    # The restored pair keeps training: same step, same result as the original pair.
    m1, s1, l1 = step(model, state, x, y)
    m2, s2, l2 = step(back["model"], back["opt"], x, y)
    np.testing.assert_array_equal(np.asarray(l1), np.asarray(l2))
    for a, b in zip(_numpy_leaves((m1, s1)), _numpy_leaves((m2, s2)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_save_is_atomic_and_refuses_to_overwrite(tmp_path):
    path = tmp_path / "ckpt"
    maxfx.save(path, {"w": Tensor.ones([2])})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folder left beside it
    with pytest.raises(FileExistsError, match="maxfx.save: .* exists; pass overwrite=True"):
        maxfx.save(path, {"w": Tensor.zeros([2])})
    maxfx.save(path, {"w": Tensor.zeros([2])}, overwrite=True)
    np.testing.assert_array_equal(maxfx.restore(path, {"w": Tensor.ones([2])})["w"].to_numpy(), np.zeros(2, np.float32))


def test_restore_names_the_mismatch(tmp_path):
    path = tmp_path / "ckpt"
    maxfx.save(path, {"w": Tensor.ones([2]), "b": np.arange(3, dtype=np.int64)})
    with pytest.raises(
        ValueError, match=r"leaf 1 differs: the checkpoint has \['w'\] float32\[2\], `like` has \['w'\] float32\[5\]"
    ):
        maxfx.restore(path, {"w": Tensor.ones([5]), "b": np.arange(3, dtype=np.int64)})
    with pytest.raises(ValueError, match="the checkpoint has 2 leaves but `like` has 1"):
        maxfx.restore(path, {"w": Tensor.ones([2])})
    with pytest.raises(FileNotFoundError, match="maxfx.restore: no checkpoint at"):
        maxfx.restore(tmp_path / "missing", {"w": Tensor.ones([2])})
    back = maxfx.restore(path, {"w": Tensor.zeros([2]), "b": np.zeros(3, np.int64)})
    assert isinstance(back["b"], np.ndarray) and back["b"].dtype == np.int64
    np.testing.assert_array_equal(back["b"], np.arange(3))


def test_save_rejects_non_array_leaves(tmp_path):
    with pytest.raises(TypeError, match="maxfx.save: leaf \\['f'\\] is a str"):
        maxfx.save(tmp_path / "ckpt", {"f": "text"})


def test_experimental_state_dict_is_numpy_that_safetensors_writes(tmp_path):
    model = _mlp()
    sd = model.state_dict()
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    save_file(sd, str(tmp_path / "m.safetensors"))
    back = load_file(str(tmp_path / "m.safetensors"))
    assert sorted(back) == sorted(name for name, _ in model.parameters)
    for name, t in model.parameters:
        np.testing.assert_array_equal(back[name], t.to_numpy())
    fresh = _mlp()
    fresh.load_state_dict(back)
    for (_, a), (_, b) in zip(fresh.parameters, model.parameters, strict=True):
        np.testing.assert_array_equal(a.to_numpy(), b.to_numpy())


def test_trained_tiny_llama_round_trips_through_an_hf_folder(tmp_path):
    model = load_pretrained(TINY_LLAMA)
    rng = np.random.default_rng(1)
    # Stand-in for training: every weight moves, so the reloaded logits cannot come from the original file.
    trained = model.map_parameters(
        lambda name, t: Tensor(t.to_numpy() + 0.05 * rng.normal(size=t.to_numpy().shape).astype(np.float32))
    )
    ids = Tensor(np.array([[1, 5, 9, 2]], np.int64), dtype=DType.int64)
    want = trained(ids).to_numpy()

    folder = tmp_path / "trained"
    folder.mkdir()
    shutil.copy(TINY_LLAMA / "config.json", folder / "config.json")
    save_file(trained.state_dict(), str(folder / "model.safetensors"))

    assert json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    reloaded = load_pretrained(folder)
    got = reloaded(ids).to_numpy()
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(got, model(ids).to_numpy())  # the trained weights, not the original ones
