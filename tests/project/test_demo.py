"""`make demo` (python -m maxfx.demo) runs end to end and shows what it claims."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_and_trains():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MAXFX_DEFAULT_DEVICE": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "maxfx.demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    # The developer guide's eager example, in its exact printed format.
    assert "TensorType(dtype=float32, shape=[Dim(5)], device=cpu:0): [1.0, 0.0, 3.0, 0.0, 5.0]" in out
    assert "[1. 0. 3. 0. 5.]" in out
    # Training lowers the loss well below its start (ln 22 ≈ 3.1 for the demo's 22 characters).
    losses = [float(line.split("loss")[1]) for line in out if line.startswith("step ")]
    assert len(losses) >= 3 and losses[0] > 3.0 and losses[-1] < 0.5, losses
    assert any(line.startswith("greedy: prefill") and "tok/s" in line for line in out)
