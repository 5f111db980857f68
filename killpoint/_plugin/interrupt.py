"""The pytest session under SIGTERM and SIGHUP: it ends as the command line does.

A CI job's timeout or cancel sends SIGTERM (and a closed terminal SIGHUP) to pytest; Python's
default for both ends the process on the spot, with no summary and, under pytest-xdist, with the
workers' runs left to end on their own. From ``pytest_configure`` on, each signal raises as Ctrl-C
does (:class:`~killpoint.harness.signals.Terminated`, a KeyboardInterrupt), so pytest ends the test
in hand, its run (workers killed by PID, PostgreSQL schema dropped) and the session, prints its
summary and exits interrupted (2). The signal is also *remembered* (:func:`signals.check`, at the
top of every run and of every turn of its loop, raises again for one whose exception was swallowed
where it landed), and the xdist controller passes it on to its workers, which end their runs the
same way. A handler someone else installed is left alone; the main thread only.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

__all__ = ["finishing", "guard_startup", "install", "received_line", "received_while_finishing", "started",
           "uninstall", "worker_started"]

_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_NAMES: dict[int, str] = {signal.SIGTERM: "terminated (SIGTERM)", signal.SIGHUP: "hung up (SIGHUP)",
                          signal.SIGINT: "interrupted"}
_installed: dict[int, Any] = {}
_workers: set[int] = set()  # the controller's xdist workers, by PID
_finishing: list[bool] = []  # set once the tests are over: a signal then is remembered, not raised


def _handler(signum: int, frame: Any) -> None:
    from killpoint.harness import signals

    signals._received.append(signum)  # remembered: raised again at the next check if swallowed
    for pid in list(_workers):  # each ends its run as this process does
        try:
            os.kill(pid, signum)
        except OSError:
            _workers.discard(pid)
    if _finishing:  # no test or run left to end: raised now it would only break pytest's own teardown
        return
    raise signals.Terminated(signum)


def _startup_handler(signum: int, frame: Any) -> None:
    """Ctrl-C while pytest is still starting (loading plugins and the first conftest files), where
    pytest itself catches nothing and prints a KeyboardInterrupt traceback: one line and pytest's
    interrupted code instead (nothing of a session has started, so nothing is left to end)."""
    import sys

    started()
    try:
        sys.stderr.write("killpoint: interrupted while pytest was starting; no test ran\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # a closed stderr (the reader is gone): the exit code still says it
    raise SystemExit(2)  # pytest.ExitCode.INTERRUPTED, without importing pytest in a handler


def guard_startup() -> None:
    """From the plugin's import until ``pytest_configure``: Ctrl-C ends pytest quietly (see
    :func:`_startup_handler`). Only where Python's own handler is in place, in the main thread."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _startup_handler)


def started() -> None:
    """pytest has started (``pytest_configure``): from here it catches Ctrl-C itself. Python's own
    handler back, where ours is still the one installed."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is _startup_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def finishing() -> None:
    """The tests are over (``pytest_sessionfinish``): a signal from now on is passed on and remembered,
    and ends the session as interrupted once pytest's own teardown (xdist's, of its workers) is done."""
    _finishing.append(True)


def received_while_finishing() -> bool:
    from killpoint.harness import signals

    return bool(_finishing) and signals.received() is not None


def _int_handler(signum: int, frame: Any) -> None:
    """Ctrl-C as Python has it (a KeyboardInterrupt), passed on to the xdist workers first: a SIGINT
    sent to the controller alone (a CI runner's cancel) otherwise reached none of them, and the
    session waited on xdist's teardown for their runs."""
    for pid in list(_workers):
        try:
            os.kill(pid, signum)
        except OSError:
            _workers.discard(pid)
    if _finishing:  # in pytest's own teardown: remembered, the session ends interrupted
        from killpoint.harness import signals

        signals._received.append(signum)
        return
    raise KeyboardInterrupt


def install() -> None:
    """From now on, SIGTERM and SIGHUP end the session as Ctrl-C does (see the module), and Ctrl-C
    reaches the xdist workers too."""
    if threading.current_thread() is not threading.main_thread():
        return
    from killpoint.harness import signals

    signals._received.clear()
    for sig in _SIGNALS:
        if sig not in _installed and signal.getsignal(sig) == signal.SIG_DFL:
            _installed[sig] = signal.signal(sig, _handler)
    if signal.SIGINT not in _installed and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _installed[signal.SIGINT] = signal.signal(signal.SIGINT, _int_handler)


def uninstall() -> None:
    for sig, previous in list(_installed.items()):
        if signal.getsignal(sig) in (_handler, _int_handler):
            signal.signal(sig, previous)
        del _installed[sig]
    _workers.clear()
    _finishing.clear()


def worker_started(pid: Any) -> None:
    """On the xdist controller: a worker's PID, to pass a signal on to."""
    if isinstance(pid, int) and pid > 0 and pid != os.getpid():
        _workers.add(pid)


def received_line() -> str | None:
    """The summary's line for a session a signal ended, or None."""
    from killpoint.harness import signals

    signum = signals.received()
    if signum is None or not _installed:
        return None
    return f"killpoint: {_NAMES.get(signum, 'interrupted')}; every process it started has been ended"
