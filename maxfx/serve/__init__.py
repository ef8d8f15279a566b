"""``maxfx serve``: an OpenAI-compatible HTTP server on maxfx's continuous-batching engine.

- `ServeConfig`: the server's settings (one per ``maxfx serve`` flag).
- `ServedModel`: the model, its tokenizer and the engine's scheduler (on its own thread).
- `create_app`: the FastAPI application (OpenAI's routes, ``/metrics``, ``/health``).
- `serve`: load, warm up and run uvicorn until shut down.

Start it with ``maxfx serve --model PATH`` (or ``python -m maxfx serve``) and
drive it with any OpenAI client; see ``docs/pages/serve.md``.

Example:
    >>> from maxfx.serve import ServeConfig, serve
    >>> serve(ServeConfig(model="tests/data/models/tiny_llama", port=8000))  # doctest: +SKIP
"""

from maxfx.serve._app import create_app
from maxfx.serve._errors import APIError
from maxfx.serve._model import ServeConfig, ServedModel
from maxfx.serve._server import serve

__all__ = ["APIError", "ServeConfig", "ServedModel", "create_app", "serve"]
