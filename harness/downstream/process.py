"""The downstream's process: fork a server, restart it on the same ledger and port, kill and reap it."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import select
import signal
import time
import weakref
from typing import Any
from urllib.parse import urlsplit

from killpoint.errors import InfrastructureError
from killpoint.harness.forking import ForkedWorker
from killpoint.harness.downstream.server import START_TIMEOUT, serve
from killpoint.harness.signals import sigint_deferred


def _serve(reader: int, *args: Any) -> None:
    """The server process's body (forked): its copy of the parent's end of the pipe closed, serve."""
    os.close(reader)
    serve(*args)


def _ready(reader: int, proc: ForkedWorker) -> tuple[str, Any]:
    """What the server said as it started (``("ready", port)`` or ``("error", why)``), within
    :data:`START_TIMEOUT`; a server that ended without a word is named with its exit code."""
    data = b""
    deadline = time.monotonic() + START_TIMEOUT
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([reader], [], [], left)[0]:
            raise InfrastructureError("downstream did not start in time")
        chunk = os.read(reader, 4096)
        if not chunk:
            proc.join(1.0)
            raise InfrastructureError(f"downstream failed to start (exit code {proc.exitcode})")
        data += chunk
    kind, value = json.loads(data)
    return kind, value


def _reap(proc: Any, owner: int) -> None:
    """Kill and reap a server process; safe to call twice and at interpreter exit.

    Only the process that started the server may do it: a worker forked from the owner inherits
    the handle (and its exit hooks) and must never take the shared downstream down with it. Once
    reaped, its pid is never signalled again (the number may belong to another process by then).
    """
    if proc is None or proc.pid is None or proc.exitcode is not None or os.getpid() != owner:
        return
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.join()


class DownstreamProcess:
    """A fake downstream server process. Use :func:`start` to make one."""

    def __init__(self, ledger_path: str) -> None:
        self.ledger_path = str(ledger_path)
        # The session's secret: the first segment of every path the server answers, so only
        # what the harness handed the URL to (its own clients, the workers through their
        # context) can read a run's ledger or post effects into it. Kept across a restart.
        self._secret = secrets.token_urlsafe(24)
        self.pid: int | None = None
        self.url: str = ""
        self.address: str = ""
        self._proc: Any = None
        self._finalizer: weakref.finalize | None = None
        self._launch()

    def _launch(self, port: int = 0) -> None:
        reader, writer = os.pipe()
        proc = ForkedWorker(_serve, (reader, self.ledger_path, writer, os.getpid(), self._secret, port),
                            name="killpoint-downstream")
        with sigint_deferred():
            try:
                proc.start()
            except OSError as e:
                os.close(reader)
                os.close(writer)
                raise InfrastructureError(f"cannot start the downstream: {type(e).__name__}: {e}") from e
        os.close(writer)
        # Until its finalizer holds it, a timeout or a Ctrl-C here must not let it outlive us.
        try:
            kind, value = _ready(reader, proc)
            if kind != "ready":
                raise InfrastructureError(f"downstream failed to start: {value}")
            self._proc = proc
            self.pid = proc.pid
            self.url = f"http://127.0.0.1:{value}/{self._secret}"
            # Where it listens, without the session's secret: what may be written down (histories,
            # reports, narration); the secret only ever travels to the processes of the session.
            self.address = f"127.0.0.1:{value}"
            # Kill the server if this handle is dropped or the interpreter exits without stop().
            self._finalizer = weakref.finalize(self, _reap, proc, os.getpid())
            self._finalizer.atexit = False
            atexit.register(self._finalizer)
        except BaseException:
            _reap(proc, os.getpid())
            raise
        finally:
            os.close(reader)

    def stop(self) -> None:
        """SIGKILL the server by PID and reap it. Idempotent."""
        if self._finalizer is not None:
            atexit.unregister(self._finalizer)
            self._finalizer()  # runs _reap once, then detaches
            self._finalizer = None
        self._proc = None

    def restart(self) -> None:
        """Kill the server and start a fresh process on the same ledger file and the same port.

        The URL stays the same, so workers that hold it (and their keep-alive connections, which
        notice the old server is gone) reconnect to the new process, as to a restarted service.
        """
        port = (urlsplit(self.url).port or 0) if self.url else 0
        self.stop()
        self._launch(port)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def __enter__(self) -> DownstreamProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"DownstreamProcess(pid={self.pid}, url={self.url.rsplit('/', 1)[0] + '/***'!r}, "
                f"ledger_path={self.ledger_path!r})")


def start(ledger_path: str) -> DownstreamProcess:
    """Fork a downstream server on ``ledger_path`` and return once it is listening."""
    return DownstreamProcess(ledger_path)
