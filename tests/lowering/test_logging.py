"""``logging.getLogger("maxfx")`` records compiles, executable-cache hits and misses and kernel fallbacks.

Children: ``maxfx.compile`` (INFO per XLA compile: what and how long),
``maxfx.cache`` (DEBUG per memory hit/miss, INFO per disk hit) and
``maxfx.kernels`` (INFO per Pallas → jnp reference fallback). Nothing is
printed unless the application configures logging.
"""

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lowering.compile import clear_cache
from maxfx.driver import CPU
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, ops

ROOT = Path(__file__).resolve().parents[2]


def _records(caplog, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def _graph(name: str) -> Graph:
    with Graph(name, input_types=[TensorType(DType.float32, ["batch", 4], DeviceRef.CPU())]) as g:
        g.output(ops.relu(g.inputs[0]) * 2.0)
    return g


def test_a_graph_compile_and_a_cache_hit_are_logged(caplog):
    clear_cache()  # a cold memory cache: the first run compiles
    model = InferenceSession(devices=[CPU()]).load(_graph("logged_mlp"))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with caplog.at_level(logging.DEBUG, logger="maxfx"):
        first = model.execute(x)[0].to_numpy()
        compiles = _records(caplog, "maxfx.compile")
        caplog.clear()
        second = model.execute(x)[0].to_numpy()
    np.testing.assert_array_equal(first, np.maximum(x, 0) * 2)
    np.testing.assert_array_equal(second, first)

    # The compile names the graph and how long it took.
    assert any(re.fullmatch(r"compiled block 'logged_mlp' in \d+\.\d{3} s", m) for m in compiles), compiles
    # The second run reuses the executable: a hit, no compile.
    assert "hit block" in _records(caplog, "maxfx.cache")
    assert _records(caplog, "maxfx.compile") == []


def test_a_new_shape_is_a_logged_miss_then_a_compile(caplog):
    clear_cache()
    model = InferenceSession(devices=[CPU()]).load(_graph("logged_shapes"))
    model.execute(np.ones([2, 4], np.float32))
    with caplog.at_level(logging.DEBUG, logger="maxfx"):
        model.execute(np.ones([3, 4], np.float32))  # batch 3: not compiled yet
    assert "miss block" in _records(caplog, "maxfx.cache")
    assert any(m.startswith("compiled block 'logged_shapes'") for m in _records(caplog, "maxfx.compile"))


def test_compile_records_are_info_and_cache_records_debug(caplog):
    clear_cache()
    model = InferenceSession(devices=[CPU()]).load(_graph("logged_levels"))
    with caplog.at_level(logging.INFO, logger="maxfx"):
        model.execute(np.ones([2, 4], np.float32))
        model.execute(np.ones([2, 4], np.float32))
    assert _records(caplog, "maxfx.compile"), "compiles are INFO"
    assert _records(caplog, "maxfx.cache") == [], "memory hits and misses are DEBUG"


def test_a_kernel_fallback_is_logged(caplog):
    from custom_calls.attention import dispatch

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal([1, 4, 2, 8]).astype(np.float32) for _ in range(3))
    with caplog.at_level(logging.INFO, logger="maxfx"), pytest.warns(UserWarning, match="jnp reference"):
        dispatch.reset_warnings()
        # ALiBi is a reference-only extension: with the kernel asked for, it falls back.
        dispatch.flash_attention(q, k, v, alibi=True, impl="pallas_interpret")
    (msg,) = _records(caplog, "maxfx.kernels")
    assert msg.startswith("flash_attention: ") and msg.endswith("jnp reference instead of the Pallas kernel"), msg


# A script run in fresh processes: one graph, compiled (first process) or loaded from the disk cache (second).
_SCRIPT = """
import logging, sys
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s", stream=sys.stdout)
    logging.getLogger("jax").setLevel(logging.WARNING)
import numpy as np
from maxfx.driver import CPU
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, ops
with Graph("disk_logged", input_types=[TensorType(DType.float32, [2, 4], DeviceRef.CPU())]) as g:
    g.output(ops.tanh(g.inputs[0]) + 1.0)
InferenceSession(devices=[CPU()]).load(g).execute(np.ones([2, 4], np.float32))
"""


def _run(mode: str, cache_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, JAX_PLATFORMS="cpu", MAXFX_COMPILATION_CACHE_DIR=str(cache_dir))
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_disk_cache_hits_are_logged_and_nothing_prints_unless_configured(tmp_path):
    quiet = _run("unconfigured", tmp_path)
    assert quiet.stdout == "" and "maxfx" not in quiet.stderr, quiet.stderr

    cold = _run("configured", tmp_path / "cold")
    assert "maxfx.cache DEBUG disk miss: block 'disk_logged'" in cold.stdout, cold.stdout
    assert "maxfx.compile INFO compiled block 'disk_logged'" in cold.stdout

    warm = _run("configured", tmp_path / "cold")
    assert "maxfx.cache INFO disk hit: block 'disk_logged'" in warm.stdout, warm.stdout
    assert "maxfx.compile INFO compiled block 'disk_logged'" not in warm.stdout
