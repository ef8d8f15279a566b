"""The install step (``make venv``): ``python -m custom_calls.cpu`` builds the CPU kernels."""

import sys

from custom_calls.cpu import build

try:
    print(f"built {build()}")
except RuntimeError as e:  # not fatal: maxfx then uses the jnp references on CPU
    print(f"warning: CPU kernels not built: {e}", file=sys.stderr)
