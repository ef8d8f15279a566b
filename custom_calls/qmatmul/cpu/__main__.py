"""The install step (``make venv``): ``python -m custom_calls.qmatmul.cpu`` builds the CPU kernels."""

import sys

from custom_calls.qmatmul.cpu import build

try:
    print(f"built {build()}")
except RuntimeError as e:  # not fatal: maxfx then uses the jnp reference on CPU
    print(f"warning: CPU quantized kernels not built: {e}", file=sys.stderr)
