"""`serve`: load a model and run ``maxfx serve``'s HTTP server (uvicorn) until SIGINT/SIGTERM.

The model loads and its engine warms up *before* the port opens, so a client
that sees ``/health`` answer is served without a compile. On SIGINT/SIGTERM
uvicorn stops accepting connections and lets the running requests finish (up
to ``graceful_s``); then the engine thread stops.

Example:
    >>> serve(ServeConfig(model="tests/data/models/tiny_llama", port=8000))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import sys

import uvicorn
from prometheus_client import start_http_server

from maxfx.serve._app import create_app
from maxfx.serve._metrics import Metrics
from maxfx.serve._model import ServeConfig, ServedModel

__all__ = ["serve"]

log = logging.getLogger("maxfx.serve")


def serve(config: ServeConfig, *, graceful_s: float = 30.0, log_level: str = "info") -> None:
    """Serve ``config.model`` on ``config.host:config.port`` (blocks until shut down)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    served = ServedModel(config)
    metrics = Metrics(served.name, served.scheduler)
    app = create_app(served, metrics)
    if config.metrics_port is not None:
        start_http_server(int(config.metrics_port), addr=config.host, registry=metrics.registry)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=int(config.port),
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=graceful_s,
        )
    )
    log.info(
        "maxfx serve: %s on http://%s:%d/v1 (load %.1f s, warm-up %.1f s)",
        served.name,
        config.host,
        config.port,
        served.load_s,
        served.warmup_s,
    )
    try:
        server.run()  # on SIGTERM uvicorn drains, runs the app's shutdown (the engine stops), then re-raises the signal
    finally:
        served.close(finish_running=False)
