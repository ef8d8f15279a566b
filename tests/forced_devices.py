"""Run a test file as a child process that sees ``n`` forced host CPU devices.

JAX fixes its device count when it starts, so multi-device tests run their
checks in a fresh interpreter with ``XLA_FLAGS=--xla_force_host_platform_device_count``;
the child prints one JSON line (its last line of stdout) that the tests read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run_with_forced_devices(script: str, n_devices: int, timeout: float) -> Any:
    """Run ``script`` (a path) with ``n_devices`` CPU devices; return the JSON of its last stdout line."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={n_devices}"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, os.path.abspath(script)], capture_output=True, text=True, timeout=timeout, env=env, cwd=root
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
