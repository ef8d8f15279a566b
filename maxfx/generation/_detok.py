"""Text of a generation as it grows: incremental detokenization and stop strings.

`IncrementalText` decodes a request's new token ids piece by piece. It keeps a
window of ids ``[prefix, read)`` already shown and decodes the window with and
without the new ids, showing the difference, unless the text ends in U+FFFD (a
multi-byte character still incomplete), which waits for the next token. Decoding
a window (not the whole sequence) keeps a step's cost flat, and tokenizers whose
decoder treats a sequence's first token specially (SentencePiece's leading
space) see the same first token in both decodes.

With stop strings it also holds back text that could be the start of one, so a
stream never shows part of a stop string; when one appears the text ends just
before it (`stopped` is then True).

Example:
    >>> class Bytes:
    ...     def decode(self, ids, skip_special_tokens=True):
    ...         return bytes(ids).decode("utf-8", errors="replace")
    >>> t = IncrementalText(Bytes(), stop=["!!"])
    >>> t.add([104, 105]), t.add([33]), t.add([33, 120])  # "hi", then "!" held, then "!" completes the stop
    ('hi', '', '')
    >>> t.stopped, t.text
    (True, 'hi')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["IncrementalText"]


class IncrementalText:
    """Incremental decoding of one request's generated ids (see the module docstring)."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] | None = None, skip_ids: Sequence[int] = ()):
        self._tok = tokenizer
        self._stop = [s for s in (stop or ()) if s]
        self._skip = set(int(i) for i in skip_ids)
        self._ids: list[int] = []
        self._prefix = self._read = 0
        self._decoded = ""  # everything decoded so far
        self._shown = 0  # characters of _decoded handed out
        self.stopped = False
        self.stop_string: str | None = None

    @property
    def text(self) -> str:
        """The text handed out so far."""
        return self._decoded[: self._shown]

    def add(self, ids: Sequence[int], final: bool = False) -> str:
        """Take new ids; returns the new text to show ('' when nothing is ready)."""
        if self.stopped:
            return ""
        self._ids.extend(int(i) for i in ids if int(i) not in self._skip)
        self._decoded += self._piece(final)
        if self._stop:
            earliest = None
            for s in self._stop:
                at = self._decoded.find(s, max(0, self._shown - len(s) + 1))
                if at >= 0 and (earliest is None or at < earliest[0]):
                    earliest = (at, s)
            if earliest is not None:
                self.stopped, self.stop_string = True, earliest[1]
                return self._show(earliest[0])
            if not final:
                return self._show(len(self._decoded) - self._held_back())
        return self._show(len(self._decoded))

    def finish(self) -> str:
        """The text left when the request ends (held-back text and incomplete characters)."""
        return self.add((), final=True)

    def _show(self, upto: int) -> str:
        upto = max(upto, self._shown)
        piece = self._decoded[self._shown : upto]
        self._shown = upto
        return piece

    def _held_back(self) -> int:
        """Length of the longest end of the text that a stop string starts with."""
        text = self._decoded
        best = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(text) - self._shown), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def _piece(self, final: bool) -> str:
        ids, prefix, read = self._ids, self._prefix, self._read
        if len(ids) == read:
            return ""
        before = self._tok.decode(ids[prefix:read], skip_special_tokens=True)
        after = self._tok.decode(ids[prefix:], skip_special_tokens=True)
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return ""
        self._prefix, self._read = read, len(ids)
        return after[len(before) :]
