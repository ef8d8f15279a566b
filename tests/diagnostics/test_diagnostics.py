"""maxfx.diagnostics.gpu: NVML stats through pynvml when there is one, {} without; the background recorder."""

import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from maxfx.diagnostics import gpu
from maxfx.diagnostics.gpu import BackgroundRecorder, GPUDiagContext, GPUStats, MemoryStats, UtilizationStats

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def fake_pynvml(count=2, v2=True):
    """A stand-in for the nvidia-ml-py module: ``count`` GPUs, GPU i using i GiB of 80, i*10% busy."""
    nvml = types.ModuleType("pynvml")
    nvml.calls = []

    class NVMLError(Exception):
        pass

    def memory_info(handle, version=None):
        if version is not None and not v2:
            raise TypeError("no version argument")
        used = handle * GIB
        info = types.SimpleNamespace(total=80 * GIB, free=80 * GIB - used, used=used)
        if version is not None:
            info.reserved = 512
        return info

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = lambda: nvml.calls.append("init")
    nvml.nvmlShutdown = lambda: nvml.calls.append("shutdown")
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetMemoryInfo = memory_info
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=10 * h, memory=5 * h)
    if v2:
        nvml.nvmlMemory_v2 = 2
    return nvml


@pytest.fixture
def no_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def test_without_pynvml_stats_are_empty(no_pynvml):
    with GPUDiagContext() as ctx:
        assert ctx.get_stats() == {}
    assert [(vendor, isinstance(err, ImportError)) for vendor, err in ctx.errors] == [("nv", True)]
    assert GPUDiagContext().get_stats() == {}  # not entered: nothing is open


def test_nvml_stats_per_gpu(monkeypatch):
    nvml = fake_pynvml(count=2)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with GPUDiagContext() as ctx:
        stats = ctx.get_stats()
    assert stats == {
        "nv0": GPUStats(MemoryStats(80 * GIB, 80 * GIB, 0, 512), UtilizationStats(0, 0)),
        "nv1": GPUStats(MemoryStats(80 * GIB, 79 * GIB, GIB, 512), UtilizationStats(10, 5)),
    }
    assert stats["nv1"].memory.used_bytes == GIB and stats["nv1"].utilization.gpu_usage_percent == 10
    assert nvml.calls == ["init", "shutdown"] and ctx.get_stats() == {}


def test_nvml_without_the_v2_memory_query(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1, v2=False))
    with GPUDiagContext() as ctx:
        assert ctx.get_stats()["nv0"].memory.reserved_bytes is None


def test_a_context_is_entered_once_at_a_time(no_pynvml):
    ctx = GPUDiagContext()
    with ctx, pytest.raises(RuntimeError, match="already entered"):
        ctx.__enter__()


def test_background_recorder_samples_until_exit(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1))
    recorder = BackgroundRecorder(interval=0.01)
    with recorder:
        with pytest.raises(RuntimeError, match="has not finished yet"):
            recorder.stats
        time.sleep(0.1)
    assert len(recorder.stats) >= 3 and all(set(s) == {"nv0"} for s in recorder.stats)
    assert isinstance(recorder.stats[0]["nv0"], GPUStats)
    with pytest.raises(RuntimeError, match="already used once"):
        recorder.__enter__()


def test_background_recorder_without_a_gpu(no_pynvml):
    with BackgroundRecorder(interval=0.01) as recorder:
        time.sleep(0.03)
    assert recorder.stats and all(s == {} for s in recorder.stats)


def test_background_recorder_keeps_its_samples_through_an_exception(no_pynvml):
    recorder = BackgroundRecorder(interval=0.01)
    with pytest.raises(KeyError), recorder:
        raise KeyError("x")
    assert len(recorder.stats) >= 2


def test_background_recorder_interval_must_be_non_negative():
    with pytest.raises(ValueError, match="interval must be a number of seconds >= 0"):
        BackgroundRecorder(interval=-1)
    assert BackgroundRecorder()._interval == 1.0  # MAX's once a second


def test_the_module_imports_without_pynvml():
    code = (
        "import sys\nsys.modules['pynvml'] = None\n"
        "from maxfx.diagnostics.gpu import GPUDiagContext\nprint(GPUDiagContext().get_stats())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    )
    assert out.stdout.strip() == "{}"
    assert gpu.__all__ == ["BackgroundRecorder", "GPUDiagContext", "GPUStats", "MemoryStats", "UtilizationStats"]
