"""``python -m maxfx``: the maxfx command line (see `maxfx._cli`)."""

import sys

from maxfx._cli import main

if __name__ == "__main__":
    sys.exit(main())
