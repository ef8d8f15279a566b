"""``python -m maxfx.launch --nproc N [--devices-per-process K] [--timeout S] script.py args...``: a local multi-process
JAX job.

Starts N processes on 127.0.0.1 with a free coordinator port; each calls
``maxfx.distributed.initialize()`` to join. See `maxfx.distributed.launch`.

Example:
    ``python -m maxfx.launch --nproc 2 --devices-per-process 4 --timeout 120 train.py --steps 20``
"""

from __future__ import annotations

import sys

from maxfx.distributed._launch import main

if __name__ == "__main__":
    sys.exit(main())
