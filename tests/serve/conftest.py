"""A real ``maxfx serve`` process on 127.0.0.1 for the server tests (one per module scope, killed at the end)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests/data/models/tiny_llama"
CHAT_TEMPLATE = (  # short: the tiny model has 128 positions
    "{% if tools %}tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant: "
    "{% endif %}"
)
START_TIMEOUT_S = 240  # load + warm-up compiles on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m maxfx serve`` as a subprocess; ``url`` once ``/health`` answers."""

    def __init__(self, *flags: str, model: Path = TINY, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [
            sys.executable,
            "-m",
            "maxfx",
            "serve",
            "--model",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
            *flags,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._out = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"maxfx serve exited with {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"maxfx serve did not answer /health within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.5)

    def metric(self, name: str) -> float:
        """The value of one unlabeled metric line (or the sum of a labeled family's samples)."""
        total, found = 0.0, False
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        if not found:
            raise KeyError(name)
        return total

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        return self.proc.returncode


@pytest.fixture(scope="package")
def server(tmp_path_factory):
    """One server for the package: tiny Llama, a chat template, structured output, 16 rows, a queue of 128."""
    tmp = tmp_path_factory.mktemp("serve")
    template = tmp / "chat_template.jinja"
    template.write_text(CHAT_TEMPLATE)
    srv = Server(
        "--max-batch-size",
        "16",
        "--max-queue-size",
        "128",
        "--enable-structured-output",
        "--chat-template",
        str(template),
        "--served-model-name",
        "tiny",
        log=tmp / "server.log",
    )
    yield srv
    srv.stop()
