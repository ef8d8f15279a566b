"""Pickle opcodes written by hand (protocol 2, as ``torch.save`` writes), for building hostile ``.bin`` files without
torch.
"""

import struct


def p_str(s: str) -> bytes:
    """BINUNICODE: push ``s``."""
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def p_int(i: int) -> bytes:
    """BININT: push a 32-bit int."""
    return b"J" + struct.pack("<i", i)


def p_ints(seq) -> bytes:
    """MARK, the ints, TUPLE: push a tuple of ints."""
    return b"(" + b"".join(p_int(i) for i in seq) + b"t"
