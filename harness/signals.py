"""Forking without losing Ctrl-C.

CPython runs its at-fork hooks (logging's lock release, among others) in the parent right after
``fork``; a KeyboardInterrupt raised inside one is printed and ignored, so a Ctrl-C that lands
there is lost and an interrupted matrix runs to its end. Holding SIGINT blocked across the fork
delivers it just after, where it raises as usual.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def unblock_sigint() -> None:
    """For a forked child: it inherits the blocked mask, which must not outlive the fork."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
