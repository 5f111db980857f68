"""When the command line colours its output, and the few colours it uses.

The policy of the ``NO_COLOR`` and ``FORCE_COLOR`` conventions, decided per stream: ``NO_COLOR``
set to anything but the empty string turns colour off; else ``FORCE_COLOR`` set (and not ``0``)
turns it on, for CI logs that render ANSI codes; else a stream gets colour when it is a terminal
that is not ``TERM=dumb``. A file or a pipe never gets escape codes unless forced.
"""

from __future__ import annotations

import os
from typing import Mapping, TextIO

_CODES = {"red": "31", "green": "32", "yellow": "33", "blue": "34", "bold": "1", "dim": "2"}
# The colour of each verdict word, as the reports draw them.
VERDICT_COLOURS = {"valid": "green", "ok": "green", "violated": "red", "invalid": "red",
                   "unknown": "yellow"}


def wanted(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether text written to ``stream`` should carry colour."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR", ""):
        return False
    force = env.get("FORCE_COLOR")
    if force is not None and force not in ("", "0"):
        return True
    if env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


class Colour:
    """Paints text for one stream, or leaves it as is when that stream gets no colour."""

    def __init__(self, on: bool) -> None:
        self.on = on

    @classmethod
    def for_stream(cls, stream: TextIO, environ: Mapping[str, str] | None = None) -> "Colour":
        return cls(wanted(stream, environ))

    def paint(self, text: str, *styles: str) -> str:
        if not self.on or not styles:
            return text
        return f"\x1b[{';'.join(_CODES[s] for s in styles)}m{text}\x1b[0m"

    def verdict(self, word: str) -> str:
        """A verdict word (valid, VIOLATED, unknown ...) in its colour, bold."""
        colour = VERDICT_COLOURS.get(word.lower())
        return self.paint(word, "bold", colour) if colour else word


__all__ = ["Colour", "wanted", "VERDICT_COLOURS"]
