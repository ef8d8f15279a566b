"""The on-disk compile cache against hostile, damaged and racing entries (issue 19 items 3, 6, 10).

Every cross-process check runs fresh Python processes (``_CHILD`` below) that
share one ``MAXFX_COMPILATION_CACHE_DIR``. The child builds two small graphs,
``a = tanh(x) + 1`` and ``b = 2 * tanh(x)``, and prints their outputs as one
JSON line; the parent compares them with numpy. A return code other than 0
(a crash in XLA, an exception) fails the test.
"""

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from lowering import persistent_cache as pc

ROOT = Path(__file__).resolve().parents[2]

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
EXPECTED = {"a": np.tanh(X) + 1, "b": 2 * np.tanh(X)}

_CHILD = """
import json, logging, sys
import jax
import numpy as np
from lowering import compile as lc
from lowering import persistent_cache as pc
from maxfx.driver import CPU
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, ops

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
logging.basicConfig(level=logging.WARNING)  # maxfx.cache's warnings (a rejected entry) on stderr
JAX_CACHE = {}  # JAX's persistent-cache events: "cache_hits" per executable loaded, "cache_misses" per one written

def count(event, **_):
    if event.startswith("/jax/compilation_cache/"):
        name = event.rsplit("/", 1)[-1]
        JAX_CACHE[name] = JAX_CACHE.get(name, 0) + 1

jax.monitoring.register_event_listener(count)

def run(name):
    with Graph(f"hostile_{name}", input_types=[TensorType(DType.float32, [2, 4], DeviceRef.CPU())]) as g:
        t = ops.tanh(g.inputs[0])
        g.output(t + 1.0 if name == "a" else t * 2.0)
    (out,) = InferenceSession(devices=[CPU()]).load(g).execute(X)
    return out.to_numpy().tolist()

def flips(path, positions, level):
    # Damage one byte at a time in one entry and run again; every run must give the right number.
    pristine = open(path, "rb").read()
    key = pc.ENTRY_HEADER.unpack_from(pristine)[2] if level == "maxfx" else None
    results = []
    for pos, mask in positions:
        damaged = bytearray(pristine)
        damaged[pos] ^= mask
        open(path, "wb").write(bytes(damaged))
        lc.clear_cache()
        if level == "jax":
            import jax
            jax.clear_caches()  # make JAX read its disk level again
        before = lc.compile_stats()["disk_hits"]
        out = run("a")
        try:
            rewritten = key is not None and bool(pc.decode_entry(open(path, "rb").read(), key))
        except pc.DamagedEntryError:
            rewritten = False
        results.append(
            {"pos": pos, "out": out, "disk_hit": lc.compile_stats()["disk_hits"] > before, "rewritten": rewritten}
        )
        open(path, "wb").write(pristine)
    return results

mode = sys.argv[1]
if mode == "run":
    a = run("a")
    files_after_a = sorted(str(p) for p in pc.disk_dir().parent.rglob("*")) if pc.disk_dir() else []
    b = run("b")
    print(json.dumps(
        {"a": a, "b": b, "stats": lc.compile_stats(), "jax_cache": JAX_CACHE, "files_after_a": files_after_a}
    ))
else:
    run("a")  # warm the process: imports, eager ops
    print(json.dumps({"flips": flips(sys.argv[2], json.loads(sys.argv[3]), mode)}))
"""


def _env(cache: Path) -> dict:
    return dict(os.environ, JAX_PLATFORMS="cpu", MAXFX_COMPILATION_CACHE_DIR=str(cache))


def _child(cache: Path, *argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, timeout=300, env=_env(cache), cwd=ROOT
    )
    assert proc.returncode == 0, f"child exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]), stderr=proc.stderr)


def _check_outputs(result: dict) -> None:
    for name in ("a", "b"):
        np.testing.assert_allclose(
            np.array(result[name], np.float32), EXPECTED[name], rtol=1e-6, atol=1e-6, err_msg=f"graph {name}"
        )


def _maxfx_entries(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "maxfx").iterdir() if p.is_file())


def _jax_entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.is_file() and p.name.endswith("-cache"))


@pytest.fixture(scope="module")
def pristine_cache(tmp_path_factory) -> tuple[Path, list[str]]:
    """A cache directory written by one process that compiled graphs a and b, and the files there after a."""
    cache = tmp_path_factory.mktemp("pristine") / "cache"
    result = _child(cache, "run")
    _check_outputs(result)
    assert len(_maxfx_entries(cache)) == 2 and _jax_entries(cache)
    return cache, [str(Path(p).relative_to(cache)) for p in result["files_after_a"]]


@pytest.fixture
def filled_cache(pristine_cache, tmp_path) -> Path:
    """A copy of the pristine cache for one test to damage."""
    return Path(shutil.copytree(pristine_cache[0], tmp_path / "cache"))


class _Marker:
    """Unpickling this creates the file ``path``: the payload an attacker would plant."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_hostile_pickle_in_the_cache_never_runs(filled_cache, tmp_path):
    marker = tmp_path / "pwned"
    hostile = pickle.dumps(_Marker(marker))
    for entry in _maxfx_entries(filled_cache) + _jax_entries(filled_cache):
        entry.write_bytes(hostile)
    result = _child(filled_cache, "run")
    assert not marker.exists(), "a pickle planted in the cache ran"
    _check_outputs(result)
    assert result["stats"]["disk_hits"] == 0, "a planted file was used as an entry"


def test_missing_maxfx_entry_beside_jax_entry_is_rewritten_correctly(filled_cache):
    for entry in _maxfx_entries(filled_cache):
        entry.unlink()
    rebuilt = _child(filled_cache, "run")  # maxfx misses, JAX's level hits
    _check_outputs(rebuilt)
    assert rebuilt["stats"]["disk_hits"] == 0
    later = _child(filled_cache, "run")
    _check_outputs(later)
    assert later["stats"]["disk_hits"] == 2, "the rewritten entries are read by later processes"


def test_foreign_entry_is_a_miss(filled_cache):
    # Each graph's entry renamed to the other's: valid entries, but for another key.
    first, second = _maxfx_entries(filled_cache)
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    result = _child(filled_cache, "run")
    _check_outputs(result)
    assert result["stats"]["disk_hits"] == 0
    assert first.read_bytes() == a and second.read_bytes() == b, (
        "the foreign entries were rewritten with the right ones"
    )


def test_jax_entries_swapped_between_keys_are_rejected_and_rebuilt(filled_cache):
    # JAX's files carry no key; maxfx stores each behind a header naming it, so a swap is a miss, not the other program.
    for entry in _maxfx_entries(filled_cache):
        entry.unlink()  # maxfx's level would be read first: go straight to JAX's
    first, second = [p for p in _jax_entries(filled_cache) if p.name.startswith("jit_call-")]
    a, b = first.read_bytes(), second.read_bytes()
    first.write_bytes(b)
    second.write_bytes(a)
    swapped = _child(filled_cache, "run")
    _check_outputs(swapped)
    for path in (first, second):
        assert f"rejected JAX compile-cache entry {path}" in swapped["stderr"], swapped["stderr"]
    assert first.read_bytes() not in (a, b) and second.read_bytes() not in (a, b), (
        "the swapped entries were not rebuilt"
    )
    later = _child(filled_cache, "run")  # an untouched cache: both levels hit, nothing is compiled or written
    _check_outputs(later)
    assert "rejected" not in later["stderr"], later["stderr"]
    assert later["stats"]["disk_hits"] == 2
    assert later["jax_cache"].get("cache_hits", 0) >= 2 and "cache_misses" not in later["jax_cache"], later["jax_cache"]


def _flip_positions(size: int, count: int, seed: int) -> list[tuple[int, int]]:
    """Byte positions to damage: every header field (magic, version, key, hash, length) and payload samples."""
    header = pc.ENTRY_HEADER.size
    fields = [0, 7, 8, 9, 10, 25, 41, 42, 57, 73, 80, header - 1]
    rng = random.Random(seed)
    payload = sorted(rng.sample(range(header, size), min(count, size - header)))
    return [(p, rng.randrange(1, 256)) for p in fields + payload]


def _check_flips(result: dict, level: str) -> None:
    for flip in result["flips"]:
        np.testing.assert_allclose(
            np.array(flip["out"], np.float32),
            EXPECTED["a"],
            rtol=1e-6,
            atol=1e-6,
            err_msg=f"{level} byte {flip['pos']}",
        )
        if level == "maxfx":
            assert not flip["disk_hit"], f"byte {flip['pos']} flipped and the entry was still used"
            assert flip["rewritten"], f"byte {flip['pos']} flipped: the entry was not rewritten"


def _run_flips(pristine_cache: tuple[Path, list[str]], cache: Path, level: str, count: int, seed: int) -> None:
    """Damage the entry of graph a at ``level`` ("maxfx" or "jax"), one byte at a time, in one child process."""
    shutil.copytree(pristine_cache[0], cache)
    entries = (
        _maxfx_entries(cache)
        if level == "maxfx"
        else [p for p in _jax_entries(cache) if p.name.startswith("jit_call-")]
    )
    (path,) = [p for p in entries if str(p.relative_to(cache)) in pristine_cache[1]]
    positions = _flip_positions(path.stat().st_size, count, seed)
    _check_flips(_child(cache, level, str(path), json.dumps(positions)), level)


def test_flipped_bytes_in_an_entry_are_misses_that_are_rewritten(pristine_cache, tmp_path):
    _run_flips(pristine_cache, tmp_path / "cache", "maxfx", count=24, seed=0)


@pytest.mark.slow
def test_many_flipped_bytes_in_an_entry(pristine_cache, tmp_path):
    _run_flips(pristine_cache, tmp_path / "cache", "maxfx", count=300, seed=1)


@pytest.mark.slow
def test_flipped_bytes_in_jax_entries_give_right_numbers(pristine_cache, tmp_path):
    # maxfx stores JAX's entries behind its header too: a flipped byte fails a header field or the payload hash.
    _run_flips(pristine_cache, tmp_path / "cache", "jax", count=60, seed=2)


def _fill_concurrently(cache: Path, processes: int) -> None:
    """``processes`` children race to fill the empty ``cache``; each gives the right numbers and a later one reads both
    entries.
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, "run"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(cache),
            cwd=ROOT,
        )
        for _ in range(processes)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-4000:]
        _check_outputs(json.loads(out.strip().splitlines()[-1]))
    assert not [p for p in (cache / "maxfx").iterdir() if p.suffix == ".tmp"], "temporary files left behind"
    later = _child(cache, "run")
    _check_outputs(later)
    assert later["stats"]["disk_hits"] == 2


def test_two_processes_filling_one_empty_cache(tmp_path):
    # The default suite's race: two writers of the same entries (the 4-process run is in the slow suite).
    _fill_concurrently(tmp_path / "cache", processes=2)


@pytest.mark.slow
def test_four_processes_filling_one_empty_cache(tmp_path):
    _fill_concurrently(tmp_path / "cache", processes=4)


# ─── a bad cache path disables the cache with one warning ────────────────────


def _bad_paths(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    return {"a regular file": a_file, "below a regular file": a_file / "cache"}


def test_bad_cache_path_in_the_environment_warns_once(tmp_path, monkeypatch):
    enabled = pc.disk_dir()
    for what, path in _bad_paths(tmp_path).items():
        monkeypatch.setenv(pc.CACHE_DIR_ENV, str(path))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pc.enable_from_environment()
        assert len(caught) == 1, (what, [str(w.message) for w in caught])
        message = str(caught[0].message)
        assert str(path) in message and pc.CACHE_DIR_ENV in message and "disabled" in message, message
        assert pc.disk_dir() is enabled, f"{what}: the cache setting changed"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write to a read-only directory")
def test_unwritable_cache_dir_raises_a_typed_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="locked"):
            pc.enable_persistent_cache(locked)
    finally:
        locked.chmod(0o700)


def test_enable_persistent_cache_on_a_file_raises_naming_the_path(tmp_path):
    enabled = pc.disk_dir()
    for path in _bad_paths(tmp_path).values():
        with pytest.raises(OSError, match=str(path)):
            pc.enable_persistent_cache(path)
    assert pc.disk_dir() is enabled


def test_import_with_a_file_as_cache_dir_runs_uncached(tmp_path):
    path = _bad_paths(tmp_path)["a regular file"]
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, "run"], capture_output=True, text=True, timeout=300, env=_env(path), cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    _check_outputs(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert proc.stderr.count(pc.CACHE_DIR_ENV) == 1, proc.stderr


def test_importing_maxfx_leaves_jax_config_alone_until_the_first_compile(tmp_path):
    """The environment's cache is applied before the first compile, not at import (the user's jax.config is theirs)."""
    child = (
        "import jax, maxfx, numpy as np\n"
        "before = jax.config.jax_compilation_cache_dir\n"
        "from maxfx.experimental import functional as F\n"
        "from maxfx.experimental.tensor import Tensor\n"
        "np.asarray(F.exp(Tensor(np.ones(3, np.float32))))\n"
        "print(repr(before), repr(jax.config.jax_compilation_cache_dir))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(tmp_path / "cache"),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    before, after = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert before == "None" and str(tmp_path / "cache") in after, proc.stdout
