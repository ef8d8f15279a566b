"""`read_json_file`: a JSON file (``config.json`` and its siblings) read strictly, with one error type.

Kept free of heavy imports: the pipelines package reads configs without loading JAX.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_json_file"]


def read_json_file(path: os.PathLike[str] | str, error: type[ValueError] = ValueError) -> Any:
    """The JSON value in ``path``, read as UTF-8.

    Raises:
        OSError: the file cannot be read.
        error: not UTF-8, not valid JSON, or nested too deeply; the message names the file.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        # json's decoder recurses once per nesting level: a hostile file would escape as a bare RecursionError.
        raise error(
            f"{path}: JSON nested too deeply (more levels than Python's recursion limit); not a valid config file"
        ) from None
