"""Progress of a command's runs, on standard error so that standard output carries only the result.

On a terminal it is one bar, redrawn in place. Anywhere else (a CI log, ``2>err``, a pipe) it is a
plain line at the first finished run and then every few seconds -- runs done of the total, the
violations and unknowns so far, the time left at the pace so far -- so a long command is never
silent in a log, and a log is never flooded. It ends with one line saying how long it all took.
``quiet`` silences all of it.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

from killpoint.harness.colour import Colour

INTERVAL_S = 3.0  # between two lines of progress when stderr is not a terminal
BAR_WIDTH = 24


def seconds(s: float) -> str:
    """A duration for people: ``0.8 s``, ``41 s``, ``2 min 05 s``."""
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    return f"{int(s // 60)} min {int(s % 60):02d} s"


class Progress:
    """Counts runs as they finish and tells ``stream`` (default stderr) how far along they are."""

    def __init__(self, total: int | None, *, title: str, quiet: bool = False, stream: TextIO | None = None,
                 interval: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 terminal: bool | None = None, colour: Colour | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.total = total
        self.title = title
        self.quiet = quiet
        self.interval = interval
        self.clock = clock
        self.terminal = _isatty(self.stream) if terminal is None else terminal
        self.colour = Colour.for_stream(self.stream) if colour is None else colour
        self.started_at = clock()
        self.done = 0
        self.violated = 0
        self.unknown = 0
        self._last_line: float | None = None  # when the last plain line was written
        self._drawn = False  # a bar is on the terminal's current line
        self._closed = False

    # -- what the commands call ---------------------------------------------------------------------
    def started(self, label: str = "") -> None:
        """A run is about to start (``label``: its schedule)."""
        if self.terminal:
            self._bar(label)
        elif self._due():
            self._line()

    def finished(self, result: Any, label: str = "") -> None:
        """A run ended; ``result`` is anything with a ``valid`` of True, False or None."""
        self.done += 1
        valid = getattr(result, "valid", True)
        self.violated += valid is False
        self.unknown += valid is None
        if self.terminal:
            self._bar(label)
        elif self.done == 1 or self._due() or self.done == self.total:
            self._line()

    def close(self, note: str = "") -> None:
        """The closing line: how many runs, their verdicts, how long it took (and ``note``)."""
        if self._closed:
            return
        self._closed = True
        if self.quiet:
            return
        if self._drawn:
            self._write("\r\x1b[2K")  # only a terminal has a bar to clear
            self._drawn = False
        valid = self.done - self.violated - self.unknown
        parts = [f"{valid} valid"]
        if self.violated:
            parts.append(self.colour.paint(f"{self.violated} violated", "bold", "red"))
        if self.unknown:
            parts.append(self.colour.paint(f"{self.unknown} unknown", "yellow"))
        runs = "1 run" if self.done == 1 else f"{self.done} runs"
        self._write(f"{self.title}: {runs} in {seconds(self.clock() - self.started_at)} "
                    f"({', '.join(parts)}){'; ' + note if note else ''}\n")

    # -- drawing ----------------------------------------------------------------------------------
    def status(self) -> str:
        """``12/68 runs, 1 violated, ETA 19 s`` (no total: no ETA)."""
        of = f"/{self.total}" if self.total is not None else ""
        text = f"{self.done}{of} runs"
        if self.violated:
            text += ", " + self.colour.paint(f"{self.violated} violated", "bold", "red")
        if self.unknown:
            text += ", " + self.colour.paint(f"{self.unknown} unknown", "yellow")
        elapsed = self.clock() - self.started_at
        text += f", {seconds(elapsed)} elapsed"
        if self.total is not None and 0 < self.done < self.total:
            text += f", ETA {seconds(elapsed / self.done * (self.total - self.done))}"
        return text

    def _due(self) -> bool:
        return self._last_line is None or self.clock() - self._last_line >= self.interval

    def _line(self) -> None:
        self._last_line = self.clock()
        if not self.quiet:
            self._write(f"{self.title}: {self.status()}\n")

    def _bar(self, label: str) -> None:
        if self.quiet:
            return
        total = self.total or 0
        filled = int(BAR_WIDTH * self.done / total) if total else 0
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        self._write(f"\r\x1b[2K[{bar}] {self.status()}  {label[:40]}")
        self._drawn = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # stderr gone (closed pipe): progress is not worth failing for
            self.quiet = True


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


__all__ = ["Progress", "seconds", "INTERVAL_S"]
