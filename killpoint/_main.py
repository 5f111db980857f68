"""The ``killpoint`` console script's entry: the command line, with a Ctrl-C that lands while Python
is still importing it (about a fifth of a second) ending the command as one that lands later does --
one line and exit 130 -- instead of a ``KeyboardInterrupt`` traceback. Nothing has started then, so
there is nothing to end. This module imports nothing of killpoint's own until it is called."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from killpoint.harness.cli import main as command_line
    except KeyboardInterrupt:
        print("killpoint: interrupted while starting; nothing was run", file=sys.stderr)
        return 130
    return command_line()


__all__ = ["main"]
