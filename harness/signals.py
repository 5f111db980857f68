"""Ctrl-C and SIGTERM: never lost, and always the same clean end.

CPython runs its at-fork hooks (logging's lock release, among others) in the parent right after
``fork``; a KeyboardInterrupt raised inside one is printed and ignored, and so is one raised inside
a finalizer or ``__del__`` (a garbage-collected connection, a reaped process handle). A signal that
lands there is lost, and an interrupted matrix runs to its end and exits 0. So the signals are held
blocked across a fork (:func:`sigint_deferred`), and the command line's handlers also *remember*
each signal: :func:`check` raises again for one whose exception was swallowed, and the command
ends 130 (SIGINT) or 143 (SIGTERM) whatever happened to the exception.

SIGTERM raises :class:`Terminated`, a KeyboardInterrupt, so it takes every cleanup path Ctrl-C
takes: workers killed by PID, the run's schema dropped, the session's folder removed.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

# SIGHUP too: a closed terminal or SSH session must not leave a run's schema or folder behind.
SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP: ``signum``), raised as Ctrl-C is so that the same cleanup runs."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__()
        self.signum = signum


# Invariant: the signals this process received since install_handlers(), in order (only the
# command line installs the handlers; signal dispositions are process-wide by nature).
_received: list[int] = []


def _raise_for(signum: int) -> None:
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _handler(signum: int, frame: Any) -> None:
    _received.append(signum)
    _raise_for(signum)


def install_handlers() -> None:
    """SIGINT, SIGTERM and SIGHUP raise (KeyboardInterrupt, :class:`Terminated`) and are remembered.

    A signal the command was started ignoring stays ignored: ``nohup killpoint ...`` ignores SIGHUP,
    and a shell without job control starts a background command (``killpoint ... &``) ignoring
    SIGINT; that was its caller's choice (Python keeps an ignored SIGINT ignored too)."""
    _received.clear()
    for sig in SIGNALS:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, _handler)


def _remember(signum: int, frame: Any) -> None:
    _received.append(signum)


def remember_only(*sigs: int) -> None:
    """For a ``--jobs`` runner: ``sigs`` are remembered, never raised where they land, so that a run
    in hand ends at the next safe point -- :func:`check`, at the top of a run and of every turn of
    its supervising loop -- and takes the interrupted run's own cleanup whole (an exception raised
    by the handler could land inside that cleanup and cut its schema's drop short)."""
    _received.clear()
    for sig in sigs:
        signal.signal(sig, _remember)


def received() -> int | None:
    """The first signal received since :func:`install_handlers`, if any."""
    return _received[0] if _received else None


def check() -> None:
    """Raise for a signal received earlier, in case its exception was swallowed where it landed."""
    if _received:
        _raise_for(_received[0])


# Invariant: one list per open sigint_deferred() block of the main thread, innermost last: the
# signals its handlers recorded instead of acting on them.
_held: list[list[int]] = []


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP until the block ends, then act on the first one held as its
    handler would have: around a fork (until the child is registered, so that whoever ends the
    processes knows it), and around cleanups that must not stop halfway.

    Blocking the signals in this thread is not enough: the kernel hands a process's signal to any
    thread that does not block it (a proxy's, a library's), and Python then runs its handler in the
    main thread all the same. So in the main thread the handlers themselves are swapped, for the
    block's length, for ones that only record the signal."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    import threading

    handlers: dict[int, Any] = {}
    held: list[int] = []
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            handler = signal.getsignal(sig)
            if callable(handler):
                handlers[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
        _held.append(held)
    try:
        yield
    finally:
        if handlers:
            _held.pop()
            for held_sig, handler in handlers.items():
                signal.signal(held_sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if held:  # as its handler would have, now that the block is done
            handlers[held[0]](held[0], None)


def drop_repeats() -> None:
    """Inside :func:`sigint_deferred`, once the processes are ended: discard a signal held meanwhile
    if one was received before it (a repeat of a signal the command is already ending for). Let
    through, it would be raised where the block ends -- in a generator's cleanup, where Python
    prints it as "Exception ignored" -- and tell nothing new."""
    if not _received:
        return
    if _held:
        _held[-1].clear()
    for sig in signal.sigpending() & SIGNALS:
        signal.sigtimedwait([sig], 0)


def unblock_sigint() -> None:
    """For a forked child: it inherits the blocked mask, which must not outlive the fork. The
    harness decides when its children end, so they ignore both signals (their parent's death
    ends them: PR_SET_PDEATHSIG)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
