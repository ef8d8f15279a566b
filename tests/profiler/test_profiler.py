"""maxfx.profiler: spans are jax.profiler.TraceAnnotations while MODULAR_ENABLE_PROFILING is on, and nothing
otherwise.
"""

import asyncio
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from maxfx.profiler import Tracer, is_profiling_enabled, traced

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """Stands in for jax.profiler.TraceAnnotation: logs ('enter'|'exit', name, metadata / exception type)."""

    events: list = []

    def __init__(self, name, **kwargs):
        self.name, self.kwargs = name, kwargs

    def __enter__(self):
        Recorder.events.append(("enter", self.name, self.kwargs))
        return self

    def __exit__(self, exc_type, exc, tb):
        Recorder.events.append(("exit", self.name, exc_type))


@pytest.fixture
def annotations(monkeypatch):
    Recorder.events = []
    monkeypatch.setattr(jax.profiler, "TraceAnnotation", Recorder)
    return Recorder.events


@pytest.fixture
def enabled(monkeypatch):
    monkeypatch.setenv("MODULAR_ENABLE_PROFILING", "1")


@pytest.fixture
def disabled(monkeypatch):
    monkeypatch.delenv("MODULAR_ENABLE_PROFILING", raising=False)


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("on", True), ("TRUE", True), ("detailed", True), ("0", False), ("off", False), ("", False)],
)
def test_the_environment_variable_is_read_at_each_call(monkeypatch, value, on):
    monkeypatch.setenv("MODULAR_ENABLE_PROFILING", value)
    assert is_profiling_enabled() is on


def test_traced_records_a_span_when_enabled(enabled, annotations):
    @traced
    def prefill(x):
        """Docs."""
        return x + 1

    @traced(message="decode", color="red")
    def step():
        return 2

    assert prefill(1) == 2 and step() == 2
    assert annotations == [
        ("enter", "prefill", {"color": "modular_purple"}),
        ("exit", "prefill", None),
        ("enter", "decode", {"color": "red"}),
        ("exit", "decode", None),
    ]
    assert prefill.__name__ == "prefill" and prefill.__doc__ == "Docs."


def test_traced_async_functions_and_exceptions(enabled, annotations):
    @traced
    async def fetch():
        await asyncio.sleep(0)
        return "done"

    @traced
    def broken():
        raise KeyError("x")

    assert asyncio.run(fetch()) == "done"
    with pytest.raises(KeyError):
        broken()
    assert annotations == [
        ("enter", "fetch", {"color": "modular_purple"}),
        ("exit", "fetch", None),
        ("enter", "broken", {"color": "modular_purple"}),
        ("exit", "broken", KeyError),
    ]


def test_nothing_is_recorded_when_disabled(disabled, annotations):
    @traced
    def f():
        return 1

    assert f() == 1
    with Tracer("a") as tracer:
        tracer.push("b")
        tracer.mark()
        tracer.next("c")
        assert tracer.trace_stack == [None, None]
    assert annotations == []


def test_the_switch_is_read_when_called_not_when_decorated(monkeypatch, annotations):
    monkeypatch.delenv("MODULAR_ENABLE_PROFILING", raising=False)

    @traced
    def f():
        return 1

    f()
    monkeypatch.setenv("MODULAR_ENABLE_PROFILING", "1")
    f()
    assert [e[0] for e in annotations] == ["enter", "exit"]


def test_tracer_nests_spans(enabled, annotations):
    with Tracer("request", color="blue") as tracer:
        tracer.push("prefill")
        tracer.mark()
        tracer.next("decode")
        tracer.push(None)  # an unnamed span is a placeholder
        tracer.pop()
    names = [(kind, name) for kind, name, _ in annotations]
    assert names == [
        ("enter", "request"),
        ("enter", "prefill"),
        ("enter", "prefill:mark"),
        ("exit", "prefill:mark"),
        ("exit", "prefill"),
        ("enter", "decode"),
        ("exit", "decode"),
        ("exit", "request"),
    ]
    assert annotations[0][2] == {"color": "blue"} and tracer.trace_stack == []


def test_tracer_pop_passes_exceptions_and_guards_the_stack(enabled, annotations):
    tracer = Tracer()
    assert tracer.trace_stack == [None]
    tracer.push("work")
    error = ValueError("boom")
    tracer.pop(ValueError, error, None)
    assert annotations[-1] == ("exit", "work", ValueError)
    tracer.cleanup()
    with pytest.raises(IndexError, match="no open span"):
        tracer.pop()
    with pytest.raises(AssertionError, match="stack underflow"):
        tracer.mark()


def test_spans_reach_a_real_jax_trace(enabled, tmp_path):
    @traced(message="maxfx_traced_span")
    def compute():
        return jnp.ones(4).sum()

    with jax.profiler.trace(str(tmp_path)):
        compute().block_until_ready()
        with Tracer("maxfx_tracer_span") as tracer:
            tracer.mark()
    data = b"".join(p.read_bytes() for p in tmp_path.rglob("*.xplane.pb"))
    assert (
        b"maxfx_traced_span" in data
        and b"maxfx_tracer_span" in data
        and b"maxfx_tracer_span:mark" in data
        and b"modular_purple" in data
    )


def test_a_disabled_profiler_does_not_import_jax():
    code = (
        "import os, sys\n"
        "os.environ.pop('MODULAR_ENABLE_PROFILING', None)\n"
        "from maxfx.profiler import Tracer, traced\n"
        "f = traced(lambda: 1)\n"
        "assert f() == 1\n"
        "with Tracer('x') as t:\n"
        "    t.push('y')\n"
        "print('jax' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    )
    assert out.stdout.strip() == "False"
