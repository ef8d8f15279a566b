"""``maxfx.functional``: the same module object as ``maxfx.experimental.functional`` (MAX's ``max.functional``
alias).
"""

import sys

from maxfx.experimental import functional as _module

sys.modules[__name__] = _module
