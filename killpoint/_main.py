"""The ``killpoint`` console script's entry: the command line, with a signal that lands while Python
is still importing it (about a fifth of a second) ending the command as one that lands later does --
one line and exit 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP -- instead of a
``KeyboardInterrupt`` traceback or a death by the signal's default. Nothing has started then, so
there is nothing to end. This module imports nothing of killpoint's own until it is called."""

from __future__ import annotations

import signal
import sys
from typing import Any

_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}
_got: list[int] = []


def _starting(signum: int, frame: Any) -> None:
    _got.append(signum)
    raise KeyboardInterrupt


def main() -> int:
    _got.clear()
    # until the command line's own; a signal the command was started ignoring (nohup, a background
    # command of a shell without job control) stays ignored
    previous = {sig: signal.signal(sig, _starting) for sig in _CODES if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        from killpoint.harness.cli import main as command_line

        return command_line()
    except KeyboardInterrupt:  # before the command line's handlers: nothing was started
        print("killpoint: interrupted while starting; nothing was run", file=sys.stderr)
        return _CODES.get(signal.Signals(_got[0]) if _got else signal.SIGINT, 130)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = ["main"]
